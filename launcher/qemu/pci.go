package qemu

import (
	"errors"
	"fmt"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// Memory is the guest RAM that MachineArgs backs.
type Memory struct {
	// MiB is the guest memory size: the same value the caller gives -m.
	MiB uint64
	// PreallocThreads touch the memory in parallel at start (0 = 1).
	PreallocThreads int
	// HugePageMiB is the huge page size (2 or 1024) the guest RAM comes
	// in, from a memfd of the VMM's own (hugetlb=on); 0: anonymous
	// memory. MiB must be a multiple of it.
	HugePageMiB uint64
	// HostNodes bind the RAM to these host NUMA nodes; none: the
	// kernel's default policy.
	HostNodes []int
}

// MemoryBackendID is the id of the memory backend MachineArgs creates.
const MemoryBackendID = "gpu-ram"

// MachineArgs is the PCI machine for VFIO passthrough, for QEMU 7.2 and
// later:
//
//	-M q35,memory-backend=gpu-ram,vmport=off,smm=off,sata=off
//	-object memory-backend-ram,id=gpu-ram,size=<MiB>M,prealloc=on,prealloc-threads=<n>
//	-global q35-pcihost.pci-hole64-size=<hole64 bytes>
//
// (memory-backend-memfd,hugetlb=on,hugetlbsize=<HugePageMiB>M instead
// when set). The caller keeps `-m <MiB>M` (QEMU requires it to equal the
// backend's size). Errors: no memory size, a size that is not a multiple
// of the huge page size.
func MachineArgs(m Memory, hole64 uint64) ([]string, error) {
	if m.MiB == 0 {
		return nil, errors.New("QEMU arguments need the guest memory size")
	}
	threads := max(m.PreallocThreads, 1)
	mem := fmt.Sprintf("memory-backend-ram,id=%s,size=%dM,prealloc=on,prealloc-threads=%d", MemoryBackendID, m.MiB, threads)
	if p := m.HugePageMiB; p != 0 {
		if m.MiB%p != 0 {
			return nil, fmt.Errorf("guest memory %d MiB is not a whole number of %d MiB huge pages", m.MiB, p)
		}
		mem = fmt.Sprintf("memory-backend-memfd,id=%s,size=%dM,hugetlb=on,hugetlbsize=%dM,prealloc=on,prealloc-threads=%d",
			MemoryBackendID, m.MiB, p, threads)
	}
	if len(m.HostNodes) > 0 {
		mem += "," + hostNodes(m.HostNodes)
	}
	return []string{
		"-M", "q35,memory-backend=" + MemoryBackendID + ",vmport=off,smm=off,sata=off",
		"-object", mem,
		"-global", "q35-pcihost.pci-hole64-size=" + SizeArg(hole64),
	}, nil
}

// SizeArg writes a byte count the way QEMU's size parser reads it, in the
// largest unit that divides it ("641G").
func SizeArg(n uint64) string {
	for _, u := range []struct {
		s     string
		shift uint
	}{{"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", n>>u.shift, u.s)
		}
	}
	return fmt.Sprint(n)
}

// PCIArgs is the q35 machine of a sandbox with devs passed through VFIO,
// for QEMU 7.2 and later: MachineArgs, then per device i, in guest order,
//
//	-device pcie-root-port,id=<ID>-port,bus=pcie.0,chassis=<i+1>[,io-reserve=0]
//	-device vfio-pci,id=<ID>,host=<BDF>,bus=<ID>-port,addr=00.0[,multifunction=on],rombar=0
//	-device vfio-pci,id=<ID>-fn<f>,host=<BDF>,bus=<ID>-port,addr=00.<f>,rombar=0  (other functions)
//
// A device without I/O BARs gets io-reserve=0 (every root port otherwise
// reserves 4 KiB of the guest's 64 KiB I/O space). The caller keeps
// `-m <MiB>M` equal to m.MiB, boots with -accel kvm and
// `-cpu host,host-phys-bits=on`, uses PCI (not MMIO) virtio devices and no
// other root port chassis 1..len(devs), and gives QEMU an RLIMIT_MEMLOCK of
// the guest memory plus 1 GiB (VFIO pins all guest RAM). hole64 is the
// 64-bit PCI hole in bytes (0: pci.DefaultHole64). A pure function; no
// devices gives nil. Errors: a device with no or more than 8 functions, a
// function that is not a PCI address, a duplicate id, no memory size.
func PCIArgs(devs []driver.PCIDevice, m Memory, hole64 uint64) ([]string, error) {
	if len(devs) == 0 {
		return nil, nil
	}
	if hole64 == 0 {
		hole64 = pci.DefaultHole64
	}
	args, err := MachineArgs(m, hole64)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i, d := range devs {
		if d.ID == "" || strings.ContainsAny(d.ID, ",= \n\x00") || seen[d.ID] {
			return nil, fmt.Errorf("qemu: PCI device %d: id %q is empty, repeated or not a QEMU id", i, d.ID)
		}
		seen[d.ID] = true
		if len(d.Functions) == 0 || len(d.Functions) > 8 {
			return nil, fmt.Errorf("qemu: PCI device %s has %d functions to pass (want 1-8)", d.ID, len(d.Functions))
		}
		port := d.ID + "-port"
		rp := fmt.Sprintf("pcie-root-port,id=%s,bus=pcie.0,chassis=%d", port, i+1)
		if !d.IOBAR {
			rp += ",io-reserve=0"
		}
		args = append(args, "-device", rp)
		for fn, bdf := range d.Functions {
			if !pci.ValidBDF(bdf) {
				return nil, fmt.Errorf("qemu: PCI device %s: %q is not a PCI address", d.ID, bdf)
			}
			id := d.ID
			if fn > 0 {
				id = fmt.Sprintf("%s-fn%d", d.ID, fn)
			}
			dev := fmt.Sprintf("vfio-pci,id=%s,host=%s,bus=%s,addr=00.%d", id, bdf, port, fn)
			if fn == 0 && len(d.Functions) > 1 {
				dev += ",multifunction=on"
			}
			args = append(args, "-device", dev+",rombar=0")
		}
	}
	return args, nil
}
