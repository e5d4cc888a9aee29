package launcher

import (
	"context"
	"errors"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// A stop that runs before the supervisor recorded itself wins: the
// supervisor, starting right after the stop read the (absent) records and
// before it removed the state, must not go on (no scratch directory, no
// image conversion, no record of itself). The previous code recorded the
// supervisor there and went on to create the scratch directory and
// convert the image, with nobody left to stop it.
func TestStopBeforeSupervisorRecords(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Root(t, "a root-owned scratch base")
	}
	scratchRoot, err := os.MkdirTemp("/run", "smv-launcher-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scratchRoot) })
	cfg := config.Defaults()
	cfg.RuntimeDir = t.TempDir()
	cfg.CacheDir = t.TempDir()
	cfg.Log.Dir = ""
	cfg.Mounts.ScratchBase = filepath.Join(scratchRoot, "scratch")
	l := &Launcher{Config: &cfg}
	// A job id no cgroup of this host has: entering its cgroups is a no-op.
	s := &Spec{ID: state.StepID{Job: 4000000001, Step: 0}, UID: 0, GID: 0, User: "root",
		Image: filepath.Join(t.TempDir(), "no-such-image.tar"), MemMiB: 2048, LocalTasks: 1}
	if err := l.Prepare(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	d := s.Dir(&cfg)
	scratch := filepath.Join(cfg.Mounts.ScratchBase, s.ID.String())
	var startErr error
	ran := false
	l.afterStopMark = func() {
		ran = true
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		startErr = l.Start(ctx, s.ID)
		if _, err := os.Lstat(scratch); err == nil {
			t.Errorf("the supervisor created scratch %s after the stop began", scratch)
		}
		if _, err := os.Lstat(d.File(state.SupervisorFile)); err == nil {
			t.Error("the supervisor recorded itself after the stop began")
		}
	}
	if err := l.Stop(context.Background(), s.ID); err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatal("Stop never reached the point after its mark")
	}
	if !errors.Is(startErr, state.ErrStopped) {
		t.Fatalf("Start after the stop began: %v, want state.ErrStopped", startErr)
	}
	if _, err := os.Lstat(d.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state left: %v", err)
	}
	// A supervisor that comes even later finds nothing to start.
	l.afterStopMark = nil
	if err := l.Start(context.Background(), s.ID); err == nil {
		t.Error("a supervisor started after the stop finished")
	}
	if _, err := os.Lstat(scratch); err == nil {
		t.Errorf("scratch %s exists after the stop", scratch)
	}
}
