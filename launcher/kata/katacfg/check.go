package katacfg

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// AnnotationPrefix is the prefix of Kata's per-sandbox hypervisor settings
// (Kata: KataAnnotationHypervisorPrefix); enable_annotations matches what
// follows it.
const AnnotationPrefix = "io.katacontainers.config.hypervisor."

// The sizing annotations the driver sets on the sandbox container's spec.
const (
	// AnnotationVCPUs is the VM's vCPUs (Kata parses a float; the driver
	// writes an integer).
	AnnotationVCPUs = AnnotationPrefix + "default_vcpus"
	// AnnotationMemory is the VM's RAM in MiB.
	AnnotationMemory = AnnotationPrefix + "default_memory"
)

// MinMemoryMiB is the least default_memory Kata accepts from an annotation
// (Kata's Go runtime: MinHypervisorMemory).
const MinMemoryMiB = 256

// maxPCIePorts is the most root or switch ports Kata gives a QEMU VM
// (Kata's Go runtime: maxPCIeRootPort, maxPCIeSwitchPort).
const maxPCIePorts = 16

// Need is what one step asks of the sandbox. A zero field skips the rules
// that depend on it.
type Need struct {
	// CPUs is the VM's vCPUs (default_vcpus).
	CPUs int
	// MemoryMiB is the guest's RAM in MiB (default_memory).
	MemoryMiB uint64
	// GPUs is the number of PCIe devices cold-plugged: every PCIe
	// function of the step's VFIO groups (Kata gives each one port; a
	// GPU whose IOMMU group holds its audio function counts 2).
	GPUs int
	// FreeMiB reports the free space in MiB of the filesystem holding a
	// directory (StatfsFreeMiB on a node); nil skips the check that the
	// guest's RAM fits where QEMU keeps it.
	FreeMiB func(dir string) (uint64, error)
}

// Problem is one setting of the Kata configuration that keeps a step from
// running as slurm-microvm promises. It is also an error.
type Problem struct {
	// File is the configuration file.
	File string
	// Line is the key's line, else its table's, else 0 (a default
	// applies and neither is in the file).
	Line int
	// Key is the dotted key, e.g. runtime.sandbox_cgroup_only.
	Key string
	// Rule says what is wrong and why it matters.
	Rule string
	// Fix says what to change.
	Fix string
}

// String is "file:line: key: rule; fix: fix" (no ":line" when Line is 0).
func (p Problem) String() string {
	loc := p.File
	if p.Line > 0 {
		loc = fmt.Sprintf("%s:%d", p.File, p.Line)
	}
	return fmt.Sprintf("%s: %s: %s; fix: %s", loc, p.Key, p.Rule, p.Fix)
}

func (p Problem) Error() string { return p.String() }

func (c *Config) problem(key, fix, format string, a ...any) Problem {
	return Problem{File: c.Path, Line: c.line(key), Key: key, Rule: fmt.Sprintf(format, a...), Fix: fix}
}

// Check applies the rules the driver depends on to cfg for a step that
// needs need, and returns every problem found (nil: none). The rules:
//
//   - runtime.sandbox_cgroup_only must be true: otherwise Kata leaves the
//     VMM's helper threads (and virtiofsd) outside linux.cgroupsPath, the
//     step's cgroup, where scancel and --mem do not reach them.
//   - enable_annotations must allow default_vcpus and default_memory: the
//     driver sizes the VM from the allocation through these annotations,
//     and Kata refuses a sandbox with an annotation it does not allow.
//   - shared_fs must carry files (virtio-fs or virtio-9p): the step's root
//     filesystem and shares reach the guest through it.
//   - with GPUs, cold_plug_vfio must be root-port or switch-port (the
//     devices are in the VM from boot, as on a confidential guest),
//     hot_plug_vfio no-port (Kata takes one of the two), and
//     pcie_root_port (pcie_switch_port) at least the number of devices.
//   - with GPUs, runtime.vfio_mode not "vfio": the guest's kernel drives
//     the GPUs ("guest-kernel", Kata's default), not a VFIO node in the
//     container.
//   - the step's vCPUs and memory within default_maxvcpus and
//     default_maxmemory, where those are set.
//   - QEMU with virtio-fs keeps guest RAM as a file in file_mem_backend,
//     /dev/shm when unset: the guest's RAM must fit in that filesystem's
//     free space (need.FreeMiB), or QEMU dies of SIGBUS when the guest
//     touches the page that does not fit.
//
// Invalid regular expressions in enable_annotations are problems too (Kata
// ignores them silently).
func Check(cfg *Config, need Need) []Problem {
	var ps []Problem
	h := &cfg.Hypervisor
	if !cfg.Runtime.SandboxCgroupOnly {
		ps = append(ps, cfg.problem("runtime.sandbox_cgroup_only",
			"set sandbox_cgroup_only = true in [runtime]",
			"is false: Kata then places the VMM's helper threads outside the step's cgroup (linux.cgroupsPath), where scancel and --mem do not reach them"))
	}
	ps = append(ps, cfg.badRegexps()...)
	if missing := cfg.refused(AnnotationVCPUs, AnnotationMemory); len(missing) > 0 {
		ps = append(ps, cfg.annotationsProblem(missing))
	}
	switch fs := cfg.sharedFS(); fs {
	case "virtio-fs", "virtio-9p":
	default:
		rule := fmt.Sprintf("is %q: the step's root filesystem and shares reach the guest through the shared file system", fs)
		if cfg.HypervisorName == "firecracker" {
			rule = "Kata's firecracker has no shared file system (it needs a block-device root filesystem): the step's root filesystem and shares cannot reach the guest"
		}
		if h.ConfidentialGuest {
			rule += " (confidential_guest = true: Kata's confidential configurations pull the image inside the guest instead, which slurm-microvm does not do)"
		}
		ps = append(ps, cfg.problem(cfg.key("shared_fs"), `set shared_fs = "virtio-fs" (with hypervisor qemu or clh)`, "%s", rule))
	}
	if need.GPUs > 0 {
		ps = append(ps, cfg.checkGPUs(need.GPUs)...)
	}
	if need.CPUs > 0 && h.DefaultMaxVCPUs > 0 && uint64(need.CPUs) > uint64(h.DefaultMaxVCPUs) {
		ps = append(ps, cfg.problem(cfg.key("default_maxvcpus"),
			fmt.Sprintf("set default_maxvcpus = 0 (the host's CPUs) or at least %d", need.CPUs),
			"is %d: a step of %d CPUs cannot get a VM of that many vCPUs", h.DefaultMaxVCPUs, need.CPUs))
	}
	if need.MemoryMiB > 0 && h.DefaultMaxMemory > 0 && need.MemoryMiB > h.DefaultMaxMemory {
		ps = append(ps, cfg.problem(cfg.key("default_maxmemory"),
			fmt.Sprintf("set default_maxmemory = 0 (the host's RAM) or at least %d", need.MemoryMiB),
			"is %d MiB: a guest of %d MiB does not fit under it", h.DefaultMaxMemory, need.MemoryMiB))
	}
	if dir, key := cfg.MemoryBackingDir(); dir != "" && need.MemoryMiB > 0 && need.FreeMiB != nil {
		free, err := need.FreeMiB(dir)
		switch {
		case err != nil:
			ps = append(ps, cfg.problem(key, "create the directory, or set file_mem_backend to one that exists",
				"QEMU keeps the guest's RAM in %s, which cannot be examined: %v", dir, err))
		case free < need.MemoryMiB:
			short := need.MemoryMiB - free
			fix := fmt.Sprintf("make /dev/shm at least %d MiB larger (mount -o remount,size=<its size + %d>M /dev/shm; Linux's default is half the RAM), or set file_mem_backend to a directory on a filesystem with room", short, short)
			if dir != "/dev/shm" {
				fix = fmt.Sprintf("make room in %s, or point file_mem_backend at a filesystem with at least %d MiB free", dir, need.MemoryMiB)
			}
			ps = append(ps, cfg.problem(key, fix,
				"QEMU keeps the guest's RAM (%d MiB) as a file in %s, which has %d MiB free: the VM would die of SIGBUS once the guest touches the rest", need.MemoryMiB, dir, free))
		}
	}
	return ps
}

func (c *Config) checkGPUs(n int) []Problem {
	var ps []Problem
	h := &c.Hypervisor
	cold := port(h.ColdPlugVFIO)
	var count uint32
	var countKey string
	switch cold {
	case "root-port":
		count, countKey = h.PCIeRootPort, "pcie_root_port"
	case "switch-port":
		count, countKey = h.PCIeSwitchPort, "pcie_switch_port"
	default:
		why := "leaves VFIO cold-plug off"
		if cold == "bridge-port" {
			why = "plugs devices behind a PCI bridge, where a GPU's large BARs do not fit"
		}
		ps = append(ps, c.problem(c.key("cold_plug_vfio"), `set cold_plug_vfio = "root-port" (or "switch-port")`,
			"is %q, which %s: the step's %d GPU device(s) would not reach the guest", cold, why, n))
	}
	if c.Runtime.VFIOMode == "vfio" {
		ps = append(ps, c.problem("runtime.vfio_mode", `set vfio_mode = "guest-kernel" in [runtime]`,
			`is "vfio": the container would get VFIO group nodes instead of GPUs; the guest's kernel (with the NVIDIA driver slurm-microvm brings) must drive them`))
	}
	if hot := port(h.HotPlugVFIO); hot != "no-port" {
		ps = append(ps, c.problem(c.key("hot_plug_vfio"), `set hot_plug_vfio = "no-port"`,
			"is %q: Kata plugs VFIO devices either before boot (cold_plug_vfio) or after it, not both, and refuses the sandbox", hot))
	}
	if countKey != "" && n <= maxPCIePorts && count < uint32(n) {
		ps = append(ps, c.problem(c.key(countKey), fmt.Sprintf("set %s = %d (or more, at most %d)", countKey, n, maxPCIePorts),
			"is %d: each of the step's %d cold-plugged device(s) takes one port", count, n))
	}
	if n > maxPCIePorts {
		ps = append(ps, c.problem(c.key("cold_plug_vfio"), fmt.Sprintf("give the step at most %d GPU devices per node", maxPCIePorts),
			"Kata gives a VM at most %d PCIe ports: %d device(s) do not fit", maxPCIePorts, n))
	}
	return ps
}

// port is a VFIO plug setting, "" meaning Kata's default no-port.
func port(s string) string {
	if s == "" {
		return "no-port"
	}
	return s
}

// sharedFS is shared_fs as Kata applies it ("" is virtio-fs, the default of
// the hypervisors that share files; firecracker shares none).
func (c *Config) sharedFS() string {
	if c.HypervisorName == "firecracker" {
		return "none"
	}
	if c.Hypervisor.SharedFS == "" {
		return "virtio-fs"
	}
	return c.Hypervisor.SharedFS
}

// MemoryBackingDir is the directory whose filesystem holds the guest's RAM
// as a file, and the key that decides it: file_mem_backend when set, else
// /dev/shm for QEMU with virtio-fs (Kata: setupFileBackedMem). "" when the
// RAM is anonymous memory: another hypervisor (Cloud Hypervisor shares
// guest RAM as a memfd), virtio-9p, or huge pages (hugetlbfs, not checked).
func (c *Config) MemoryBackingDir() (dir, key string) {
	h := &c.Hypervisor
	if c.HypervisorName != "qemu" || h.EnableHugepages {
		return "", ""
	}
	if h.FileMemBackend != "" {
		return h.FileMemBackend, c.key("file_mem_backend")
	}
	if fs := c.sharedFS(); fs == "virtio-fs" || fs == "virtio-fs-nydus" {
		return "/dev/shm", c.key("shared_fs")
	}
	return "", ""
}

// StatfsFreeMiB is the space in MiB an unprivileged writer can still use
// in the filesystem holding dir (statfs(2) f_bavail).
func StatfsFreeMiB(dir string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize) >> 20, nil
}

// allowed reports whether the configuration lets a sandbox carry the
// hypervisor annotation name (Kata: checkAnnotationNameIsValid).
func (c *Config) allowed(name string) bool {
	suffix, ok := strings.CutPrefix(name, AnnotationPrefix)
	if !ok {
		return true
	}
	for _, e := range c.Hypervisor.EnableAnnotations {
		if re, err := regexp.Compile(e); err == nil && re.MatchString(suffix) {
			return true
		}
	}
	return false
}

// refused lists the names the configuration does not allow.
func (c *Config) refused(names ...string) []string {
	var out []string
	for _, n := range names {
		if !c.allowed(n) {
			out = append(out, strings.TrimPrefix(n, AnnotationPrefix))
		}
	}
	return out
}

func (c *Config) annotationsProblem(missing []string) Problem {
	have := make([]string, 0, len(c.Hypervisor.EnableAnnotations)+len(missing))
	for _, e := range c.Hypervisor.EnableAnnotations {
		have = append(have, strconv.Quote(e))
	}
	for _, m := range missing {
		have = append(have, strconv.Quote(m))
	}
	return c.problem(c.key("enable_annotations"),
		fmt.Sprintf("set enable_annotations = [%s]", strings.Join(have, ", ")),
		"does not allow %s: slurm-microvm sizes each step's VM from its allocation through io.katacontainers.config.hypervisor.default_vcpus and default_memory, and Kata refuses a sandbox with an annotation it does not allow",
		strings.Join(missing, " and "))
}

func (c *Config) badRegexps() []Problem {
	var ps []Problem
	for _, e := range c.Hypervisor.EnableAnnotations {
		if _, err := regexp.Compile(e); err != nil {
			ps = append(ps, c.problem(c.key("enable_annotations"), "write it as a Go/RE2 regular expression, or remove it",
				"%q is not a regular expression (%v): Kata ignores it", e, err))
		}
	}
	return ps
}

// Annotations are the sandbox container's sizing annotations for a VM of
// cpus vCPUs and memMiB MiB of RAM. The error is a Problem naming
// enable_annotations when the configuration does not allow them, or says
// which value Kata would refuse (cpus below 1, memMiB below MinMemoryMiB
// or above 4 TiB - 1 MiB, Kata's uint32 of MiB).
func Annotations(cfg *Config, cpus int, memMiB uint64) (map[string]string, error) {
	if cpus < 1 {
		return nil, fmt.Errorf("kata sizing: %d vCPUs: a VM needs at least 1", cpus)
	}
	if memMiB < MinMemoryMiB || memMiB > math.MaxUint32 {
		return nil, fmt.Errorf("kata sizing: %d MiB of guest memory: Kata accepts default_memory from %d to %d MiB", memMiB, MinMemoryMiB, uint64(math.MaxUint32))
	}
	if missing := cfg.refused(AnnotationVCPUs, AnnotationMemory); len(missing) > 0 {
		return nil, cfg.annotationsProblem(missing)
	}
	return map[string]string{
		AnnotationVCPUs:  strconv.Itoa(cpus),
		AnnotationMemory: strconv.FormatUint(memMiB, 10),
	}, nil
}

// Summary is a one-line account of the settings the rules read, for
// `config check`.
func (c *Config) Summary() string {
	h := &c.Hypervisor
	parts := []string{"hypervisor " + c.HypervisorName, "sandbox_cgroup_only = " + strconv.FormatBool(c.Runtime.SandboxCgroupOnly)}
	if len(c.refused(AnnotationVCPUs, AnnotationMemory)) == 0 {
		parts = append(parts, "sizing annotations allowed")
	}
	parts = append(parts, "shared_fs "+c.sharedFS())
	switch cold := port(h.ColdPlugVFIO); cold {
	case "root-port":
		parts = append(parts, fmt.Sprintf("cold_plug_vfio root-port x%d", h.PCIeRootPort))
	case "switch-port":
		parts = append(parts, fmt.Sprintf("cold_plug_vfio switch-port x%d", h.PCIeSwitchPort))
	default:
		parts = append(parts, "cold_plug_vfio "+cold)
	}
	if c.Runtime.StaticSandboxResourceMgmt {
		parts = append(parts, "static_sandbox_resource_mgmt")
	}
	if h.ConfidentialGuest {
		parts = append(parts, "confidential_guest")
	}
	if dir, _ := c.MemoryBackingDir(); dir != "" {
		parts = append(parts, "guest RAM in "+dir)
	}
	return strings.Join(parts, ", ")
}
