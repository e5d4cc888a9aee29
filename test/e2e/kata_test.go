package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// kataConfiguration is a Kata configuration.toml as Kata ships it, cut to
// the keys the driver reads (launcher/kata/katacfg) and set as the README
// asks: sandbox_cgroup_only, the sizing annotations allowed.
const kataConfiguration = `# Kata Containers configuration (test stand-in: the runc shim runs the sandbox)
[hypervisor.qemu]
path = "/usr/bin/qemu-system-x86_64"
kernel = "/usr/share/kata-containers/vmlinux.container"
image = "/usr/share/kata-containers/kata-containers.img"
machine_type = "q35"
enable_annotations = ["default_vcpus", "default_memory"]
default_vcpus = 1
default_maxvcpus = 0
default_memory = 2048
shared_fs = "virtio-fs"
virtio_fs_daemon = "/usr/libexec/virtiofsd"

[agent.kata]
dial_timeout = 45

[runtime]
internetworking_model = "tcfilter"
sandbox_cgroup_only = true
static_sandbox_resource_mgmt = true
enable_pprof = false
`

// TestE2EKata runs real steps with runtime = "kata" through the shim task
// API, on both paths: the daemonless one (the launcher starts the shim)
// and through a containerd daemon the test starts. Kata itself cannot run
// here (no Kata packages; nested PVM boots no stock kernel under KVM):
// containerd's runc shim stands in for containerd-shim-kata-v2 over the
// identical API, so what is proven is the driver's path (bundle, spec,
// shim, task API, broker, teardown), not Kata's VM. Each step must run in
// the shim's sandbox (its init, the agent in pause mode, is PID 1) and
// leave nothing: no state, shim, runc state, socket or mount.
func TestE2EKata(t *testing.T) {
	fixture.Require(t, "containerd-shim-runc-v2", "runc", "containerd")
	// Without ConstrainDevices: runc, the stand-in, adds wildcard mknod
	// rules (c *:* m, b *:* m) to every container's devices cgroup, which
	// a devices cgroup Slurm constrained refuses beneath it (EPERM); Kata
	// writes the VMM's few devices only.
	e := harness.Setup(t, "CONSTRAIN_DEVICES=no")
	img := "--microvm=" + e.Image
	kataConf := filepath.Join(harness.Root, "kata-configuration.toml")
	if err := os.WriteFile(kataConf, []byte(kataConfiguration), 0o644); err != nil {
		t.Fatal(err)
	}
	ro := filepath.Join(harness.DataDir, "kata-ro")
	if err := os.MkdirAll(ro, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(ro) })
	if err := os.WriteFile(filepath.Join(ro, "in"), []byte("KATA-RO-CONTENT\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctrd := fixture.StartContainerd(t)
	modes := []struct{ name, tables string }{
		{"shim", fmt.Sprintf("[kata]\nallow_root_virtiofsd = true\nmode = \"shim\"\nshim = \"/usr/bin/containerd-shim-runc-v2\"\nconfiguration = %q\nnamespace = \"smv-e2e\"\n", kataConf)},
		{"containerd", fmt.Sprintf("[kata]\nallow_root_virtiofsd = true\nmode = \"containerd\"\ncontainerd_address = %q\nruntime_handler = \"io.containerd.runc.v2\"\nconfiguration = %q\nnamespace = %q\n", ctrd.Address, kataConf, ctrd.Namespace)},
	}
	t.Cleanup(func() {
		_ = e.WriteConfig("", "")
		// runc's root of the namespace (runc makes it, never removes it).
		_ = os.Remove("/run/containerd/runc/smv-e2e")
	})
	for _, m := range modes {
		if err := e.WriteConfig(`runtime = "kata"`, m.tables); err != nil {
			t.Fatal(err)
		}
		if b, err := exec.Command(e.Launcher, "--config", e.Config, "config", "check").CombinedOutput(); err != nil {
			t.Fatalf("%s: config check: %v\n%s", m.name, err, b)
		}
		e.Run(t, m.name+": two tasks in the shim's sandbox", func(t *testing.T) {
			out, errOut, code := e.Srun(t, cluster.TestUser, "-n2", img, "sh", "-c", `echo JOB=$SLURM_JOB_ID; echo RANK $SLURM_PROCID $(tr '\0' ' ' </proc/1/cmdline) $(id -u) $IMAGE_VAR`)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			want := fmt.Sprintf("/.slurm-microvm/init pause %d from-image", e.TestUID)
			for _, r := range []string{"0", "1"} {
				if !strings.Contains(out, "RANK "+r+" "+want) {
					t.Errorf("stdout %q lacks rank %s with %q (init of the sandbox as PID 1, the job's uid, the image's env)", out, r, want)
				}
			}
			e.WaitClean(t, jobOf(t, out))
		})
		e.Run(t, m.name+": read-only mount", func(t *testing.T) {
			out, errOut, code := e.Srun(t, cluster.TestUser, img, "--microvm-mounts="+ro+":/data:ro", "sh", "-c", "cat /data/in; if touch /data/new 2>/dev/null; then echo WROTE; else echo REFUSED; fi")
			if code != 0 || !strings.Contains(out, "KATA-RO-CONTENT") || !strings.Contains(out, "REFUSED") {
				t.Fatalf("exit %d, stdout %q, stderr %q: want the file read and the write refused", code, out, errOut)
			}
			if _, err := os.Stat(filepath.Join(ro, "new")); err == nil {
				t.Fatal("a read-only share was written on the host")
			}
		})
		e.Run(t, m.name+": exit status, signal, stdin", func(t *testing.T) {
			if _, _, code := e.Srun(t, cluster.TestUser, img, "sh", "-c", "exit 7"); code != 7 {
				t.Errorf("exit %d, want 7", code)
			}
			if _, errOut, code := e.Srun(t, cluster.TestUser, img, "sh", "-c", "kill -TERM $$"); code == 0 || !strings.Contains(errOut, "Terminated") {
				t.Errorf("exit %d, stderr %q: want the task reported killed by signal 15", code, errOut)
			}
			if _, errOut, code := e.Srun(t, cluster.TestUser, img, "no-such-command"); code != 127 {
				t.Errorf("exit %d, stderr %q: want 127 for a command not in the image", code, errOut)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			cmd, err := e.C.Command(ctx, cluster.TestUser, "srun", img, "cat")
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stdin = strings.NewReader("hi\n")
			if out, err := cmd.Output(); err != nil || string(out) != "hi\n" {
				t.Errorf("echo hi | srun cat: %q, %v", out, err)
			}
		})
		e.Run(t, m.name+": scancel reaches the workload and nothing is left", func(t *testing.T) {
			scancelTrapped(t, e, img)
			if m.name == "containerd" {
				if pids := ctrd.Shims(""); len(pids) > 0 {
					t.Errorf("containerd still has shims %v after the job", pids)
				}
			}
		})
	}
	// Both paths at once: each waits a minute for its limit.
	e.Run(t, "time limit ends the step on both paths and nothing is left", func(t *testing.T) {
		if testing.Short() {
			prereq.OptIn(t, "-short: waits for a one-minute time limit")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var runs []*started
		var jobs []int
		for _, m := range modes {
			if err := e.WriteConfig(`runtime = "kata"`, m.tables); err != nil {
				t.Fatal(err)
			}
			run, job := startSrun(t, e, ctx, "--time=1", img, "sh", "-c", trapLoop("TERM"))
			runs, jobs = append(runs, run), append(jobs, job)
		}
		for i, run := range runs {
			run.wait(t, ctx)
			if !strings.Contains(run.stdout(), "TRAPPED-TERM") {
				t.Errorf("%s: stdout %q: the time limit's TERM did not reach the workload", modes[i].name, run.stdout())
			}
		}
		for _, job := range jobs {
			e.WaitClean(t, job)
		}
	})
	// The runtime removes the cgroup it was given when the sandbox goes:
	// given the step's own, slurmstepd found it gone.
	t.Run("slurmstepd kept its step cgroups", func(t *testing.T) {
		if log := e.C.LogTail("slurmd.log", 100000); strings.Contains(log, "_cgroup_procs_check: failed") {
			t.Errorf("slurmstepd lost a step cgroup (linux.cgroupsPath must be a child of the step's):\n%s", grepLines(log, "_cgroup_procs_check"))
		}
	})
}

// grepLines are the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
