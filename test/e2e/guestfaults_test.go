package e2e

import (
	"context"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// TestE2EGuestFaults: faults inside a running step's guest end that step
// alone, on time, with the reason on the task's stderr, and leave nothing
// (e.Run's residue check) and no drained node.
func TestE2EGuestFaults(t *testing.T) {
	e := harness.Setup(t)
	img := "--microvm=" + e.Image

	e.Run(t, "a hung guest agent fails the step within agent_hang", func(t *testing.T) {
		// The harness's configuration keeps the defaults: agent_ping 5s,
		// agent_hang 15s. A VMM stopped by SIGSTOP is alive and silent,
		// as a locked-up guest is.
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd, err := e.C.Command(ctx, "", "srun", img, "sh", "-c", "echo JOB=$SLURM_JOB_ID; echo READY; exec sleep 300")
		if err != nil {
			t.Fatal(err)
		}
		var se fixture.SyncBuffer
		run, job := startUntilReady(t, ctx, cmd, &se)
		vmm := vmmOf(t, job)
		t0 := time.Now()
		if err := vmm.Signal(unix.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if vmm.Alive() {
				_ = vmm.Signal(unix.SIGCONT)
			}
		}()
		select {
		case <-run.done:
		case <-time.After(45 * time.Second):
			_ = run.cmd.Process.Kill()
			t.Fatalf("srun still running 45 s after the VMM was stopped; stderr %q", se.String())
		}
		took := time.Since(t0)
		t.Logf("srun ended %v after the VMM was stopped; stderr %q", took, se.String())
		if took > 25*time.Second {
			t.Errorf("srun ended %v after the guest hung: want within agent_hang (15s) and a margin (25 s)", took)
		}
		const want = "slurm-microvm: the guest agent did not answer for 15s (timeouts.agent_hang): the guest is hung; the microVM was stopped"
		if !strings.Contains(se.String(), want) {
			t.Errorf("stderr %q lacks %q", se.String(), want)
		}
		if code := run.cmd.ProcessState.ExitCode(); code == 0 {
			t.Errorf("srun exited 0 for a hung guest")
		}
		e.WaitClean(t, job)
		notDrained(t, e)
	})

	e.Run(t, "the guest's out-of-memory kill is reported with its reason", func(t *testing.T) { oomTest(t, e, img) })

	e.Run(t, "--microvm-debug shows each start phase's duration and no job value", func(t *testing.T) {
		const secret = "s3cr3t-e2e-phase"
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd, err := e.C.Command(ctx, "", "srun", "--microvm-debug", img, "sh", "-c", "echo JOB=$SLURM_JOB_ID")
		if err != nil {
			t.Fatal(err)
		}
		cmd.Env = append(cmd.Env, "API_TOKEN="+secret)
		var so, se fixture.SyncBuffer
		cmd.Stdout, cmd.Stderr = &so, &se
		if err := cmd.Run(); err != nil {
			t.Fatalf("srun: %v; stderr %q", err, se.String())
		}
		line := regexp.MustCompile(`(?m)^microvm launcher: time=\S+ level=INFO msg=phase step=\S+ phase=(\w+) ms=(\d+)$`)
		var got []string
		for _, m := range line.FindAllStringSubmatch(se.String(), -1) {
			got = append(got, m[1])
			t.Logf("%s: %s ms", m[1], m[2])
		}
		// The first exec is the task's own, before its end; the stop
		// comes after the task, whose stderr this is: its line is in
		// the admin's kept log only.
		want := "gpus shares image mpi assets network boot ready start first_exec"
		if strings.Join(got, " ") != want {
			t.Errorf("phase lines %q, want %q; stderr:\n%s", got, want, se.String())
		}
		if strings.Contains(se.String(), secret) {
			t.Errorf("the job's stderr holds an environment value of the job:\n%s", se.String())
		}
		e.WaitClean(t, jobOf(t, so.String()))
	})
}

// oomTest: a step that touches more memory than its guest has is killed
// by the guest's OOM killer; srun reports the task killed by SIGKILL with
// the reason on stderr, and the node stays up.
func oomTest(t *testing.T, e *harness.Env, img string) {
	// --mem=448: a guest of 256 MiB (vmm_overhead_mib 192 in the test
	// configuration); dd's 200 MiB buffer is below its total, so the
	// allocation succeeds and touching it exhausts the guest.
	out, errOut, code := e.Srun(t, "", "--mem=448", img, "sh", "-c", "echo JOB=$SLURM_JOB_ID; exec dd if=/dev/zero of=/dev/null bs=200M count=1")
	t.Logf("exit %d, stdout %q, stderr %q", code, out, errOut)
	const want = "slurm-microvm: the task was killed by the guest's out-of-memory killer: the step's memory is exhausted (guest 256 MiB, from "
	if !strings.Contains(errOut, want) {
		t.Errorf("stderr %q lacks %q", errOut, want)
	}
	if code == 0 || !strings.Contains(errOut, "Killed") {
		t.Errorf("exit %d, stderr %q: want srun to report the task killed by signal 9", code, errOut)
	}
	e.WaitClean(t, jobOf(t, out))
	notDrained(t, e)
}

// vmmOf is the VMM of job's step 0 on this node, from the step's state.
func vmmOf(t *testing.T, job int) state.Proc {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(harness.RuntimeDir, strconv.Itoa(job)+".0.*"))
	if len(dirs) != 1 {
		t.Fatalf("state directories of job %d step 0: %q, want one", job, dirs)
	}
	p, err := state.ReadProc(filepath.Join(dirs[0], state.VMMPidFile))
	if err != nil || !p.Alive() {
		t.Fatalf("VMM of job %d: %+v, %v", job, p, err)
	}
	return p
}

// notDrained fails t when a node of the cluster is drained or down: a
// step's failure must stay the step's.
func notDrained(t *testing.T, e *harness.Env) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, errOut, code, err := e.C.Run(ctx, "", "sinfo", "-h", "-N", "-o", "%N %T")
	if err != nil || code != 0 {
		t.Fatalf("sinfo: exit %d, %v: %s", code, err, errOut)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && (strings.Contains(f[1], "drain") || strings.HasPrefix(f[1], "down") || strings.Contains(f[1], "fail")) {
			t.Errorf("node %s is %s after the step", f[0], f[1])
		}
	}
}
