package cgroup

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Membership is one line of /proc/<pid>/cgroup.
type Membership struct {
	// Controllers is the comma-separated controller list ("" on v2).
	Controllers string
	Path        string
}

// Parse reads the /proc/<pid>/cgroup format ("ID:CONTROLLERS:PATH" lines).
func Parse(r io.Reader) ([]Membership, error) {
	var out []Membership
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("parse cgroup line %q", line)
		}
		out = append(out, Membership{Controllers: parts[1], Path: parts[2]})
	}
	return out, sc.Err()
}

// StepDirName is Slurm's cgroup directory name for a step id: step_<id>, or
// step_batch, step_extern, step_interactive for the special steps (Slurm
// src/plugins/cgroup/common).
func StepDirName(step uint32) string {
	switch step {
	case 0xfffffffb:
		return "step_batch"
	case 0xfffffffc:
		return "step_extern"
	case 0xfffffffa:
		return "step_interactive"
	}
	return "step_" + strconv.FormatUint(uint64(step), 10)
}

// CPUs returns the number of CPUs in the cpuset of pid's cgroup, or 0 when
// it cannot tell (then the caller uses the step's allocation).
func CPUs(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			n, err := CountList(strings.TrimSpace(v))
			if err != nil {
				return 0
			}
			return n
		}
	}
	return 0
}

// CountList counts the members of a Linux/Slurm list such as "0-3,8,10-11".
func CountList(s string) (int, error) {
	n := 0
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, fmt.Errorf("list %q: %q is not a number", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return 0, fmt.Errorf("list %q: %q is not a number", s, hi)
			}
		}
		if b < a {
			return 0, fmt.Errorf("list %q: range %s is reversed", s, part)
		}
		n += b - a + 1
	}
	return n, nil
}
