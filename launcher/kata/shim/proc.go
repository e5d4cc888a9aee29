package shim

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BecomeSubreaper makes the calling process a child subreaper
// (prctl(PR_SET_CHILD_SUBREAPER), Linux 3.4+). A shim daemonizes: its
// `start` helper forks the serving shim and exits, and without a subreaper
// the orphan goes to PID 1 (out of reach of the step: nobody reaps it, no
// exit is noticed). With it, the shim becomes the caller's child, which
// Start checks and the Shim reaps.
//
// The setting is process-wide and lasts for the life of the process:
// every orphaned descendant of the process (not only shims) is then
// reparented to it, so the process must reap children it did not start
// (Shim does for its shim; anything else that waits with wait(-1) in the
// same process would steal that exit). Call it once, early, in the
// launcher.
func BecomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become a child subreaper (prctl PR_SET_CHILD_SUBREAPER): %w", err)
	}
	return nil
}

// isSubreaper reports whether the calling process is a child subreaper.
func isSubreaper() (bool, error) {
	var v int32
	if _, _, e := unix.Syscall6(unix.SYS_PRCTL, unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&v)), 0, 0, 0, 0); e != 0 {
		return false, fmt.Errorf("prctl PR_GET_CHILD_SUBREAPER: %w", e)
	}
	return v != 0, nil
}

// procStat is what this package reads of /proc/<pid>/stat.
type procStat struct {
	State     byte   // field 3: R, S, D, Z, ...
	PPid      int    // field 4
	StartTime uint64 // field 22: clock ticks after boot
}

// readProcStat reads /proc/<pid>/stat (proc(5)). An error wrapping
// os.ErrNotExist means no such process.
func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, fmt.Errorf("read the stat of pid %d: %w", pid, err)
	}
	// comm (field 2) is in parentheses and may hold spaces or ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat: %d fields after comm, want 20+", pid, len(f))
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat ppid: %w", pid, err)
	}
	st, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("parse /proc/%d/stat starttime: %w", pid, err)
	}
	return procStat{State: f[0][0], PPid: ppid, StartTime: st}, nil
}

// sameProcess opens a pidfd for pid when pid is still the process that
// started at startTime (clock ticks after boot, /proc/<pid>/stat field 22)
// and has not ended. It returns -1 and no error when that process is gone
// (no such pid, a zombie, or the pid was reused by another process).
//
// The pidfd is opened first and the start time read after: a pidfd names
// one process for good, so if the start time still matches then, the
// pidfd is that process and a signal sent through it cannot reach a
// process that reused the pid.
func sameProcess(pid int, startTime uint64) (int, error) {
	if pid <= 0 {
		return -1, nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("open a pidfd for pid %d: %w", pid, err)
	}
	st, err := readProcStat(pid)
	if errors.Is(err, os.ErrNotExist) || err == nil && (st.StartTime != startTime || st.State == 'Z') {
		unix.Close(fd)
		return -1, nil
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// waitPidfd waits up to timeout for the process behind pidfd to end
// (a pidfd polls readable once the process has exited, zombie or reaped).
// It reports whether it ended.
func waitPidfd(pidfd int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms < 0 {
			ms = 0
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, ms)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

// reapAdopted reaps the zombie children of this process that started in
// [since, before) (clock ticks after boot) and returns how many. They are
// the processes of a sandbox whose shim died first: a shim is a subreaper
// of its container's processes, and when it dies they are reparented to
// this process (the next subreaper up), which must reap them or a runtime
// waiting for them to end (runc delete --force) hangs. Only zombies are
// taken (a dead process's status), and only of that window: a child this
// process started itself after before (the shim's delete) is not touched.
// A child the rest of the launcher started in the window and has not
// waited for yet would lose its status to this (its Wait then fails with
// ECHILD): the launcher starts none while a sandbox runs.
func reapAdopted(since, before uint64) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self, n := os.Getpid(), 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil || st.PPid != self || st.State != 'Z' || st.StartTime < since || st.StartTime >= before {
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			n++
		}
	}
	return n
}

// bootTicks returns the time since boot in clock ticks (USER_HZ, 100 on
// Linux: the unit of /proc/<pid>/stat starttime), rounded down.
func bootTicks() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, fmt.Errorf("read CLOCK_BOOTTIME: %w", err)
	}
	return uint64(ts.Nano()) / (1e9 / userHZ), nil
}

// userHZ is the clock tick of /proc (USER_HZ), 100 on every Linux ABI
// this runs on (sysconf(_SC_CLK_TCK)).
const userHZ = 100
