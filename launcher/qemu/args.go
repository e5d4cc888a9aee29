package qemu

import (
	"fmt"
	"os"
	"strings"
)

// VMConfig is everything the QEMU command line is built from.
type VMConfig struct {
	Name      string
	Accel     string // "kvm" or "tcg"
	CPUs      int
	MemoryMiB uint64
	Kernel    string // uncompressed vmlinux (PVH entry)
	Initrd    string
	// Cmdline is the complete kernel command line, word by word.
	Cmdline []string
	// RootDisk is the read-only erofs image of the root filesystem.
	RootDisk string
	// ConsoleLog receives the guest's serial console.
	ConsoleLog string
	// AgentFD is the fd number (in QEMU) of the control channel socket.
	AgentFD int
	// FDSets are inherited descriptors QEMU takes by "/dev/fdset/SET"
	// (-add-fd): it dup()s them instead of opening a path, so files the
	// VMM's identity could not open by name (a root-only cache or state
	// directory) are reachable all the same, and only those.
	FDSets  []FDSet
	Seccomp bool
	// PCI selects a q35 machine with virtio-pci devices, for VFIO
	// passthrough; MachineArgs then carry the -M line, the memory backend
	// and the devices (PCIArgs of driver.SandboxConfig.Devices). Else -M
	// microvm.
	PCI         bool
	MachineArgs []string
	// Net is the guest's network device; nil: none.
	Net *NetDevice
	// MemoryNodes bind the guest RAM to these host NUMA nodes (a
	// memory-backend-ram with host-nodes and policy=bind); none: QEMU's
	// plain -m RAM, under the kernel's default policy. On the PCI machine
	// MachineArgs carries the backend (Memory.HostNodes).
	MemoryNodes []int
}

// RAMBackendID is the id of the microvm's memory backend (MemoryNodes).
const RAMBackendID = "ram"

// FDSet is one -add-fd: inherited fd FD in fd set Set.
type FDSet struct{ FD, Set int }

// FDSetPath is the path by which QEMU's qemu_open takes a descriptor of fd
// set set (util/osdep.c; block drives and chardev files open that way).
func FDSetPath(set int) string { return fmt.Sprintf("/dev/fdset/%d", set) }

// SandboxOptions is QEMU's -sandbox (seccomp) setting. QEMU runs as the
// job's identity from its first instruction (the driver execs it with the
// job's credentials; no -runas), so it never needs set*id:
// elevateprivileges=deny as well (measured with QEMU 7.2: with -runas it
// killed QEMU with SIGSYS; without it the guest boots).
const SandboxOptions = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// escape makes s one literal value in a QEMU option string (QEMU splits
// options on ',' and reads ',,' as a literal comma).
func escape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// Args builds the QEMU command line (without the binary). It fails on values
// that no escaping can carry: a newline or NUL in a path.
func Args(c VMConfig) ([]string, error) {
	for what, p := range map[string]string{"kernel": c.Kernel, "initrd": c.Initrd, "root disk": c.RootDisk, "console log": c.ConsoleLog} {
		if p == "" {
			return nil, fmt.Errorf("qemu: no %s given", what)
		}
		if strings.ContainsAny(p, "\n\x00") {
			return nil, fmt.Errorf("qemu: %s path %q contains a newline or NUL", what, p)
		}
	}
	for _, w := range c.Cmdline {
		if strings.ContainsAny(w, " \t\n\x00") || w == "" {
			return nil, fmt.Errorf("qemu: kernel command line word %q is empty or contains whitespace", w)
		}
	}
	if c.CPUs < 1 {
		return nil, fmt.Errorf("qemu: %d vCPUs: need at least 1", c.CPUs)
	}
	if c.MemoryMiB < 64 {
		return nil, fmt.Errorf("qemu: %d MiB of guest memory: need at least 64", c.MemoryMiB)
	}
	cpu := "max"
	accel := "tcg"
	if c.Accel == "kvm" {
		cpu, accel = "host", "kvm"
	}
	if c.PCI && accel != "kvm" {
		return nil, fmt.Errorf("qemu: PCI passthrough needs KVM, and this host runs QEMU under %s (no kvm_intel or kvm_amd loaded)", accel)
	}
	machine := []string{"-M", "microvm,x-option-roms=off,isa-serial=on,rtc=on"}
	if len(c.MemoryNodes) > 0 {
		machine[1] += ",memory-backend=" + RAMBackendID
		machine = append(machine, "-object", fmt.Sprintf("memory-backend-ram,id=%s,size=%dM,%s", RAMBackendID, c.MemoryMiB, hostNodes(c.MemoryNodes)))
	}
	bus := "device" // virtio-mmio
	if c.PCI {
		machine = c.MachineArgs
		bus = "pci"
		cpu = "host,host-phys-bits=on"
	}
	// debug-threads names each vCPU thread "CPU <n>/<accel>" (pin.go).
	args := []string{"-name", "guest=" + escape(c.Name) + ",debug-threads=on"}
	for _, f := range c.FDSets {
		args = append(args, "-add-fd", fmt.Sprintf("fd=%d,set=%d", f.FD, f.Set))
	}
	args = append(args, machine...)
	args = append(args,
		"-accel", accel,
		"-cpu", cpu,
		"-smp", fmt.Sprint(c.CPUs),
		"-m", fmt.Sprintf("%dM", c.MemoryMiB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", c.Kernel,
		"-initrd", c.Initrd,
		"-append", strings.Join(c.Cmdline, " "),
		"-chardev", "file,id=console,append=on,path="+escape(c.ConsoleLog),
		"-serial", "chardev:console",
		"-drive", "id=root,if=none,format=raw,readonly=on,file="+escape(c.RootDisk),
		"-device", "virtio-blk-"+bus+",drive=root",
		"-chardev", fmt.Sprintf("socket,id=agent,fd=%d", c.AgentFD),
		"-device", "virtio-serial-"+bus+",max_ports=2",
		"-device", "virtserialport,chardev=agent,name=agent",
	)
	if c.Net != nil {
		na, err := netArgs(c.Net, bus)
		if err != nil {
			return nil, err
		}
		args = append(args, na...)
	}
	if c.Seccomp {
		args = append(args, "-sandbox", SandboxOptions)
	}
	return args, nil
}

// hostNodes is a memory backend's binding to nodes: "host-nodes=0,
// host-nodes=2,policy=bind" (QEMU takes the list as repeated keys; a
// range's "-" would do for consecutive nodes only).
func hostNodes(nodes []int) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "host-nodes=%d,", n)
	}
	return b.String() + "policy=bind"
}

// DetectAccel returns "kvm" when a hardware KVM module (kvm_intel or
// kvm_amd) is loaded and /dev/kvm opens read-write, else "tcg".
func DetectAccel() string {
	hw := false
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			hw = true
		}
	}
	if !hw {
		return "tcg"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg"
	}
	f.Close()
	return "kvm"
}

// ResolveAccel turns a configured accelerator ("auto", "kvm", "tcg") into
// the one to use.
func ResolveAccel(configured string) string {
	if configured == "auto" || configured == "" {
		return DetectAccel()
	}
	return configured
}
