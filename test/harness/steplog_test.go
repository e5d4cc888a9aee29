package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStepLogProblems(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got := StepLogProblems(dir, 10); !strings.HasPrefix(got, "(no step logs in ") {
		t.Errorf("empty dir: %q", got)
	}
	write("2.0.0.vm.log", "time=2026-12-02T04:00:02Z level=INFO msg=booting\ntime=2026-12-02T04:00:04Z level=ERROR msg=\"guest agent hung; killing the VMM\"\n")
	write("1.0.0.vm.log", "time=2026-12-02T04:00:01Z level=WARN msg=\"guest agent slow to answer a ping\" ms=6000\ntime=2026-12-02T04:00:03Z level=INFO msg=phase\n")
	got := StepLogProblems(dir, 10)
	want := "time=2026-12-02T04:00:01Z level=WARN msg=\"guest agent slow to answer a ping\" ms=6000  [1.0.0.vm.log]\n" +
		"time=2026-12-02T04:00:04Z level=ERROR msg=\"guest agent hung; killing the VMM\"  [2.0.0.vm.log]"
	if got != want {
		t.Errorf("StepLogProblems:\n%s\nwant:\n%s", got, want)
	}
	if got := StepLogProblems(dir, 1); got != "(1 earlier lines left out)\ntime=2026-12-02T04:00:04Z level=ERROR msg=\"guest agent hung; killing the VMM\"  [2.0.0.vm.log]" {
		t.Errorf("bounded to 1: %q", got)
	}
	write("1.0.0.vm.log", "time=2026-12-02T04:00:03Z level=INFO msg=phase\n")
	write("2.0.0.vm.log", "")
	if got := StepLogProblems(dir, 10); got != "(none)" {
		t.Errorf("no problems: %q", got)
	}
}
