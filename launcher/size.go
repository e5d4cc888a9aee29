package launcher

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
)

// GuestCPUs is the vCPU count of the step's guest: Spec.CPUs when set
// (`run --cpus`), else the CPUs process pid may run on (the step's cpuset,
// once the supervisor sits in the step's cgroup), else the count of
// S_STEP_ALLOC_CORES, else 1. pid 0 skips the cpuset.
func GuestCPUs(s *Spec, pid int) int {
	cpus := s.CPUs
	if cpus == 0 && pid > 0 {
		cpus = cgroup.CPUs(pid)
	}
	if n, err := cgroup.CountList(s.Cores); cpus == 0 && err == nil && n > 0 {
		cpus = n
	}
	if cpus == 0 {
		cpus = 1
	}
	return cpus
}

// GuestMemoryMiB sizes the guest of step s with cpus vCPUs (MiB). The
// step's memory on this node is, first found:
//
//  1. S_STEP_ALLOC_MEM (Spec.MemMiB), what Slurm allocated and its memory
//     cgroup enforces;
//  2. the job's --mem (Spec.MemPerNodeMiB, SLURM_MEM_PER_NODE), where Slurm
//     allocates no memory (SelectTypeParameters without CR_*_Memory, where
//     S_STEP_ALLOC_MEM is 0 whatever the job asked: measured on 22.05);
//  3. the job's --mem-per-cpu times cpus (Spec.MemPerCPUMiB,
//     SLURM_MEM_PER_CPU); cpus 0 (not known yet, as in prepare) leaves
//     such a request to be checked at boot;
//  4. none: resources.default_memory_mib is the guest's size.
//
// The limit of the step's memory cgroup (Spec.MemLimitMiB: the smallest
// memory.max on cgroup v2, memory.limit_in_bytes on v1) caps each of
// these: the kernel kills the VMM at that limit, not at the request
// (AllowedRAMSpace under 100, a site's own limits, a default smaller
// than the limit). It never sizes a guest up: where Slurm allocates no
// memory its task/cgroup writes the node's whole RAM as the limit (Slurm's
// mem_limit_in_bytes: "If mem == 0 ... use the total amount of available
// RAM"), and a guest that size would take the node. The guest gets the
// step's memory minus
// resources.vmm_overhead_mib (the VMM counts against the same memory). It
// fails, naming the request and the smallest one that fits, when less than
// resources.min_memory_mib would remain.
func GuestMemoryMiB(s *Spec, cpus int, r config.Resources) (uint64, error) {
	minStep := uint64(r.MinMemoryMiB + r.VMMOverheadMiB)
	fits := func(stepMiB uint64, what, fix string) (uint64, error) {
		if lim := s.MemLimitMiB; lim > 0 && lim < stepMiB {
			stepMiB = lim
			what = fmt.Sprintf("%s, capped by the step's cgroup memory limit of %d MiB,", what, lim)
			fix = "the site raises the step's memory limit (cgroup.conf AllowedRAMSpace, the cgroup's memory.max)"
		}
		if stepMiB < minStep {
			return 0, fmt.Errorf("%s leaves less than %d MiB for the guest after the VMM's %d MiB (microvm.toml resources.min_memory_mib, vmm_overhead_mib); %s",
				what, r.MinMemoryMiB, r.VMMOverheadMiB, fix)
		}
		return stepMiB - uint64(r.VMMOverheadMiB), nil
	}
	switch {
	case s.MemMiB > 0:
		return fits(s.MemMiB, fmt.Sprintf("step memory %d MiB", s.MemMiB), fmt.Sprintf("ask for --mem=%dM or more", minStep))
	case s.MemPerNodeMiB > 0:
		return fits(s.MemPerNodeMiB, fmt.Sprintf("the job's --mem=%dM (SLURM_MEM_PER_NODE)", s.MemPerNodeMiB), fmt.Sprintf("ask for --mem=%dM or more", minStep))
	case s.MemPerCPUMiB > 0 && cpus > 0:
		n := uint64(cpus)
		perCPU := (minStep + n - 1) / n
		return fits(s.MemPerCPUMiB*n,
			fmt.Sprintf("the job's --mem-per-cpu=%dM (SLURM_MEM_PER_CPU) × %d CPUs = %d MiB", s.MemPerCPUMiB, cpus, s.MemPerCPUMiB*n),
			fmt.Sprintf("ask for --mem-per-cpu=%dM or more, or --mem=%dM", perCPU, minStep))
	case s.MemLimitMiB > 0 && s.MemLimitMiB < uint64(r.DefaultMemoryMiB)+uint64(r.VMMOverheadMiB):
		return fits(s.MemLimitMiB, fmt.Sprintf("the step's cgroup memory limit of %d MiB", s.MemLimitMiB), "the site raises the step's memory limit (cgroup.conf AllowedRAMSpace, the cgroup's memory.max)")
	default:
		return uint64(r.DefaultMemoryMiB), nil
	}
}

// ParseSlurmMiB reads a memory size as Slurm writes it in SLURM_MEM_PER_NODE
// and SLURM_MEM_PER_CPU (and accepts for --mem): a whole number of MiB
// (Slurm's "MB"), optionally with a K, M, G or T suffix (K rounds up, as
// Slurm's str_to_mbytes does). Empty is 0: no request; "0" (--mem=0, all
// of the node's memory) is 0 too. name is the variable, for the error.
func ParseSlurmMiB(name, value string) (uint64, error) {
	v := strings.TrimSpace(value)
	if v == "" {
		return 0, nil
	}
	mult, div := uint64(1), uint64(1)
	switch strings.ToUpper(v[len(v)-1:]) {
	case "K":
		div = 1024
	case "M":
	case "G":
		mult = 1024
	case "T":
		mult = 1024 * 1024
	default:
		v += "M"
	}
	n, err := strconv.ParseUint(v[:len(v)-1], 10, 64)
	if err != nil || n > (1<<44)/mult {
		return 0, fmt.Errorf("%s=%q is not a memory size: want MiB as a whole number, optionally with a K, M, G or T suffix (as srun --mem takes)", name, value)
	}
	return (n*mult + div - 1) / div, nil
}

// OverlayMiB sizes the guest's writable tmpfs layer: the configured size,
// but at most half the guest's memory (tmpfs's own default), so that a
// full layer is "No space left on device", not an out-of-memory kill.
func OverlayMiB(guestMiB uint64, r config.Resources) uint64 {
	o := uint64(r.OverlayMiB)
	if half := guestMiB / 2; o > half {
		o = half
	}
	if o < 1 {
		o = 1
	}
	return o
}
