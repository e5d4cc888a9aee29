package qemu

import (
	"os/exec"
	"syscall"
	"testing"
)

// The out-of-memory reason needs the VMM's death by SIGKILL: an exit
// status or another signal keeps the plain reason whatever the cgroup's
// count did.
func TestKilledBy(t *testing.T) {
	for _, tt := range []struct {
		script string
		want   bool
	}{
		{"kill -KILL $$", true},
		{"kill -TERM $$", false},
		{"exit 1", false},
	} {
		err := exec.Command("sh", "-c", tt.script).Run()
		if got := killedBy(err, syscall.SIGKILL); got != tt.want {
			t.Errorf("%q: killedBy SIGKILL = %v (%v), want %v", tt.script, got, err, tt.want)
		}
	}
	if killedBy(nil, syscall.SIGKILL) {
		t.Error("a clean exit counted as SIGKILL")
	}
}
