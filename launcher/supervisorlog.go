package launcher

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// SupervisorLog is where the supervisor of one step logs: launcher.log in
// the step's state (read by --microvm-debug, removed with the state at
// stop) and, when [log] dir is set, the admin's copy
// <dir>/<job>.<step>.<restart>.log (root 0600 in a root 0700 directory),
// which outlives the step and is pruned by [log] keep and max_age.
type SupervisorLog struct {
	io.Writer
	files []*os.File
	// Kept is the admin's copy ("" when none).
	Kept string
}

// Close closes both files.
func (s *SupervisorLog) Close() error {
	var errs []error
	for _, f := range s.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// OpenSupervisorLog opens the log files of step id, appending; neither is
// opened through a symlink. A failure of the admin's copy is returned
// with the usable state log (the step must not fail for it); a failure of
// the state log fails (the step's state is not usable).
func OpenSupervisorLog(c *config.Config, id state.StepID, now time.Time) (*SupervisorLog, error) {
	d := state.Dir{Root: c.RuntimeDir, ID: id}
	sf, err := state.OpenFile(d.File(state.LauncherLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open supervisor log: %w", err)
	}
	s := &SupervisorLog{Writer: sf, files: []*os.File{sf}}
	if c.Log.Dir == "" {
		return s, nil
	}
	kept := filepath.Join(c.Log.Dir, id.String()+".log")
	var kf *os.File
	err = state.MakeDir(c.Log.Dir, 0o700)
	if err == nil {
		pruneLogs(c.Log, now)
		kf, err = state.OpenFile(kept, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	}
	if err != nil {
		return s, fmt.Errorf("keep supervisor log in log.dir: %w", err)
	}
	s.files = append(s.files, kf)
	s.Writer = io.MultiWriter(sf, kf)
	s.Kept = kept
	return s, nil
}

// pruneLogs removes kept logs older than MaxAge, then the oldest beyond
// Keep. Errors are ignored: pruning is retried at every step start.
func pruneLogs(l config.Log, now time.Time) {
	ents, err := os.ReadDir(l.Dir)
	if err != nil {
		return
	}
	type logFile struct {
		name string
		mod  time.Time
	}
	var logs []logFile
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".log") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if l.MaxAge.Duration > 0 && now.Sub(fi.ModTime()) > l.MaxAge.Duration {
			_ = os.Remove(filepath.Join(l.Dir, e.Name()))
			continue
		}
		logs = append(logs, logFile{e.Name(), fi.ModTime()})
	}
	if l.Keep <= 0 || len(logs) < l.Keep {
		return
	}
	slices.SortFunc(logs, func(a, b logFile) int { return a.mod.Compare(b.mod) })
	// Room for the one about to be written.
	for _, f := range logs[:len(logs)-l.Keep+1] {
		_ = os.Remove(filepath.Join(l.Dir, f.name))
	}
}
