package main

import (
	"os"
	"path/filepath"
	"testing"
)

// otherUIDBinary makes a directory under /run (0755, whose parents only
// root can write) holding a copy of this test binary that another uid can
// execute, removed at the end of t; it returns both paths.
func otherUIDBinary(t *testing.T, prefix string) (dir, bin string) {
	t.Helper()
	dir, err := os.MkdirTemp("/run", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, "slurm-microvm.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}
