package qemu

import (
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	for _, c := range []struct {
		name, line string
		state      string
		cpu        time.Duration
		bad        bool
	}{
		{name: "vCPU thread", line: "4242 (CPU 0/TCG) R 4200 4242 4200 0 -1 4194368 120 0 0 0 1234 56 0 0 20 0 4 0 900 1000 100", state: "R", cpu: 12900 * time.Millisecond},
		{name: "name with parentheses", line: "7 (a) b) (c) S 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 5", state: "S", cpu: 70 * time.Millisecond},
		{name: "stopped", line: "9 (qemu-system-x86) T 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5", state: "T"},
		{name: "no name", line: "9 qemu T 1", bad: true},
		{name: "too short", line: "9 (q) R 1 2 3", bad: true},
		{name: "bad time", line: "9 (q) R 1 9 9 0 -1 0 0 0 0 0 x 0 0 0 20 0 1 0 5", bad: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			state, cpu, err := parseStat([]byte(c.line))
			if c.bad {
				if err == nil {
					t.Fatalf("parseStat(%q) = %q, %v; want an error", c.line, state, cpu)
				}
				return
			}
			if err != nil || state != c.state || cpu != c.cpu {
				t.Fatalf("parseStat(%q) = %q, %v, %v; want %q, %v", c.line, state, cpu, err, c.state, c.cpu)
			}
		})
	}
}

func TestDescribeThreads(t *testing.T) {
	before := []threadTime{{TID: 1, Name: "qemu-system-x86", State: "S", CPU: 300 * time.Millisecond}, {TID: 2, Name: "CPU 0/TCG", State: "R", CPU: time.Second}}
	after := []threadTime{{TID: 1, Name: "qemu-system-x86", State: "S", CPU: 300 * time.Millisecond}, {TID: 2, Name: "CPU 0/TCG", State: "R", CPU: 1250 * time.Millisecond}, {TID: 3, Name: "worker", State: "S", CPU: 10 * time.Millisecond}}
	const want = "qemu-system-x86 S 300ms +0ms, CPU 0/TCG R 1250ms +250ms, worker S 10ms +10ms"
	if got := describeThreads(before, after); got != want {
		t.Errorf("describeThreads = %q, want %q", got, want)
	}
}
