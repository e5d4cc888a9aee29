package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// envFallbackTests run real steps with the SLURM_MICROVM_* fallbacks in
// srun's environment (as pyxis' PYXIS_*): the step runs in the image's
// microVM with the variables' options, the command line wins, a bad
// value is refused naming the variable, and with --export=NONE the step
// still gets them (srun exports SLURM_*), never running on the host after
// srun validated it for a microVM.
func envFallbackTests(t *testing.T, e *harness.Env) {
	srunEnv := func(t *testing.T, env []string, args ...string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd, err := e.C.Command(ctx, "", "srun", args...)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Env = append(cmd.Env, env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		code := 0
		if err != nil {
			code = -1
			if cmd.ProcessState != nil {
				code = cmd.ProcessState.ExitCode()
			}
		}
		return stdout.String(), stderr.String(), code
	}
	e.Run(t, "SLURM_MICROVM_IMAGE and SLURM_MICROVM_WORKDIR", func(t *testing.T) {
		out, errOut, code := srunEnv(t, []string{"SLURM_MICROVM_IMAGE=" + e.Image, "SLURM_MICROVM_WORKDIR=/tmp"}, "sh", "-c", "uname -r; pwd")
		if code != 0 || out != e.Kernel+"\n/tmp\n" {
			t.Fatalf("exit %d, stdout %q, stderr %q: want the guest kernel %s and /tmp", code, out, errOut, e.Kernel)
		}
	})
	e.Run(t, "the command line wins over SLURM_MICROVM_WORKDIR", func(t *testing.T) {
		out, errOut, code := srunEnv(t, []string{"SLURM_MICROVM_WORKDIR=/tmp"}, "--microvm="+e.Image, "--microvm-workdir=/", "pwd")
		if code != 0 || out != "/\n" {
			t.Fatalf("exit %d, stdout %q, stderr %q: want /", code, out, errOut)
		}
	})
	e.Run(t, "a bad SLURM_MICROVM_MPI is refused naming it", func(t *testing.T) {
		_, errOut, code := srunEnv(t, []string{"SLURM_MICROVM_IMAGE=" + e.Image, "SLURM_MICROVM_MPI=sometimes"}, "true")
		if code == 0 || !strings.Contains(errOut, `"sometimes" must be one of`) || !strings.Contains(errOut, "options taken from the environment: SLURM_MICROVM_IMAGE, SLURM_MICROVM_MPI") {
			t.Fatalf("exit %d, stderr %q: want refused", code, errOut)
		}
	})
	e.Run(t, "variables without an image leave host steps alone", func(t *testing.T) {
		out, errOut, code := srunEnv(t, []string{"SLURM_MICROVM_MPI=host", "SLURM_MICROVM_DEBUG=1"}, "cat", "/proc/sys/kernel/random/boot_id")
		if code != 0 || strings.TrimSpace(out) != e.HostBoot {
			t.Fatalf("exit %d, stdout %q, stderr %q: want the host's boot id", code, out, errOut)
		}
	})
	e.Run(t, "--export=NONE", func(t *testing.T) {
		out, errOut, code := srunEnv(t, []string{"SLURM_MICROVM_IMAGE=" + e.Image}, "--export=NONE", "/bin/cat", "/proc/sys/kernel/random/boot_id")
		// srun exports SLURM_* even with --export=NONE (Slurm 22.05), so
		// slurmstepd sees what srun validated: the step is in the VM.
		if b := strings.TrimSpace(out); code != 0 || b == "" || b == e.HostBoot {
			t.Fatalf("exit %d, stdout %q, stderr %q: want the step in a microVM (a boot id not the host's %s)", code, out, errOut, e.HostBoot)
		}
	})
}
