package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
)

// Mode is a node's cgroup hierarchy (see the package comment).
type Mode int

// The hierarchies Detect tells apart.
const (
	ModeUnset  Mode = iota // Roots.Mode's zero value: Detect the node's
	ModeNone               // no cgroup hierarchy at /sys/fs/cgroup
	ModeV1                 // legacy: v1 controllers only
	ModeHybrid             // v1 controllers plus cgroup2 at /sys/fs/cgroup/unified
	ModeV2                 // unified: cgroup2 at /sys/fs/cgroup
)

func (m Mode) String() string {
	switch m {
	case ModeV1:
		return "v1"
	case ModeHybrid:
		return "hybrid"
	case ModeV2:
		return "v2"
	case ModeUnset:
		return "unset"
	}
	return "none"
}

// Describe says what m is in words, for config check and logs.
func (m Mode) Describe() string {
	switch m {
	case ModeV1:
		return "cgroup v1 (legacy: one hierarchy per controller under /sys/fs/cgroup)"
	case ModeHybrid:
		return "hybrid (cgroup v1 controllers, cgroup2 at /sys/fs/cgroup/unified)"
	case ModeV2:
		return "cgroup v2 (unified hierarchy at /sys/fs/cgroup)"
	}
	return "no cgroup file system at /sys/fs/cgroup"
}

// Detect returns the node's hierarchy (containerd cgroups.Mode, which
// statfs(2)s /sys/fs/cgroup and /sys/fs/cgroup/unified).
func Detect() Mode {
	switch cgroups.Mode() {
	case cgroups.Legacy, cgroups.Hybrid:
		// The library calls any /sys/fs/cgroup that is not cgroup2
		// legacy, an empty directory too: a v1 node has at least one
		// hierarchy mounted below it.
		if m, _ := filepath.Glob("/sys/fs/cgroup/*/cgroup.procs"); len(m) == 0 {
			return ModeNone
		}
		if cgroups.Mode() == cgroups.Hybrid {
			return ModeHybrid
		}
		return ModeV1
	case cgroups.Unified:
		return ModeV2
	}
	return ModeNone
}

// SlurmControllers are the controllers Slurm's cgroup plugins constrain a
// step with (cgroup.conf(5): ConstrainCores, ConstrainRAMSpace,
// ConstrainDevices; proctrack/cgroup's freezer on v1).
var SlurmControllers = []string{"cpuset", "memory", "devices", "freezer"}

// ErrHybridController is returned (wrapped) by EnterStep and
// HybridControllers' callers when a hybrid node has a controller Slurm
// needs on its unified side.
var ErrHybridController = errors.New("hybrid cgroup hierarchy with a Slurm controller on the unified side")

// HybridControllers lists the SlurmControllers that a hybrid node enables
// on its unified hierarchy (unified/cgroup.controllers below root,
// normally /sys/fs/cgroup): none may be, or Slurm's cgroup/v1 cannot
// constrain them. Errors: the file unreadable.
func HybridControllers(root string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(root, "unified", "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("read the unified hierarchy's controllers: %w", err)
	}
	var out []string
	for _, c := range strings.Fields(string(b)) {
		if slices.Contains(SlurmControllers, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// Move is one placement EnterStep made.
type Move struct {
	// Controller is the v1 subsystem ("freezer"), or "unified" on v2.
	Controller string
	// Path is the cgroup moved into, below its hierarchy's mount.
	Path string
}

// Placement is where EnterStep left the process.
type Placement struct {
	Mode  Mode
	Moves []Move
	// Outside names each hierarchy in which the process is not in the
	// step afterwards, as "controller=path" (v1: only the SlurmControllers
	// it is in at all; v2: "unified=path"). Empty: the process, and every
	// child it starts from now on, is in the step.
	Outside []string
}

// Roots say where EnterStep finds the hierarchies; the zero value is the
// node's own.
type Roots struct {
	// Mount is where the hierarchies are mounted ("" = /sys/fs/cgroup).
	Mount string
	// Proc is the proc file system ("" = /proc).
	Proc string
	// V1 lists the v1 subsystems (nil = cgroup1.Default, from mountinfo).
	V1 cgroup1.Hierarchy
	// Mode overrides Detect (tests with a fake tree); ModeUnset detects.
	Mode Mode
}

func (r Roots) withDefaults() Roots {
	if r.Mount == "" {
		r.Mount = "/sys/fs/cgroup"
	}
	if r.Proc == "" {
		r.Proc = "/proc"
	}
	if r.V1 == nil {
		r.V1 = cgroup1.Default
	}
	if r.Mode == ModeUnset {
		r.Mode = Detect()
	}
	return r
}

// EnterStep moves pid into step's cgroups of job as the package comment
// describes and returns what it did. Errors: /proc/<pid>/cgroup
// unreadable, a move the kernel refused, ErrHybridController.
func EnterStep(pid int, job, step uint32, r Roots) (Placement, error) {
	r = r.withDefaults()
	p := Placement{Mode: r.Mode}
	procFile := filepath.Join(r.Proc, strconv.Itoa(pid), "cgroup")
	v1paths, unified, err := cgroups.ParseCgroupFileUnified(procFile)
	if err != nil {
		return p, fmt.Errorf("read cgroups of pid %d: %w", pid, err)
	}
	switch r.Mode {
	case ModeV2:
		return enterV2(p, pid, job, step, unified, r)
	case ModeV1, ModeHybrid:
		if r.Mode == ModeHybrid {
			bad, err := HybridControllers(r.Mount)
			if err != nil {
				return p, err
			}
			if len(bad) > 0 {
				return p, fmt.Errorf("%w: %s enabled in %s: Slurm's cgroup/v1 cannot constrain the step with them; boot the node with every controller on one hierarchy (systemd.unified_cgroup_hierarchy=1 for cgroup v2, or keep them off the unified one)",
					ErrHybridController, strings.Join(bad, ", "), filepath.Join(r.Mount, "unified", "cgroup.controllers"))
			}
		}
		return enterV1(p, pid, job, step, v1paths, r)
	}
	p.Outside = append(p.Outside, "none=no cgroup hierarchy at "+r.Mount)
	return p, nil
}

// enterV1 moves pid into step_S of every v1 hierarchy in which it sits at
// job level and whose step directory exists.
func enterV1(p Placement, pid int, job, step uint32, paths map[string]string, r Roots) (Placement, error) {
	jobDir := "job_" + strconv.FormatUint(uint64(job), 10)
	stepPath := func(n cgroup1.Name) (string, error) {
		cur, ok := paths[string(n)]
		if !ok {
			cur, ok = paths["name="+string(n)]
		}
		if !ok || path.Base(cur) != jobDir {
			return "", cgroup1.ErrControllerNotActive
		}
		return path.Join(cur, StepDirName(step)), nil
	}
	allowAny := func(c *cgroup1.InitConfig) error { c.InitCheck = cgroup1.AllowAny; return nil }
	cg, err := cgroup1.Load(stepPath, cgroup1.WithHierarchy(r.V1), allowAny)
	switch {
	case errors.Is(err, cgroup1.ErrMountPointNotExist):
		p.Outside = append(p.Outside, "none=no cgroup v1 hierarchy mounted")
		return p, nil
	case errors.Is(err, cgroup1.ErrCgroupDeleted):
		// No hierarchy at job level with a step directory: nothing moves.
	case err != nil:
		return p, fmt.Errorf("load step cgroups: %w", err)
	default:
		if err := cg.AddProc(uint64(pid)); err != nil {
			return p, fmt.Errorf("move pid %d into step %d of job %d: %w", pid, step, job, err)
		}
		for _, s := range cg.Subsystems() {
			sp, _ := stepPath(s.Name())
			p.Moves = append(p.Moves, Move{Controller: string(s.Name()), Path: sp})
		}
	}
	// What the process is in now: the moved paths replace the old ones.
	for _, c := range SlurmControllers {
		cur, ok := paths[c]
		if !ok {
			continue
		}
		for _, m := range p.Moves {
			if m.Controller == c {
				cur = m.Path
			}
		}
		if !InStep(cur, job, step) {
			p.Outside = append(p.Outside, c+"="+cur)
		}
	}
	return p, nil
}

// enterV2 leaves a process that is in the step where it is, and moves one
// at job level into the step's "slurm" leaf when Slurm made it.
func enterV2(p Placement, pid int, job, step uint32, group string, r Roots) (Placement, error) {
	if InStep(group, job, step) {
		return p, nil
	}
	if jobPath, ok := jobAncestor(group, job); ok && !strings.HasPrefix(strings.TrimPrefix(group, jobPath), "/step_") {
		leaf := path.Join(jobPath, StepDirName(step), "slurm")
		if fi, err := os.Stat(filepath.Join(r.Mount, leaf)); err == nil && fi.IsDir() {
			m, err := cgroup2.Load(leaf, cgroup2.WithMountpoint(r.Mount))
			if err != nil {
				return p, fmt.Errorf("load step cgroup %s: %w", leaf, err)
			}
			if err := m.AddProc(uint64(pid)); err != nil {
				return p, fmt.Errorf("move pid %d into %s: %w", pid, leaf, err)
			}
			p.Moves = append(p.Moves, Move{Controller: "unified", Path: leaf})
			return p, nil
		}
	}
	p.Outside = append(p.Outside, "unified="+group)
	return p, nil
}

// jobAncestor returns the part of group that ends in "/job_<job>".
func jobAncestor(group string, job uint32) (string, bool) {
	want := "job_" + strconv.FormatUint(uint64(job), 10)
	parts := strings.Split(group, "/")
	for i, part := range parts {
		if part == want {
			return strings.Join(parts[:i+1], "/"), true
		}
	}
	return "", false
}
