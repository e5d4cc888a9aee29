package guest

import (
	"context"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
)

// Setup answers with the agent's boot marks and its own span, in order,
// on the guest's clock (the host's boot timeline is built from them).
func TestSetupAnswersBootMarks(t *testing.T) {
	now := Uptime()
	boot := &BootMarks{Start: now - 30*time.Millisecond, ModulesDone: now - 20*time.Millisecond, Serving: now - 10*time.Millisecond}
	svc := New(Options{Boot: boot, Setup: func(context.Context, *api.SetupRequest) (string, error) {
		time.Sleep(2 * time.Millisecond) // a set-up that takes time
		return "", nil
	}})
	defer svc.Close()
	r, err := svc.Setup(context.Background(), &api.SetupRequest{Uid: 65534, Gid: 65534})
	if err != nil {
		t.Fatal(err)
	}
	us := func(d time.Duration) uint64 { return uint64(d.Microseconds()) }
	if r.AgentStartUs != us(boot.Start) || r.ModulesDoneUs != us(boot.ModulesDone) || r.ServingUs != us(boot.Serving) {
		t.Fatalf("boot marks %+v, want %+v", r, boot)
	}
	if r.SetupStartUs < r.ServingUs || r.SetupDoneUs < r.SetupStartUs+2000 {
		t.Fatalf("setup span %d..%d us does not follow serving at %d us and cover the 2 ms set-up", r.SetupStartUs, r.SetupDoneUs, r.ServingUs)
	}
}
