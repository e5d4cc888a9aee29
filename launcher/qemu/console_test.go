package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An error message reads only the end of a log, however large the file
// and however few its newlines (a log the guest filled with one line).
func TestTailFileBounded(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	big := strings.Repeat("A", 4<<20) + "\nlast line\n"
	if err := os.WriteFile(p, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	got := tailFile(p)
	if len(got) > tailBytes {
		t.Errorf("tailFile read %d bytes, want at most %d", len(got), tailBytes)
	}
	if l := lastLines(got, 1); l != "last line" {
		t.Errorf("last line %q", l)
	}
	if tailFile(filepath.Join(t.TempDir(), "none")) != "" {
		t.Error("a missing file gives text")
	}
}

// The console log is never opened through a planted symlink.
func TestOpenConsoleRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "console.log")
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	if c, err := openConsole(p, 0); err == nil {
		c.w.Close()
		<-c.done
		t.Fatal("openConsole followed a symlink")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("target changed: %q", b)
	}
}
