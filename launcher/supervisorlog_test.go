package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// The supervisor's log outlives the step's state in [log] dir (root's
// 0700, files 0600), bounded by keep and max_age; a symlink planted at
// either file is not followed.
func TestSupervisorLogKept(t *testing.T) {
	cfg := config.Defaults()
	cfg.RuntimeDir = t.TempDir()
	cfg.Log = config.Log{Dir: filepath.Join(t.TempDir(), "log"), Keep: 3, MaxAge: config.Duration{Duration: time.Hour}}
	now := time.Now()
	if err := os.MkdirAll(cfg.Log.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// Earlier steps' logs: one too old, three recent (one must go for the
	// new one to fit keep = 3).
	for i, age := range []time.Duration{2 * time.Hour, 30 * time.Minute, 20 * time.Minute, 10 * time.Minute} {
		f := filepath.Join(cfg.Log.Dir, fmt.Sprintf("%d.0.0.log", i+1))
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	id := state.StepID{Job: 9, Step: 2}
	d := state.Dir{Root: cfg.RuntimeDir, ID: id}
	if err := os.MkdirAll(d.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, d.File(state.LauncherLog)); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenSupervisorLog(&cfg, id, now); err == nil {
		t.Fatal("a symlink at launcher.log was followed")
	}
	os.Remove(d.File(state.LauncherLog))
	l, err := OpenSupervisorLog(&cfg, id, now)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(l, "booting")
	l.Close()
	os.RemoveAll(d.Path()) // stop
	b, err := os.ReadFile(l.Kept)
	if err != nil || string(b) != "booting\n" || l.Kept != filepath.Join(cfg.Log.Dir, "9.2.0.log") {
		t.Fatalf("kept log %s: %q %v", l.Kept, b, err)
	}
	if fi, _ := os.Stat(l.Kept); fi.Mode().Perm() != 0o600 {
		t.Errorf("kept log mode %v, want 0600", fi.Mode().Perm())
	}
	if fi, _ := os.Stat(cfg.Log.Dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("log dir mode %v, want 0700", fi.Mode().Perm())
	}
	ents, _ := os.ReadDir(cfg.Log.Dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if got := strings.Join(names, " "); got != "3.0.0.log 4.0.0.log 9.2.0.log" {
		t.Errorf("log dir holds %q, want the 2 newest earlier logs and the new one", got)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("symlink target written: %q", b)
	}
}
