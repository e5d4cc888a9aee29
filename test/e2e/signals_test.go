package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// TestE2ESignalDuringBoot: `scancel -s USR1` while the step's microVM is
// still booting reaches the workload once it runs, as it would on the host
// (the workload's trap prints TRAPPED-USR1).
func TestE2ESignalDuringBoot(t *testing.T) {
	e := harness.Setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	before := map[string]bool{}
	if entries, err := os.ReadDir(harness.RuntimeDir); err == nil {
		for _, en := range entries {
			before[en.Name()] = true
		}
	}
	script := "trap 'echo TRAPPED-USR1; exit 0' USR1; i=0; while [ $i -lt 150 ]; do sleep 0.2; i=$((i+1)); done; echo NO-SIGNAL"
	cmd, err := e.C.Command(ctx, "", "srun", "--microvm="+e.Image, "sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	// The step's state appears at prepare; its task is the exec entry,
	// waiting for the microVM.
	var step string
	for step == "" {
		if entries, err := os.ReadDir(harness.RuntimeDir); err == nil {
			for _, en := range entries {
				if _, perr := state.ParseStepID(en.Name()); !before[en.Name()] && perr == nil {
					step = en.Name()
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no step state appeared; stderr %q", errb.String())
		case err := <-done:
			t.Fatalf("srun ended before its step appeared: %v; stderr %q", err, errb.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	for !execWaiting(step) {
		select {
		case <-ctx.Done():
			t.Fatalf("the task of step %s never started", step)
		case <-time.After(20 * time.Millisecond):
		}
	}
	// Sent as soon as the entry runs: the SPANK plugin blocked USR1 in
	// the task before exec, so one that comes before the entry's Go code
	// catches it stays pending instead of being dropped.
	job := strings.SplitN(step, ".", 2)[0]
	stepDir := filepath.Join(harness.RuntimeDir, step)
	if _, err := os.Stat(filepath.Join(stepDir, state.ReadyFile)); err == nil {
		t.Fatalf("step %s was ready before the signal: nothing to test", step)
	}
	if err := e.C.Scancel(ctx, "-s", "USR1", job); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(stepDir, state.ReadyFile)); err == nil {
		t.Logf("step %s became ready while scancel ran", step)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("srun: %v; stderr %q", err, errb.String())
		}
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		t.Fatalf("srun did not end; stdout %q", out.String())
	}
	if !strings.Contains(out.String(), "TRAPPED-USR1") {
		t.Errorf("stdout %q, stderr %q: the USR1 sent during the boot did not reach the workload", out.String(), errb.String())
	}
	n, _ := strconv.Atoi(job)
	e.WaitClean(t, n)
}

// execWaiting reports whether a task of step (its exec entry, argv[0]
// slurm-microvm-exec, with SLURM_MICROVM_STEP=step) runs on this host.
func execWaiting(step string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p + "/cmdline")
		if err != nil {
			continue
		}
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		if !bytes.HasSuffix(argv0, []byte("slurm-microvm-exec")) {
			continue
		}
		env, err := os.ReadFile(p + "/environ")
		if err == nil && bytes.Contains(env, []byte("\x00SLURM_MICROVM_STEP="+step+"\x00")) {
			return true
		}
	}
	return false
}
