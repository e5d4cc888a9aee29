package main

import (
	"bytes"
	"testing"
)

// TestVersionCommand: `slurm-microvm version` prints exactly what
// `slurm-microvm --version` prints, the version the ldflags set included.
func TestVersionCommand(t *testing.T) {
	out := func(args ...string) string {
		t.Helper()
		app := newApp()
		var b bytes.Buffer
		app.Writer = &b
		if err := app.Run(append([]string{"slurm-microvm"}, args...)); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return b.String()
	}
	want := "slurm-microvm version " + version + "\n"
	if got := out("--version"); got != want {
		t.Fatalf("--version printed %q, want %q", got, want)
	}
	if got := out("version"); got != want {
		t.Fatalf("version printed %q, want %q (as --version)", got, want)
	}
}
