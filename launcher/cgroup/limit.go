package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3"
)

// v1Unlimited: v1 memory.limit_in_bytes at or above this is "no limit"
// (the kernel writes PAGE_COUNTER_MAX pages, 9223372036854771712 on
// amd64).
const v1Unlimited = 1 << 62

// Limit is a memory limit and where it was found.
type Limit struct {
	// Bytes is the limit; 0: none is set on the path.
	Bytes uint64
	// File is the file that set it ("" when none).
	File string
}

// MiB is the limit in MiB, rounded down (0: none).
func (l Limit) MiB() uint64 { return l.Bytes >> 20 }

// MemoryLimit returns the memory limit the kernel enforces on pid: the
// smallest memory.max (v2; "max" is none) or memory.limit_in_bytes (v1,
// hierarchical accounting) on the path from pid's memory cgroup up to its
// hierarchy's root (kernel Documentation/admin-guide/cgroup-v2.rst,
// "memory.max"; cgroup-v1/memory.rst, "Hierarchy support"). A parent's
// file that cannot be read (not delegated) is skipped. Errors:
// /proc/<pid>/cgroup unreadable, a limit file that does not parse.
func MemoryLimit(pid int, r Roots) (Limit, error) {
	r = r.withDefaults()
	base, group, err := memoryGroup(pid, r)
	if err != nil {
		return Limit{}, err
	}
	file := "memory.limit_in_bytes"
	if r.Mode == ModeV2 {
		file = "memory.max"
	}
	if group == "" {
		return Limit{}, nil
	}
	var lim Limit
	for g := path.Clean("/" + group); ; g = path.Dir(g) {
		p := filepath.Join(base, g, file)
		b, err := os.ReadFile(p)
		switch {
		case errors.Is(err, os.ErrNotExist), errors.Is(err, os.ErrPermission):
		case err != nil:
			return Limit{}, fmt.Errorf("read memory limit: %w", err)
		default:
			v := strings.TrimSpace(string(b))
			if v != "max" {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return Limit{}, fmt.Errorf("memory limit %s: %q is not a number of bytes", p, v)
				}
				if n < v1Unlimited && (lim.Bytes == 0 || n < lim.Bytes) {
					lim = Limit{Bytes: n, File: p}
				}
			}
		}
		if g == "/" {
			return lim, nil
		}
	}
}

// OOMKills returns how many processes the kernel's out-of-memory killer
// has killed in pid's memory cgroup and below: oom_kill of memory.events
// on v2, of memory.oom_control on v1 (kernel 4.13 and later; cgroup-v2.rst
// "memory.events", cgroup-v1/memory.rst). A caller that reads it before
// and after a process died can tell a memory-cgroup kill from any other
// SIGKILL. Errors: /proc/<pid>/cgroup or the file unreadable, no oom_kill
// field.
func OOMKills(pid int, r Roots) (uint64, error) {
	r = r.withDefaults()
	base, group, err := memoryGroup(pid, r)
	if err != nil {
		return 0, err
	}
	p := filepath.Join(base, group, "memory.oom_control")
	if r.Mode == ModeV2 {
		p = filepath.Join(base, group, "memory.events")
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, fmt.Errorf("read OOM kills: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: oom_kill %q is not a number", p, v)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("%s has no oom_kill field", p)
}

// memoryGroup returns where pid's memory cgroup is: the hierarchy's mount
// (r.Mount on v2, r.Mount/memory on v1) and the group's path below it
// ("" when pid is in no memory cgroup).
func memoryGroup(pid int, r Roots) (base, group string, err error) {
	v1paths, unified, err := cgroups.ParseCgroupFileUnified(filepath.Join(r.Proc, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", "", fmt.Errorf("read cgroups of pid %d: %w", pid, err)
	}
	if r.Mode == ModeV2 {
		return r.Mount, unified, nil
	}
	return filepath.Join(r.Mount, "memory"), v1paths["memory"], nil
}
