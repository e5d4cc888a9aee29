package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
	"github.com/slurm-microvm/slurm-microvm/launcher/placement"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// TestPlacementSlurm: under Slurm's task/cgroup with ConstrainCores=yes,
// a step's VMM sits in the step's cgroups (cpuset, memory, freezer: every
// thread), its vCPU i runs on the i-th CPU of the step's cpuset under KVM
// (anywhere in it under TCG, where the product does not pin), and its
// other threads on the whole cpuset; with -c1 and -c2 on this node. The
// affinities are read from the kernel while the workload runs.
func TestPlacementSlurm(t *testing.T) {
	e := harness.Setup(t)
	img := "--microvm=" + e.Image
	for _, shape := range []string{"-c1", "-c2"} {
		t.Run(shape, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			cmd, err := e.C.Command(ctx, "", "srun", shape, img, "sh", "-c", "echo JOB=$SLURM_JOB_ID VCPUS=$(nproc); read x; echo done")
			if err != nil {
				t.Fatal(err)
			}
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			lines := bufio.NewScanner(stdout)
			if !lines.Scan() {
				_ = cmd.Wait()
				t.Fatalf("srun %s: no output; stderr %s", shape, stderr.String())
			}
			first := lines.Text()
			job := jobOf(t, first)
			vmm := vmmOf(t, job)
			check(t, vmm.Pid, job, first)
			fmt.Fprintln(stdin, "go")
			stdin.Close()
			rest, _ := io.ReadAll(stdout)
			if err := cmd.Wait(); err != nil || !strings.Contains(string(rest), "done") {
				t.Fatalf("srun %s: %v, stdout %q, stderr %s", shape, err, rest, stderr.String())
			}
			e.WaitClean(t, job)
		})
	}
}

// check reads the placement of VMM pid of job's step 0 from the kernel.
func check(t *testing.T, pid, job int, first string) {
	t.Helper()
	cs, err := cgroup.ProcessCpuset(pid, "/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if !cgroup.InStep(cs.Path, uint32(job), 0) {
		t.Fatalf("VMM's cpuset %s is not step 0's of job %d", cs.Path, job)
	}
	// The VMM has the OOM standing of the step's tasks (0), not
	// slurmstepd's -1000: it is the one the kernel kills past --mem.
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid)); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Errorf("VMM oom_score_adj %q (%v), want 0 as the step's tasks have", strings.TrimSpace(string(b)), err)
	}
	step, err := placement.ParseList(cs.List)
	if err != nil {
		t.Fatal(err)
	}
	threads, err := qemu.Threads(pid)
	if err != nil {
		t.Fatal(err)
	}
	vcpus := 0
	for _, th := range threads {
		if th.VCPU >= 0 {
			vcpus++
		}
	}
	if !strings.Contains(first, fmt.Sprintf("VCPUS=%d", vcpus)) || vcpus != len(step) {
		t.Errorf("%d vCPU threads, the guest says %q, the step's cpuset is %s: want one vCPU per allocated CPU", vcpus, first, step)
	}
	want := placement.VCPUs(vcpus, step)
	for _, th := range threads {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, th.TID))
		if err != nil {
			t.Fatal(err)
		}
		var got placement.CPUSet
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
				got, _ = placement.ParseList(v)
			}
		}
		// Under TCG the product leaves the vCPUs on the whole cpuset.
		w := step
		if th.VCPU >= 0 && qemu.DetectAccel() == "kvm" {
			w = placement.CPUSet{want[th.VCPU]}
		}
		if !got.Equal(w) {
			t.Errorf("VMM thread %d %q: affinity %s, want %s (step cpuset %s)", th.TID, th.Name, got, w, step)
		} else {
			t.Logf("VMM thread %d %q: affinity %s (step cpuset %s)", th.TID, th.Name, got, step)
		}
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/cgroup", pid, th.TID))
		if err != nil {
			t.Fatal(err)
		}
		ms, err := cgroup.Parse(strings.NewReader(string(cg)))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			for _, c := range []string{"cpuset", "memory", "freezer"} {
				if m.Controllers == c && !cgroup.InStep(m.Path, uint32(job), 0) {
					t.Errorf("VMM thread %d %q: %s cgroup %s, not the step's", th.TID, th.Name, c, m.Path)
				}
			}
		}
	}
}
