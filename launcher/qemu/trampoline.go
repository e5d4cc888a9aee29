package qemu

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"

	"golang.org/x/sys/unix"
)

// TrampolineArg, as the first argument of the launcher binary, makes it
// the VMM's trampoline (Trampoline): `slurm-microvm __vmm-exec QEMU ARGS...`.
const TrampolineArg = "__vmm-exec"

// vmmBlocked are the signals the VMM never receives: every signal whose
// default action ends a process and that Slurm may send to every process
// of a step (proctrack's container signal: scancel [-s SIG], the time
// limit, --signal, srun's forwarded Ctrl-C). They are the workload's, and
// the task forwards them into the guest. Not blocked: SIGKILL (KillWait,
// stop), SIGUSR1 (QEMU's own vCPU kick), the synchronous faults (SEGV,
// BUS, FPE, ILL, SYS, TRAP: a blocked one kills anyway, and debuggers
// need TRAP) and SIGPIPE (QEMU ignores it). abort(3) unblocks ABRT itself.
var vmmBlocked = []unix.Signal{unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR2,
	unix.SIGALRM, unix.SIGPWR, unix.SIGVTALRM, unix.SIGPROF, unix.SIGXCPU, unix.SIGXFSZ, unix.SIGSTKFLT, unix.SIGABRT}

// Trampoline blocks vmmBlocked in the calling thread and execs argv
// (argv[0] an absolute path) in place of the process, so that the VMM
// starts with them blocked: a signal mask survives execve(2) and QEMU
// unblocks none of them (it installs handlers for TERM, INT and HUP, but
// a blocked signal stays pending). It returns only if the exec failed,
// with that error.
//
// Design decision: a blocked mask through an exec of the launcher itself,
// not ignoring the signals (QEMU installs its own handlers, which replace
// an inherited SIG_IGN) and not moving the VMM out of the step's cgroups
// (its memory must count against the step and Slurm must be able to kill
// it with the step). Go's os/exec resets the child's signal mask, hence
// the extra exec: it costs about a millisecond.
func Trampoline(argv []string) error {
	if len(argv) == 0 {
		return fmt.Errorf("%s: no VMM to run", TrampolineArg)
	}
	// Until the mask is set the Go runtime would end the process on
	// them; ignored dispositions also survive the exec.
	sigs := make([]os.Signal, len(vmmBlocked))
	for i, s := range vmmBlocked {
		sigs[i] = s
	}
	signal.Ignore(sigs...)
	runtime.LockOSThread()
	var set unix.Sigset_t
	for _, s := range vmmBlocked {
		set.Val[(s-1)/64] |= 1 << ((uint(s) - 1) % 64)
	}
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &set, nil); err != nil {
		return fmt.Errorf("%s: block signals: %w", TrampolineArg, err)
	}
	err := unix.Exec(argv[0], argv, os.Environ())
	return fmt.Errorf("%s: exec %s: %w", TrampolineArg, argv[0], err)
}
