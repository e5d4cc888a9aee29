package guest

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// PendingSignalGrace is how long, from its start, a process may take to
// catch or ignore a signal that reached its task before it existed (while
// the microVM booted). Past it the signal is delivered anyway and its
// default action applies, as it would have on the host to a workload that
// did not handle it. 10 s covers an interpreter's start-up (a Python
// import of a large framework) and stays well below Slurm's KillWait
// (30 s by default), after which SIGKILL ends the task regardless.
const PendingSignalGrace = 10 * time.Second

// pendingPoll is how often a pending signal looks at its process's
// dispositions.
const pendingPoll = 5 * time.Millisecond

// pendingSignals returns the request's pending signals in order, each once
// (a pending standard signal is pending once, as in the kernel), dropping
// numbers out of 1-64.
func pendingSignals(sigs []uint32) []unix.Signal {
	var out []unix.Signal
	seen := map[uint32]bool{}
	for _, n := range sigs {
		if n == 0 || n > 64 || seen[n] {
			continue
		}
		seen[n] = true
		out = append(out, unix.Signal(n))
	}
	return out
}

// queue appends sig behind the process's pending signals and reports true,
// or reports false when none is pending (the caller delivers at once).
func (p *process) queue(sig unix.Signal) bool {
	p.sigMu.Lock()
	defer p.sigMu.Unlock()
	if len(p.pending) == 0 {
		return false
	}
	for _, s := range p.pending {
		if s == sig {
			return true
		}
	}
	p.pending = append(p.pending, sig)
	return true
}

// deliverPending delivers p's pending signals in order: each as soon as p
// catches or ignores it (its handler is installed: a shell's trap ran), or
// at once when its default action is to ignore or continue, or when the
// grace from start has passed; it stops when p exits.
func (s *Service) deliverPending(p *process, start time.Time) {
	grace := s.opts.PendingSignalGrace
	if grace <= 0 {
		grace = PendingSignalGrace
	}
	deadline := start.Add(grace)
	for {
		p.sigMu.Lock()
		if len(p.pending) == 0 {
			p.sigMu.Unlock()
			return
		}
		sig := p.pending[0]
		p.sigMu.Unlock()
	wait:
		for !defaultIgnored(sig) && time.Now().Before(deadline) {
			if handled, err := handles(p.pid, sig); err != nil || handled {
				break // err: the process is gone
			}
			select {
			case <-p.exited:
				break wait
			case <-time.After(pendingPoll):
			}
		}
		select {
		case <-p.exited:
			p.sigMu.Lock()
			p.pending = nil
			p.sigMu.Unlock()
			return
		default:
		}
		// Removed under the lock before the kill: a Signal call that
		// finds the queue empty delivers at once, after this one.
		p.sigMu.Lock()
		p.pending = p.pending[1:]
		if err := signalTask(p.pid, sig); err != nil && err != unix.ESRCH {
			s.log.Warn("deliver pending signal", "id", p.id, "signal", sig, "err", err)
		}
		p.sigMu.Unlock()
		s.log.Info("pending signal delivered", "id", p.id, "signal", sig.String(), "after_ms", time.Since(start).Milliseconds())
	}
}

// signalTask sends sig to every process of the task whose first process
// is pid: its process group (the agent starts each process as a session
// leader, so its children share its group unless they leave it), or pid
// alone once the group is gone. Slurm signals a step the same way on the
// host: scancel, the time limit and srun's forwarded signals reach every
// process of the step (proctrack's container signal), so a shell's
// `sleep` ends at once and its trap runs then, not when the sleep would
// have ended.
func signalTask(pid int, sig unix.Signal) error {
	if err := unix.Kill(-pid, sig); err != unix.ESRCH {
		return err
	}
	return unix.Kill(pid, sig)
}

// defaultIgnored reports whether sig's default action leaves a process
// running (ignore or continue), so waiting for a handler buys nothing.
func defaultIgnored(sig unix.Signal) bool {
	switch sig {
	case unix.SIGCHLD, unix.SIGCONT, unix.SIGURG, unix.SIGWINCH:
		return true
	}
	return false
}

// handles reports whether process pid catches or ignores sig, from the
// SigCgt and SigIgn masks of /proc/PID/status (proc(5)).
func handles(pid int, sig unix.Signal) (bool, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false, err
	}
	defer f.Close()
	bit := uint64(1) << (uint(sig) - 1)
	sc := bufio.NewScanner(f)
	found := 0
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "SigCgt" && k != "SigIgn") {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return false, fmt.Errorf("parse %s of pid %d: %w", k, pid, err)
		}
		if mask&bit != 0 {
			return true, nil
		}
		if found++; found == 2 {
			return false, nil
		}
	}
	return false, sc.Err()
}
