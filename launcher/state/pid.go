package state

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Proc names one process for the rest of its life: a pid alone can be
// reused by an unrelated process once ours is gone, so it is recorded with
// the process's start time (field 22 of /proc/<pid>/stat, clock ticks since
// boot). Teardown signals a recorded process only while both still match.
type Proc struct {
	Pid       int
	StartTime uint64
}

// ProcOf reads the start time of a live pid.
func ProcOf(pid int) (Proc, error) {
	st, err := startTime(pid)
	if err != nil {
		return Proc{}, err
	}
	return Proc{Pid: pid, StartTime: st}, nil
}

func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: split
	// after its last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); start time is field 22.
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Alive reports whether the recorded process still runs (and is not a
// zombie of it).
func (p Proc) Alive() bool {
	if p.Pid <= 0 {
		return false
	}
	st, err := startTime(p.Pid)
	if err != nil || st != p.StartTime {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 && s[i+2] == 'Z' {
		return false
	}
	return true
}

// Signal sends sig to the recorded process if it is still the same one.
// A process that is gone is not an error.
func (p Proc) Signal(sig unix.Signal) error {
	if !p.Alive() {
		return nil
	}
	if err := unix.Kill(p.Pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %s to pid %d: %w", sig, p.Pid, err)
	}
	return nil
}

// WriteProc records the live process pid in file path ("<pid> <starttime>").
func WriteProc(path string, pid int) error {
	p, err := ProcOf(pid)
	if err != nil {
		return fmt.Errorf("record pid %d: %w", pid, err)
	}
	return WriteFileAtomic(path, []byte(fmt.Sprintf("%d %d\n", p.Pid, p.StartTime)), 0o644)
}

// ReadProc reads a file written by WriteProc.
func ReadProc(path string) (Proc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Proc{}, err
	}
	var p Proc
	if _, err := fmt.Sscanf(string(b), "%d %d", &p.Pid, &p.StartTime); err != nil {
		return Proc{}, fmt.Errorf("parse %s: %w", path, err)
	}
	return p, nil
}
