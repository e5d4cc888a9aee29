package placement

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
)

// Roots are where the host's cgroup and sysfs trees are mounted:
// /sys/fs/cgroup and /sys on a host; trees of files in tests.
type Roots struct {
	Cgroup string
	Sys    string
}

// Host is the host's own Roots.
var Host = Roots{Cgroup: "/sys/fs/cgroup", Sys: "/sys"}

// Placement is where a step's sandbox runs on the host.
type Placement struct {
	// CPUs are the host CPUs the step may run on: the process's affinity
	// within its cpuset cgroup's effective CPUs.
	CPUs CPUSet
	// Known says that CPUs are the step's own allocation, so that its
	// vCPUs are pinned to them: the process sits in the step's cpuset
	// (Slurm's task/cgroup with ConstrainCores=yes), or it may run on
	// fewer CPUs than the node has online (task/affinity, taskset, a
	// site's cpuset). Otherwise every step sees the whole node, and
	// pinning would put the first vCPU of every sandbox on the same CPU.
	Known bool
	// Cpuset is the process's cpuset cgroup path ("" when it has none).
	Cpuset string
	// Node is the NUMA node that holds all of CPUs, with memory, when
	// HasNode; a host with one node, or CPUs over several, has none.
	Node    int
	HasNode bool
}

// String is the placement for the supervisor's log.
func (p Placement) String() string {
	s := fmt.Sprintf("cpus %s", p.CPUs)
	if !p.Known {
		s += " (not the step's own: not pinned)"
	}
	if p.HasNode {
		s += fmt.Sprintf(", NUMA node %d", p.Node)
	}
	return s
}

// Of reads the placement of process pid (the supervisor, once in the
// step's cgroups) of step step of job job. Errors: the affinity cannot be
// read, a cpuset or sysfs file is unreadable or malformed, the affinity
// and the cpuset share no CPU.
func Of(pid int, r Roots, job, step uint32) (Placement, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &set); err != nil {
		return Placement{}, fmt.Errorf("read the CPU affinity of pid %d: %w", pid, err)
	}
	var affinity CPUSet
	for cpu := 0; cpu < len(set)*64; cpu++ {
		if set.IsSet(cpu) {
			affinity = append(affinity, cpu)
		}
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return Placement{}, fmt.Errorf("read the cgroups of pid %d: %w", pid, err)
	}
	defer f.Close()
	ms, err := cgroup.Parse(f)
	if err != nil {
		return Placement{}, fmt.Errorf("read the cgroups of pid %d: %w", pid, err)
	}
	p, err := decide(affinity, ms, r, job, step)
	if err != nil {
		return Placement{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return p, nil
}

// decide is Of for a process with that affinity and those cgroups.
func decide(affinity CPUSet, ms []cgroup.Membership, r Roots, job, step uint32) (Placement, error) {
	p := Placement{CPUs: affinity}
	inStep := false
	mems := ""
	switch cs, err := cgroup.Cpuset(ms, r.Cgroup); {
	case errors.Is(err, cgroup.ErrNoCpuset):
	case err != nil:
		return Placement{}, fmt.Errorf("read the cpuset: %w", err)
	default:
		allowed, err := ParseList(cs.List)
		if err != nil {
			return Placement{}, fmt.Errorf("%s: %w", cs.File, err)
		}
		p.Cpuset, mems = cs.Path, cs.Mems
		p.CPUs = p.CPUs.Intersect(allowed)
		inStep = cgroup.InStep(cs.Path, job, step)
	}
	if len(p.CPUs) == 0 {
		return Placement{}, fmt.Errorf("the CPU affinity %s and the cpuset %s share no CPU", affinity, p.Cpuset)
	}
	online, err := readList(filepath.Join(r.Sys, "devices/system/cpu/online"))
	if err != nil {
		return Placement{}, err
	}
	p.Known = inStep || !online.Equal(p.CPUs)
	if p.Node, p.HasNode, err = Node(r.Sys, p.CPUs); err != nil {
		return Placement{}, err
	}
	// The node must be one the cpuset lets the step allocate from, or
	// QEMU's bind (mbind(2)) fails and the step does not boot.
	if p.HasNode && mems != "" {
		allowed, err := ParseList(mems)
		if err != nil {
			return Placement{}, fmt.Errorf("the cpuset's memory nodes %q: %w", mems, err)
		}
		p.HasNode = allowed.Contains(p.Node)
	}
	return p, nil
}

// Node returns the NUMA node that holds every CPU of cpus
// (<sys>/devices/system/node/node<N>/cpulist) and has memory
// (<sys>/devices/system/node/has_memory, where the kernel has it). ok is
// false when the host has fewer than two nodes (memory comes from the one
// node anyway; a kernel without NUMA has no node directory), when cpus
// span nodes, or when their node has no memory of its own. Errors: a
// node's list is unreadable or malformed.
func Node(sys string, cpus CPUSet) (node int, ok bool, err error) {
	dir := filepath.Join(sys, "devices/system/node")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read the NUMA nodes: %w", err)
	}
	var nodes []int
	for _, e := range entries {
		n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "node"))
		if err == nil && strings.HasPrefix(e.Name(), "node") && e.IsDir() {
			nodes = append(nodes, n)
		}
	}
	sort.Ints(nodes)
	if len(nodes) < 2 || len(cpus) == 0 {
		return 0, false, nil
	}
	for _, n := range nodes {
		list, err := readList(filepath.Join(dir, fmt.Sprintf("node%d", n), "cpulist"))
		if err != nil {
			return 0, false, err
		}
		if !cpus.Intersect(list).Equal(cpus) {
			continue
		}
		mem, err := readList(filepath.Join(dir, "has_memory"))
		if errors.Is(err, os.ErrNotExist) {
			return n, true, nil
		}
		if err != nil {
			return 0, false, err
		}
		return n, mem.Contains(n), nil
	}
	return 0, false, nil
}

// VCPUs maps n vCPUs onto cpus: vCPU i runs on cpus[i mod len(cpus)]. One
// vCPU per allocated CPU in the allocation's order while there are enough
// (Slurm allocates a step's CPUs core by core, so consecutive vCPUs share
// a core only where the step has its hyperthreads); more vCPUs than CPUs
// (`run --cpus`) go round robin. nil when cpus is empty.
func VCPUs(n int, cpus CPUSet) []int {
	if len(cpus) == 0 {
		return nil
	}
	out := make([]int, n)
	for i := range out {
		out[i] = cpus[i%len(cpus)]
	}
	return out
}

func readList(path string) (CPUSet, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	c, err := ParseList(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
