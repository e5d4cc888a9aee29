package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// VMMExitFile, in the state directory, holds one line: how the VMM ended
// (ExitReason), written by the supervisor as soon as it reaped it. Task
// processes, which reach the guest through the supervisor, read it when
// their connection breaks.
const VMMExitFile = "vmm.exit"

// exitWait bounds how long a task whose connection broke waits for the
// supervisor to record the VMM's end.
const exitWait = 3 * time.Second

// aliveWait bounds how long a broken connection waits for a VMM that is
// still alive to be gone: a VMM that died is reaped within milliseconds.
const aliveWait = 500 * time.Millisecond

// OOMKilledReason is how the VMM ended when the kernel's out-of-memory
// killer of the step's memory cgroup killed it (the driver saw the
// cgroup's oom_kill count grow); the driver adds the limit and the fix.
const OOMKilledReason = "the microVM's VMM was killed by the kernel's out-of-memory killer: the guest and its VMM needed more than the step's memory limit"

// ExitReason renders how the VMM ended, from cmd.Wait's error: "the
// microVM's VMM exited: killed by signal 9 (SIGKILL)". stopped marks an
// end the supervisor caused (Stop, a failed boot).
func ExitReason(err error, stopped bool) string {
	if stopped {
		return "the microVM was stopped (the step is ending)"
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err == nil {
			return "the microVM's VMM exited with status 0 (the guest powered off)"
		}
		return "the microVM's VMM exited: " + err.Error()
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	switch {
	case ok && ws.Signaled():
		sig := ws.Signal()
		msg := fmt.Sprintf("the microVM's VMM exited: killed by signal %d (%s)", int(sig), unix.SignalName(sig))
		if sig == syscall.SIGKILL {
			msg += "; an out-of-memory kill of the step looks the same (see the job's memory limit)"
		}
		return msg
	case ok:
		return fmt.Sprintf("the microVM's VMM exited with status %d", ws.ExitStatus())
	}
	return "the microVM's VMM exited: " + err.Error()
}

// broken reports whether err is a lost connection rather than an answer.
func broken(err error) bool {
	return errors.Is(err, ttrpc.ErrClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE) ||
		errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ENOENT)
}

// VMMExitedError is a task's error once its VMM is gone: Reason says how
// it ended; Err is what the task saw (a closed connection).
type VMMExitedError struct {
	Reason string
	Err    error
	// Stopped is set when the supervisor ended the VMM itself (a stop of
	// the step, or a failure it found, such as a hung guest): the
	// supervisor's own reason, when it had one, is the step's error file.
	Stopped bool
}

func (e *VMMExitedError) Error() string { return e.Reason }
func (e *VMMExitedError) Unwrap() []error {
	return []error{driver.ErrSandboxExited, e.Err}
}

// explain turns err, seen by a task of the sandbox in stateDir, into a
// *VMMExitedError when the VMM is gone: a VMM that is dead (or dies within
// aliveWait) gets the reason its supervisor records in VMMExitFile, waited
// for up to exitWait. Errors of a live VMM, a cancelled ctx and a missing
// command are returned as they are.
func explain(ctx context.Context, stateDir string, err error) error {
	if err == nil || ctx.Err() != nil || errors.Is(err, driver.ErrCommandNotFound) {
		return err
	}
	vmm, perr := state.ReadProc(filepath.Join(stateDir, state.VMMPidFile))
	if perr == nil && vmm.Alive() && !broken(err) {
		return err // the agent's own answer
	}
	start := time.Now()
	for {
		if b, rerr := os.ReadFile(filepath.Join(stateDir, VMMExitFile)); rerr == nil && len(b) > 0 {
			reason := strings.TrimSpace(string(b))
			return &VMMExitedError{Reason: reason, Err: err, Stopped: reason == ExitReason(nil, true)}
		}
		alive := perr == nil && vmm.Alive()
		switch {
		case alive && time.Since(start) > aliveWait:
			return err
		case !alive && time.Since(start) > exitWait:
			if perr != nil {
				return err
			}
			return &VMMExitedError{Reason: fmt.Sprintf("the microVM's VMM (pid %d) is gone and its supervisor recorded no reason (the supervisor itself may have been killed; see launcher.log in the step's state)", vmm.Pid), Err: err}
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}
