package qemu_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// TestGuestSeesWhatTheHostSends boots a real microVM and runs a probe (a
// static Go program, testdata/probe) that reports what the workload sees:
// bytes that are not UTF-8 in argv, an environment value and the working
// directory arrive byte-exact; the clock at the workload's first
// instruction is the host's, even after the guest's clock went wrong (set
// 30 s back here; TCG guests drift by seconds); the image's ENV supplies
// defaults but no variable the step owns. The sandbox runs as root so that
// a process can set the guest's clock wrong.
func TestGuestSeesWhatTheHostSends(t *testing.T) {
	fixture.Require(t, "qemu-system-x86_64", "mkfs.erofs", "busybox", "go")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const odd = "\xff\xfe"
	e := newVMEnv(t, ctx, "Probe OS", func(rootfs string) {
		build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(rootfs, "bin/probe"), "./testdata/probe")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build probe: %v\n%s", err, out)
		}
		if err := os.Mkdir(filepath.Join(rootfs, "w"+odd), 0o755); err != nil {
			t.Fatal(err)
		}
	})
	tmp, a, disk := e.tmp, e.a, e.disk
	stateDir := filepath.Join(tmp, "state")
	if err := os.Mkdir(stateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	accel := qemu.DetectAccel()
	d := qemu.New(qemu.Options{
		Binary: "qemu-system-x86_64", Accel: accel, Kernel: a.Kernel, Initrd: a.Initrd,
		Cmdline: assets.KernelCmdline(accel), Seccomp: true,
		BootTimeout: 90 * time.Second, StopGrace: 5 * time.Second,
	})
	sb, err := d.Start(ctx, driver.SandboxConfig{
		ID: "probe", StateDir: stateDir, CPUs: 1, MemoryMiB: 256, RootFS: driver.RootFS{Image: disk, OverlayMiB: 64},
		UID: 0, GID: 0, Groups: []uint32{0}, Hostname: "guest-probe",
		ImageEnv: []string{"PATH=/bin", "IMAGE_VAR=kept", "SLURM_JOB_ID=666", "SLURM_ARRAY_JOB_ID=666",
			"PMIX_SERVER_URI41=pmix-server.1;tcp4://10.6.6.6:666", "CUDA_VISIBLE_DEVICES=0"},
	})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = sb.Stop(context.Background()) })
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	if err := sb.Listen(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = sb.Serve(sctx) }()
	t.Logf("accel %s", accel)

	// probe runs the probe and returns its report, with the host's time
	// just before the request and just after the answer.
	probe := func(t *testing.T, spec driver.ProcessSpec) (map[string][]string, time.Time, time.Time) {
		t.Helper()
		c, err := control.Attach(ctx, stateDir)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		before := time.Now()
		p, err := c.Exec(ctx, spec)
		if err != nil {
			t.Fatalf("exec %q: %v", spec.Argv, err)
		}
		var out bytes.Buffer
		p.Relay(ctx, nil, &out, &out)
		st, err := p.Wait(ctx)
		after := time.Now()
		if err != nil || st.Code != 0 {
			t.Fatalf("probe: %v, %v; output %q", st, err, out.String())
		}
		rep := map[string][]string{}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			k, v, _ := strings.Cut(line, " ")
			rep[k] = append(rep[k], v)
		}
		return rep, before, after
	}
	hexOf := func(s string) string { return hex.EncodeToString([]byte(s)) }

	t.Run("bytes that are not UTF-8", func(t *testing.T) {
		rep, _, _ := probe(t, driver.ProcessSpec{
			Argv: []string{"probe", "a" + odd, odd},
			Env:  []string{"HOME=/", "V=x" + odd},
			Cwd:  "/w" + odd,
		})
		if got, want := strings.Join(rep["arg"], " "), hexOf("a"+odd)+" "+hexOf(odd); got != want {
			t.Errorf("argv: the guest saw %s, want %s", got, want)
		}
		if got, want := strings.Join(rep["env"], ""), hexOf("x"+odd); got != want {
			t.Errorf("env value: the guest saw %s, want %s", got, want)
		}
		if got, want := strings.Join(rep["cwd"], ""), hexOf("/w"+odd); got != want {
			t.Errorf("working directory: the guest saw %s, want %s", got, want)
		}
	})

	t.Run("clock is the host's", func(t *testing.T) {
		const slack = 250 * time.Millisecond
		for i := 0; i < 3; i++ {
			if i > 0 {
				// The guest's clock goes wrong: every start sets it.
				back := strconv.FormatInt(time.Now().Unix()-30, 10)
				if _, st := runArgv(t, ctx, stateDir, "date", "-s", "@"+back); st.Code != 0 {
					t.Fatalf("set the guest clock back: %v", st)
				}
			}
			rep, before, after := probe(t, driver.ProcessSpec{Argv: []string{"probe"}, Env: []string{"HOME=/"}})
			ns, err := strconv.ParseInt(strings.Join(rep["time"], ""), 10, 64)
			if err != nil {
				t.Fatalf("probe time %q: %v", rep["time"], err)
			}
			guest := time.Unix(0, ns)
			if guest.Before(before.Add(-slack)) || guest.After(after.Add(slack)) {
				t.Errorf("run %d: the workload's clock read %s, %v from the host's at exec (host %s .. %s)",
					i, guest.Format(time.RFC3339Nano), guest.Sub(before), before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano))
			}
			t.Logf("run %d: guest - host at exec = %v (exec took %v)", i, guest.Sub(before), after.Sub(before))
		}
	})

	t.Run("step-owned variables", func(t *testing.T) {
		rep, _, _ := probe(t, driver.ProcessSpec{Argv: []string{"probe"}, Env: []string{
			"HOME=/", "SLURM_JOB_ID=42",
			"PROBE_NAMES=IMAGE_VAR SLURM_JOB_ID SLURM_ARRAY_JOB_ID PMIX_SERVER_URI41 CUDA_VISIBLE_DEVICES",
		}})
		got := strings.Join(rep["var"], "; ")
		want := "IMAGE_VAR=kept; SLURM_JOB_ID=42; SLURM_ARRAY_JOB_ID unset; PMIX_SERVER_URI41 unset; CUDA_VISIBLE_DEVICES unset"
		if got != want {
			t.Errorf("guest environment: %s\nwant %s", got, want)
		}
	})
}

// runArgv runs argv in the sandbox of stateDir and returns its output.
func runArgv(t *testing.T, ctx context.Context, stateDir string, argv ...string) (string, driver.ExitStatus) {
	t.Helper()
	c, err := control.Attach(ctx, stateDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.Exec(ctx, driver.ProcessSpec{Argv: argv, Env: []string{"HOME=/"}})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	var out bytes.Buffer
	p.Relay(ctx, nil, &out, &out)
	st, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("wait %q: %v", argv, err)
	}
	return out.String(), st
}
