package launcher

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// TestHungGuestFailsStep boots a real microVM, runs a task in it, and
// freezes the guest by stopping its VMM (SIGSTOP: the process lives, the
// guest answers nothing). The supervisor must fail the step within
// agent_hang and a margin, with the reason in the error file, kill the
// VMM, and the task blocked in its Wait must end at once with that
// reason. A guest that answers is never taken as hung: the step first
// runs longer than agent_hang untouched. Before the watchdog the
// supervisor never looked at the agent once the step ran, and the task
// waited until Slurm's time limit.
func TestHungGuestFailsStep(t *testing.T) {
	const ping, hang = time.Second, 4 * time.Second
	r := startRealStep(t, 768, func(c *config.Config) {
		c.Timeouts.AgentPing = config.Duration{Duration: ping}
		c.Timeouts.AgentHang = config.Duration{Duration: hang}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, out, errOut := r.exec(ctx, "sh", "-c", "echo READY; sleep 300")
	waitOutput(t, out, "READY", time.Minute)
	vmm, err := state.ReadProc(r.d.File(state.VMMPidFile))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(hang + 2*ping)
	select {
	case <-r.ended:
		t.Fatalf("the supervisor ended while the guest answered: %v", r.startErr)
	default:
	}
	t0 := time.Now()
	if err := vmm.Signal(unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = vmm.Signal(unix.SIGCONT) }()
	const margin = 6 * time.Second // one ping interval, the kill, a loaded host
	select {
	case <-r.ended:
	case <-time.After(hang + margin):
		t.Fatalf("the supervisor did not notice the hung guest within %s (agent_hang %s)", hang+margin, hang)
	}
	took := time.Since(t0)
	startErr := r.startErr
	t.Logf("hung guest detected after %v: %v", took, startErr)
	var he *AgentHungError
	if !errors.As(startErr, &he) || he.Hang != hang {
		t.Fatalf("Start: %v, want an AgentHungError of %s", startErr, hang)
	}
	if took < hang-ping {
		t.Errorf("detected after %v: before agent_hang (%s) passed", took, hang)
	}
	const want = "the guest agent did not answer for 4s (timeouts.agent_hang): the guest is hung; the microVM was stopped"
	if b, err := os.ReadFile(r.d.File(state.ErrorFile)); err != nil || strings.TrimSpace(string(b)) != want {
		t.Errorf("error file %q (%v), want %q", b, err, want)
	}
	if vmm.Alive() {
		t.Errorf("VMM pid %d still alive after the hang was detected", vmm.Pid)
	}
	select {
	case got := <-res:
		if got.err == nil || got.err.Error() != want || !errors.Is(got.err, driver.ErrSandboxExited) {
			t.Errorf("task: status %+v, err %v; want %q (ErrSandboxExited)", got.st, got.err, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the task did not end within 5 s of the supervisor (stderr %q)", errOut.String())
	}
}
