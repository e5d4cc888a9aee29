package qemu

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// diagnoseSample is how long Diagnose watches the VMM's threads: long
// enough for a running vCPU to take CPU time at the kernel's tick.
const diagnoseSample = 250 * time.Millisecond

// userHZ is the unit of utime and stime in /proc/<pid>/task/<tid>/stat
// (proc(5): clock ticks, sysconf(_SC_CLK_TCK), which Linux fixes at
// USER_HZ = 100 in its ABI on every architecture).
const userHZ = 100

// Diagnose describes the VMM for the supervisor's log when its guest no
// longer answers (driver.Diagnoser): each thread by its QEMU name
// (debug-threads=on) with its scheduler state and the CPU time it took,
// in ms, in total and within a sample of diagnoseSample — vCPUs that run
// point at a guest that spins or is starved, vCPUs that sleep at a guest
// that waits or at an agent that is stuck — then the guest console's last
// lines. Best effort: what cannot be read is said in the text.
func (s *sandbox) Diagnose() string {
	pid := s.Pid()
	before, err := threadTimes(pid)
	if err != nil {
		return fmt.Sprintf("VMM pid %d: %v; guest console: %s", pid, err, s.consoleTail())
	}
	time.Sleep(diagnoseSample)
	after, err := threadTimes(pid)
	if err != nil {
		return fmt.Sprintf("VMM pid %d: %v; guest console: %s", pid, err, s.consoleTail())
	}
	return fmt.Sprintf("VMM pid %d threads (state, CPU ms, ms in the last %s): %s; guest console: %s",
		pid, diagnoseSample, describeThreads(before, after), s.consoleTail())
}

// threadTime is one VMM thread's name, state and CPU time.
type threadTime struct {
	TID   int
	Name  string
	State string
	CPU   time.Duration
}

// threadTimes reads every thread of pid: its name (comm) and, from its
// stat, its state and user+system CPU time (proc(5)). Errors: the VMM is
// gone.
func threadTimes(pid int) ([]threadTime, error) {
	threads, err := Threads(pid)
	if err != nil {
		return nil, err
	}
	var out []threadTime
	for _, t := range threads {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/stat", pid, t.TID))
		if err != nil {
			continue // the thread ended since the listing
		}
		state, cpu, err := parseStat(b)
		if err != nil {
			continue
		}
		out = append(out, threadTime{TID: t.TID, Name: t.Name, State: state, CPU: cpu})
	}
	return out, nil
}

// parseStat returns the state (field 3) and utime+stime (fields 14 and
// 15, in clock ticks) of a /proc/<pid>/task/<tid>/stat line (proc(5)).
// The name (field 2) is in parentheses and may hold spaces and
// parentheses ("CPU 0/TCG"), so fields are counted after its last ')'.
// Errors: a line that does not have these fields.
func parseStat(b []byte) (state string, cpu time.Duration, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", 0, fmt.Errorf("stat %q: no name in parentheses", b)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return "", 0, fmt.Errorf("stat %q: %d fields after the name, want at least 13", b, len(f))
	}
	var ticks uint64
	for _, s := range f[11:13] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return "", 0, fmt.Errorf("stat %q: CPU time %q: %w", b, s, err)
		}
		ticks += n
	}
	return f[0], time.Duration(ticks) * time.Second / userHZ, nil
}

// describeThreads is "CPU 0/TCG R 1200ms +240ms, ..." for the threads of
// after, with their CPU time since before (a thread new in after counts
// from 0).
func describeThreads(before, after []threadTime) string {
	prev := map[int]time.Duration{}
	for _, t := range before {
		prev[t.TID] = t.CPU
	}
	parts := make([]string, 0, len(after))
	for _, t := range after {
		parts = append(parts, fmt.Sprintf("%s %s %dms +%dms", t.Name, t.State, t.CPU.Milliseconds(), (t.CPU-prev[t.TID]).Milliseconds()))
	}
	return strings.Join(parts, ", ")
}
