package state

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestProcRecord(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	f := filepath.Join(t.TempDir(), "pid")
	if err := WriteProc(f, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	p, err := ReadProc(f)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Alive() {
		t.Fatal("live process reported dead")
	}
	stale := p
	stale.StartTime++
	if stale.Alive() {
		t.Fatal("a pid with another start time (reused pid) reported alive")
	}
	if err := stale.Signal(9); err != nil || !p.Alive() {
		t.Fatalf("signal to a stale record must not reach the process: %v", err)
	}
	if err := p.Signal(9); err != nil {
		t.Fatal(err)
	}
	_, _ = cmd.Process.Wait()
	if p.Alive() {
		t.Fatal("killed and reaped process reported alive")
	}
	if _, err := ReadProc(filepath.Join(t.TempDir(), "missing")); !os.IsNotExist(err) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestStepID(t *testing.T) {
	id := StepID{Job: 12, Step: 4294967291, Restart: 1}
	got, err := ParseStepID(id.String())
	if err != nil || got != id {
		t.Fatalf("round trip %v -> %q -> %v %v", id, id.String(), got, err)
	}
	for _, bad := range []string{"", "1.2", "1.2.3.4/5", "a.b.c", "1.-2.3"} {
		if _, err := ParseStepID(bad); err == nil {
			t.Errorf("ParseStepID(%q) accepted", bad)
		}
	}
}
