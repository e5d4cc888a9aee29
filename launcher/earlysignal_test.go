package launcher

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestEarlySignalPendingAcrossExec is the mechanism the SPANK plugin's
// task_init relies on (spank/remote.c): a SIGUSR1 that reaches the task
// before the exec entry's Go code catches signals stays pending when it
// is blocked across exec, and catchSignals (signal.Notify unblocks it)
// receives it. perl blocks the signal, sends it to itself and execs this
// test binary, as slurmstepd's task execs the entry. (Unblocked, the Go
// runtime would drop a SIGUSR1 that came before catchSignals.)
func TestEarlySignalPendingAcrossExec(t *testing.T) {
	if os.Getenv("EARLYSIGNAL_CHILD") == "1" {
		sigs := catchSignals()
		select {
		case s := <-sigs:
			os.Stdout.WriteString("GOT " + s.String() + "\n")
		case <-time.After(2 * time.Second):
			os.Stdout.WriteString("NOTHING\n")
		}
		return
	}
	prereq.Tools(t, "perl")
	script := "use POSIX; sigprocmask(SIG_BLOCK, POSIX::SigSet->new(SIGUSR1)) or die; kill 'USR1', $$; exec @ARGV or die"
	cmd := exec.Command("perl", "-e", script, os.Args[0], "-test.run=^TestEarlySignalPendingAcrossExec$")
	cmd.Env = append(os.Environ(), "EARLYSIGNAL_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v (%s)", err, out)
	}
	if !strings.Contains(string(out), "GOT user defined signal 1") {
		t.Errorf("child said %q: the signal sent before its Go code ran was lost", out)
	}
}
