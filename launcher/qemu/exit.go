package qemu

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// recordExit writes the VMM's end into the state directory.
func (s *sandbox) recordExit(err error) {
	msg := control.ExitReason(err, s.stopping.Load())
	if !s.stopping.Load() && s.oomKnown {
		if n, cerr := cgroup.OOMKills(os.Getpid(), cgroup.Roots{}); cerr == nil && n > s.oomBase {
			msg = control.OOMKilledReason
			if lim, lerr := cgroup.MemoryLimit(os.Getpid(), cgroup.Roots{}); lerr == nil && lim.Bytes > 0 {
				msg += fmt.Sprintf(" (%d MiB)", lim.MiB())
			}
			msg += "; ask for more --mem"
		}
	}
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
