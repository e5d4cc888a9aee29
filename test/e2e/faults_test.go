package e2e

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/fault"
	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// switchFault switches stages on for every job of the test launcher (an
// smv_faults build): fault.Dir/all, root's, until t ends. readable makes
// Dir and the file readable by the job's user (0755, 0644), for what the
// exec entry reads; else 0700 and 0600.
func switchFault(t *testing.T, readable bool, stages ...fault.Stage) {
	t.Helper()
	dirMode, fileMode := os.FileMode(0o700), os.FileMode(0o600)
	if readable {
		dirMode, fileMode = 0o755, 0o644
	}
	if _, err := os.Lstat(fault.Dir); err == nil {
		t.Fatalf("%s exists already (a crashed test's?): remove it first", fault.Dir)
	}
	if err := os.Mkdir(fault.Dir, dirMode); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(fault.Dir); err != nil {
			t.Error(err)
		}
	})
	var b strings.Builder
	for _, s := range stages {
		fmt.Fprintln(&b, s)
	}
	p := filepath.Join(fault.Dir, "all")
	if err := os.WriteFile(p, []byte(b.String()), fileMode); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{fault.Dir, p} {
		mode := fileMode
		if f == fault.Dir {
			mode = dirMode
		}
		if err := os.Chmod(f, mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
}

// TestE2EStartFaults fails a step's start at each stage (package fault)
// and checks that srun fails naming the stage and that nothing of the
// step is left on the host.
func TestE2EStartFaults(t *testing.T) {
	e := harness.Setup(t)
	img := "--microvm=" + e.Image
	for _, stage := range fault.StartStages {
		e.Run(t, string(stage), func(t *testing.T) {
			switchFault(t, false, stage)
			out, errOut, code := e.Srun(t, cluster.TestUser, img, "echo", "SHOULD-NOT-RUN")
			want := fmt.Sprintf("fault injected at stage %q", stage)
			if code == 0 || strings.Contains(out, "SHOULD-NOT-RUN") || !strings.Contains(errOut, want) {
				t.Fatalf("exit %d, stdout %q, stderr %q: want a failed start naming %s", code, out, errOut, want)
			}
			t.Logf("exit %d, stderr %q", code, errOut)
		})
	}
}

// TestE2EFaultBehaviours: each behaviour of a deliberately broken build
// (package fault) shows on a real step, so that the poc checks meant to
// catch it have something to catch.
func TestE2EFaultBehaviours(t *testing.T) {
	e := harness.Setup(t)
	img := "--microvm=" + e.Image
	u, err := user.Lookup(cluster.TestUser)
	if err != nil {
		t.Fatal(err)
	}

	e.Run(t, "share-rw: a :ro share is writable", func(t *testing.T) {
		dir := filepath.Join(harness.DataDir, "rw", u.Username+"-faults")
		mkdirOwned(t, dir, u, 0o700)
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		switchFault(t, false, fault.ShareRW)
		out, errOut, code := e.Srun(t, cluster.TestUser, img, "--microvm-mounts="+dir+":/in:ro", "sh", "-c", "echo leaked > /in/f")
		if _, err := os.Stat(filepath.Join(dir, "f")); code != 0 || err != nil {
			t.Fatalf("exit %d, stdout %q, stderr %q, host file: %v: want the write through the :ro share to succeed", code, out, errOut, err)
		}
	})

	e.Run(t, "log-env: the task's environment on stderr and in /tmp", func(t *testing.T) {
		switchFault(t, true, fault.LogEnv)
		const secret = "SMV_FAULT_SECRET=s3cr3t-value"
		out, errOut, code := e.Srun(t, cluster.TestUser, "--export=ALL,"+secret, img, "sh", "-c", "echo JOB=$SLURM_JOB_ID STEP=$SLURM_STEP_ID")
		if code != 0 {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		job := jobOf(t, out)
		var step int
		if _, err := fmt.Sscanf(out[strings.Index(out, "STEP="):], "STEP=%d", &step); err != nil {
			t.Fatalf("no STEP= in %q", out)
		}
		leak := fmt.Sprintf("/tmp/slurm-microvm-env-%d.%d", job, step)
		t.Cleanup(func() { _ = os.Remove(leak) })
		if want := "slurm-microvm: env " + secret; !strings.Contains(errOut, want) {
			t.Errorf("stderr %q does not contain %q", errOut, want)
		}
		fi, err := os.Stat(leak)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(leak); fi.Mode().Perm() != 0o644 || !strings.Contains(string(b), secret) {
			t.Errorf("%s: mode %v, content %q: want 0644 holding %s", leak, fi.Mode().Perm(), b, secret)
		}
	})

	e.Run(t, "leak-state: the state directory outlives the step", func(t *testing.T) {
		switchFault(t, false, fault.LeakState)
		out, errOut, code := e.Srun(t, cluster.TestUser, img, "sh", "-c", "echo JOB=$SLURM_JOB_ID")
		if code != 0 {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		job := jobOf(t, out)
		t.Cleanup(func() {
			dirs, _ := filepath.Glob(filepath.Join(harness.RuntimeDir, strconv.Itoa(job)+".*"))
			for _, d := range dirs {
				_ = os.RemoveAll(d)
			}
		})
		// Stop is asynchronous to srun's exit: once nothing but state is
		// left, the state must still be there.
		deadline := time.Now().Add(15 * time.Second)
		for {
			left := e.Leftovers(job)
			onlyState := len(left) > 0
			for _, l := range left {
				onlyState = onlyState && strings.HasPrefix(l, "state dir ")
			}
			if onlyState {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %d left %q: want its state directory alone", job, left)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
}
