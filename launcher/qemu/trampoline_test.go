package qemu

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The test binary is its own trampoline: TestTrampoline runs it with
// TrampolineArg.
func init() {
	if len(os.Args) > 1 && os.Args[1] == TrampolineArg {
		err := Trampoline(os.Args[2:])
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(127)
	}
}

// TestTrampoline: a program started through the trampoline survives the
// signals Slurm sends a whole step (TERM, INT, HUP), as QEMU must for the
// workload to handle them; without it the same program dies of them.
func TestTrampoline(t *testing.T) {
	sh := "/bin/sh"
	script := `for s in TERM INT HUP QUIT USR2 ALRM PWR VTALRM PROF XCPU XFSZ; do kill -$s $$; done; echo survived`
	out, err := exec.Command(os.Args[0], TrampolineArg, sh, "-c", script).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "survived" {
		t.Errorf("through the trampoline: %v, output %q; want it to survive", err, out)
	}
	out, err = exec.Command(sh, "-c", script).CombinedOutput()
	if err == nil || strings.Contains(string(out), "survived") {
		t.Errorf("without the trampoline the shell survived TERM (%v, %q): the test shows nothing", err, out)
	}
	if out, err := exec.Command(os.Args[0], TrampolineArg, "/nonexistent/qemu").CombinedOutput(); err == nil || !strings.Contains(string(out), "/nonexistent/qemu") {
		t.Errorf("a VMM that cannot be executed: %v, %q; want the error naming it", err, out)
	}
}
