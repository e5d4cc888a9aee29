package qemu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// recordExit writes the VMM's end into the state directory.
func (s *sandbox) recordExit(err error) {
	msg := control.ExitReason(err, s.stopping.Load())
	if !s.stopping.Load() && s.oomKnown && killedBy(err, syscall.SIGKILL) {
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

// killedBy says whether cmd.Wait's err is the process's death by sig.
func killedBy(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// taskOOMScore gives the VMM (pid) the kernel OOM standing of the step's
// tasks: oom_score_adj 0. slurmstepd runs at -1000 (never chosen by the
// OOM killer) and resets each task to 0 before its exec; the supervisor
// is forked from slurmstepd and keeps -1000 (it holds the clean-up), so
// the VMM it starts would inherit -1000 and could never be the one killed
// when the step passes --mem: on the cgroup v2 node the kernel killed a
// 10 MiB exec relay instead and the VMM went on holding the memory
// (test/cgroupv2). Root writes it, so the job's user, as whom the VMM
// runs, cannot lower it again (CAP_SYS_RESOURCE).
func taskOOMScore(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte("0"), 0); err != nil {
		return fmt.Errorf("reset the VMM's oom_score_adj: %w", err)
	}
	return nil
}
