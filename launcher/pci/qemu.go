package pci

import (
	"errors"
	"fmt"
	"strings"
)

// Memory is the guest RAM that MachineArgs backs.
type Memory struct {
	// MiB is the guest memory size: the same value the caller gives -m.
	MiB uint64
	// PreallocThreads touch the memory in parallel at start (0 = 1).
	PreallocThreads int
	// HugePages is a hugetlbfs mount (e.g. "/dev/hugepages") to take the
	// guest RAM from; "" uses anonymous memory.
	HugePages string
}

// MemoryBackendID is the id of the memory backend MachineArgs creates.
const MemoryBackendID = "gpu-ram"

// DefaultHole64 is q35's own pci-hole64-size in bytes (QEMU 7.2: 32 GiB).
const DefaultHole64 = uint64(32) << 30

// MachineArgs is the PCI machine for VFIO passthrough, for QEMU 7.2 and
// later:
//
//	-M q35,memory-backend=gpu-ram,vmport=off,smm=off,sata=off
//	-object memory-backend-ram,id=gpu-ram,size=<MiB>M,prealloc=on,prealloc-threads=<n>
//	-global q35-pcihost.pci-hole64-size=<hole64 bytes>
//
// (memory-backend-file with mem-path=<HugePages> instead when set). The
// caller keeps `-m <MiB>M` (QEMU requires it to equal the backend's size).
// Errors: no memory size, a hugepages path with a newline or NUL.
func MachineArgs(m Memory, hole64 uint64) ([]string, error) {
	if m.MiB == 0 {
		return nil, errors.New("QEMU arguments need the guest memory size")
	}
	threads := max(m.PreallocThreads, 1)
	mem := fmt.Sprintf("memory-backend-ram,id=%s,size=%dM,prealloc=on,prealloc-threads=%d", MemoryBackendID, m.MiB, threads)
	if m.HugePages != "" {
		if strings.ContainsAny(m.HugePages, "\n\x00") {
			return nil, fmt.Errorf("hugepages path %q contains a newline or NUL", m.HugePages)
		}
		mem = fmt.Sprintf("memory-backend-file,id=%s,size=%dM,mem-path=%s,prealloc=on,prealloc-threads=%d",
			MemoryBackendID, m.MiB, strings.ReplaceAll(m.HugePages, ",", ",,"), threads)
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
