package guest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
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

// preload's wait returns the load's own result, the same on every call,
// and nil when nothing is needed.
func TestPreload(t *testing.T) {
	ctx := context.Background()
	if err := preload(ctx, guestmod.Config{Root: t.TempDir()}, false)(); err != nil {
		t.Fatalf("not needed: %v", err)
	}
	wait := preload(ctx, guestmod.Config{Root: t.TempDir(), Release: "6.1.0-test"}, true)
	err1, err2 := wait(), wait()
	if err1 == nil || !strings.Contains(err1.Error(), "6.1.0-test") || err2 != err1 {
		t.Fatalf("a load without an order file: %v, then %v", err1, err2)
	}
}
