// Package cgroup places the sandbox's processes in the step's cgroups.
//
// Slurm (22.05, cgroup v1) starts slurmstepd in the *job's* freezer cgroup
// while cpuset, memory and devices are already step-level when the SPANK
// plugin forks the launcher. A process left in the job freezer escapes
// `scancel` of the step and its memory is not charged to it, so the
// supervisor moves itself into ".../job_J/step_S" of every v1 hierarchy in
// which it sits at job level, before it starts any child: the VMM and every
// helper inherit the step's cgroups, count against --mem and are killed with
// the step (measured: SIGKILLed by scancel in about 20 ms).
//
// On the unified hierarchy (cgroup v2) Slurm puts slurmstepd in
// ".../job_J/step_S/slurm", already inside the step: nothing moves.
package cgroup

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
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

// Move is one planned placement: write the pid into Procs.
type Move struct {
	Controller string
	Procs      string // .../step_S/cgroup.procs
}

// Plan lists the v1 hierarchies in which the process sits at job level
// (path ending in "/job_<job>") and whose step directory exists below
// mountRoot (normally /sys/fs/cgroup).
func Plan(ms []Membership, mountRoot string, job, step uint32) []Move {
	jobDir := "job_" + strconv.FormatUint(uint64(job), 10)
	var moves []Move
	for _, m := range ms {
		if m.Controllers == "" || filepath.Base(m.Path) != jobDir {
			continue
		}
		mount := firstController(m.Controllers)
		dir := filepath.Join(mountRoot, mount, m.Path, StepDirName(step))
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		moves = append(moves, Move{Controller: m.Controllers, Procs: filepath.Join(dir, "cgroup.procs")})
	}
	return moves
}

// firstController maps a v1 controller list to its mount directory name
// ("cpu,cpuacct" is mounted as "cpu,cpuacct"; named hierarchies like
// "name=systemd" as "systemd").
func firstController(c string) string {
	if strings.HasPrefix(c, "name=") {
		return strings.TrimPrefix(c, "name=")
	}
	return c
}

// EnterStep moves pid into the step's cgroups as described in the package
// comment, and returns what it moved (for the log).
func EnterStep(pid int, job, step uint32) ([]Move, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, fmt.Errorf("read cgroups of pid %d: %w", pid, err)
	}
	defer f.Close()
	ms, err := Parse(f)
	if err != nil {
		return nil, err
	}
	moves := Plan(ms, "/sys/fs/cgroup", job, step)
	for _, m := range moves {
		if err := os.WriteFile(m.Procs, []byte(strconv.Itoa(pid)), 0); err != nil {
			return nil, fmt.Errorf("move pid %d into %s: %w", pid, m.Procs, err)
		}
	}
	return moves, nil
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
