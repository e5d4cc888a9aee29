package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// TestPsImageCannotForgeRows: the image is the --microvm value as the user
// typed it (a path may hold any byte but NUL and '/'); root's `ps` table
// must not print a newline or a terminal escape from it.
func TestPsImageCannotForgeRows(t *testing.T) {
	dir := t.TempDir()
	rt := filepath.Join(dir, "run")
	conf := write(t, dir, "microvm.toml", fmt.Sprintf("runtime_dir = %q\ncache_dir = %q\n", rt, filepath.Join(dir, "cache")))
	if err := state.MakeDir(rt, 0o711); err != nil {
		t.Fatal(err)
	}
	id := state.StepID{Job: 77, Step: 0, Node: "n1"}
	d := state.Dir{Root: rt, ID: id}
	if err := os.Mkdir(d.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	img := "/home/mallory/a\x1b[1A\x1b[2K\n1.0  0  n1  root(0)  docker://site/approved  -  1  1024MiB  1h  running  4242"
	b, _ := json.Marshal(launcher.Spec{ID: id, UID: 1001, User: "mallory", Image: img, MemMiB: 512})
	if err := state.WriteFileAtomic(d.File(state.SpecFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out := runApp(t, "--config", conf, "ps")
	if code != 0 {
		t.Fatalf("ps: %d %s", code, out)
	}
	if n := strings.Count(out, "\n"); n != 2 || strings.ContainsRune(out, '\x1b') {
		t.Errorf("ps printed %d lines (want header + 1) or an escape:\n%q", n, out)
	}
}
