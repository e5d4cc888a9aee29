package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrNoCpuset is returned by Cpuset when the process sits in no cpuset
// cgroup (no cpuset hierarchy on v1, no cpuset controller enabled for its
// cgroup on v2).
var ErrNoCpuset = errors.New("no cpuset cgroup")

// CpusetCPUs is the cpuset cgroup of a process and the CPUs it may use.
type CpusetCPUs struct {
	// Path is the cgroup's path in its hierarchy ("/slurm/uid_1000/
	// job_42/step_0"; "/" at the root).
	Path string
	// List is the effective CPU list as the kernel writes it ("0-3,8").
	List string
	// File is the file List was read from.
	File string
	// Mems is the memory nodes the cgroup's tasks may allocate from, as
	// the kernel writes them ("0", "0-1"): v1 cpuset.effective_mems (or
	// cpuset.mems), v2 cpuset.mems.effective. "" when unreadable.
	Mems string
}

// Cpuset reads the effective CPUs of the cpuset cgroup that ms (a
// process's /proc/<pid>/cgroup, Parse) names, below mountRoot (normally
// /sys/fs/cgroup):
//
//   - cgroup v1: the hierarchy whose controllers include "cpuset",
//     mounted at mountRoot/<controllers>; its cpuset.effective_cpus (the
//     CPUs the kernel lets its tasks use: cpuset.cpus narrowed by the
//     parents and by hotplug), or cpuset.cpus on kernels without it;
//   - cgroup v2 (the "0::" line, unified at mountRoot): cpuset.cpus.effective
//     of the cgroup (the file exists where the cpuset controller is
//     enabled for it).
//
// A v1 cpuset wins over a v2 line (hybrid hosts put the controller on v1).
// Errors: ErrNoCpuset (wrapped) when neither is found, an unreadable file.
func Cpuset(ms []Membership, mountRoot string) (CpusetCPUs, error) {
	var v2 *Membership
	for i, m := range ms {
		if m.Controllers == "" {
			v2 = &ms[i]
			continue
		}
		for _, c := range strings.Split(m.Controllers, ",") {
			if c != "cpuset" {
				continue
			}
			dir := filepath.Join(mountRoot, firstController(m.Controllers), m.Path)
			for i, name := range []string{"cpuset.effective_cpus", "cpuset.cpus"} {
				if c, err := readCpuset(dir, name, m.Path); !errors.Is(err, os.ErrNotExist) {
					c.Mems = readMems(dir, []string{"cpuset.effective_mems", "cpuset.mems"}[i:]...)
					return c, err
				}
			}
			return CpusetCPUs{}, fmt.Errorf("%w: %s has no cpuset.effective_cpus or cpuset.cpus", ErrNoCpuset, dir)
		}
	}
	if v2 != nil {
		c, err := readCpuset(filepath.Join(mountRoot, v2.Path), "cpuset.cpus.effective", v2.Path)
		c.Mems = readMems(filepath.Join(mountRoot, v2.Path), "cpuset.mems.effective")
		if errors.Is(err, os.ErrNotExist) {
			return CpusetCPUs{}, fmt.Errorf("%w: the cpuset controller is not enabled for %s (no %s)", ErrNoCpuset, v2.Path, c.File)
		}
		return c, err
	}
	return CpusetCPUs{}, fmt.Errorf("%w: the process is in no cpuset hierarchy and no unified cgroup", ErrNoCpuset)
}

func readCpuset(dir, name, path string) (CpusetCPUs, error) {
	c := CpusetCPUs{Path: path, File: filepath.Join(dir, name)}
	b, err := os.ReadFile(c.File)
	if err != nil {
		return c, err
	}
	c.List = strings.TrimSpace(string(b))
	return c, nil
}

// readMems returns the first of the files names in dir that reads, trimmed;
// "" when none does.
func readMems(dir string, names ...string) string {
	for _, n := range names {
		if b, err := os.ReadFile(filepath.Join(dir, n)); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return ""
}

// ProcessCpuset is Cpuset for process pid, read from /proc/<pid>/cgroup.
func ProcessCpuset(pid int, mountRoot string) (CpusetCPUs, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return CpusetCPUs{}, fmt.Errorf("read cgroups of pid %d: %w", pid, err)
	}
	defer f.Close()
	ms, err := Parse(f)
	if err != nil {
		return CpusetCPUs{}, err
	}
	return Cpuset(ms, mountRoot)
}

// InStep says whether a cgroup path is step's of job, or below it, in
// Slurm's layout (".../job_<job>/step_<step>[/...]": v1's step directory,
// v2's ".../step_<step>/slurm" and task directories).
func InStep(path string, job, step uint32) bool {
	want := fmt.Sprintf("job_%d/%s", job, StepDirName(step))
	p := "/" + strings.Trim(path, "/") + "/"
	return strings.Contains(p, "/"+want+"/")
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
