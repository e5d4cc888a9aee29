package qemu

import (
	"path/filepath"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// recordExit writes the VMM's end into the state directory.
func (s *sandbox) recordExit(err error) {
	msg := control.ExitReason(err, s.stopping.Load())
	if !s.stopping.Load() {
		if t := strings.TrimSpace(lastLines(tailFile(filepath.Join(s.cfg.StateDir, vmmLog)), 1)); t != "" {
			msg += "; qemu: " + t
		}
		s.log.Error("VMM exited", "reason", msg)
	}
	if werr := state.WriteFileAtomic(filepath.Join(s.cfg.StateDir, control.VMMExitFile), []byte(msg+"\n"), 0o644); werr != nil {
		s.log.Warn("record VMM exit", "err", werr)
	}
}
