package gpu

import (
	"fmt"
	"math/bits"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// Memory is the guest RAM that QEMUArgs backs (package pci).
type Memory = pci.Memory

// MemoryBackendID is the id of the memory backend QEMUArgs creates.
const MemoryBackendID = pci.MemoryBackendID

// QEMUArgs is the GPU part of the QEMU command line (without the binary),
// for QEMU 7.2 and later:
//
//	-M q35,memory-backend=gpu-ram,vmport=off,smm=off,sata=off
//	-object memory-backend-ram,id=gpu-ram,size=<MiB>M,prealloc=on,prealloc-threads=<n>
//	-global q35-pcihost.pci-hole64-size=<Hole64>
//	per GPU i, in guest order:
//	-device pcie-root-port,id=gpu<i>-port,bus=pcie.0,chassis=<i+1>[,io-reserve=0]
//	-device vfio-pci,id=gpu<i>,host=<BDF>,bus=gpu<i>-port,addr=00.0[,multifunction=on],rombar=0
//	-device vfio-pci,id=gpu<i>-fn<f>,host=<BDF>,bus=gpu<i>-port,addr=00.<f>,rombar=0  (other functions)
//
// The caller keeps `-m <MiB>M` (QEMU requires it to equal the backend's
// size), boots with -accel kvm and `-cpu host,host-phys-bits=on` so the
// guest's address width covers PhysBits, uses PCI (not MMIO) virtio
// devices on q35, uses no other pcie-root-port chassis 1..len(GPUs), and
// gives QEMU an RLIMIT_MEMLOCK of at least the guest memory plus 1 GiB
// (VFIO pins all guest RAM; root with CAP_IPC_LOCK is exempt until -runas
// drops it). It is a pure function of the plan and m. No GPUs gives nil.
func (p *Plan) QEMUArgs(m Memory) ([]string, error) {
	if len(p.GPUs) == 0 {
		return nil, nil
	}
	args, err := pci.MachineArgs(m, p.Hole64())
	if err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	for i, g := range p.GPUs {
		if len(g.Functions) == 0 || len(g.Functions) > 8 {
			return nil, fmt.Errorf("gpu: GPU %d (%s) has %d functions to pass (want 1-8)", g.Index, g.BDF, len(g.Functions))
		}
		port := fmt.Sprintf("gpu%d-port", i)
		rp := fmt.Sprintf("pcie-root-port,id=%s,bus=pcie.0,chassis=%d", port, i+1)
		if !hasIOBAR(g) {
			// Every root port otherwise reserves 4 KiB of the guest's 64 KiB
			// I/O space; GPUs without I/O BARs need none.
			rp += ",io-reserve=0"
		}
		args = append(args, "-device", rp)
		for fn, f := range g.Functions {
			if !pci.ValidBDF(f.BDF) {
				return nil, fmt.Errorf("gpu: GPU %d: %q is not a PCI address", g.Index, f.BDF)
			}
			id := fmt.Sprintf("gpu%d", i)
			if fn > 0 {
				id = fmt.Sprintf("gpu%d-fn%d", i, fn)
			}
			dev := fmt.Sprintf("vfio-pci,id=%s,host=%s,bus=%s,addr=00.%d", id, f.BDF, port, fn)
			if fn == 0 && len(g.Functions) > 1 {
				dev += ",multifunction=on"
			}
			args = append(args, "-device", dev+",rombar=0")
		}
	}
	return args, nil
}

func hasIOBAR(g GPU) bool {
	for _, f := range g.Functions {
		for _, b := range f.BARs {
			if b.IsIO() {
				return true
			}
		}
	}
	return false
}

const (
	gib = uint64(1) << 30
	tib = uint64(1) << 40
	// defaultHole64 is q35's own pci-hole64-size (QEMU 7.2: 32 GiB).
	defaultHole64 = pci.DefaultHole64
	// amdHTStart is where QEMU 7.2 stops RAM on AMD hosts and relocates
	// above-4G RAM to 1 TiB (AMD_HT_START).
	amdHTStart = uint64(0xfd00000000)
)

// Hole64 is the size of the guest's 64-bit PCI hole in bytes: for each
// GPU's root port, the sum of its functions' 64-bit BARs plus its largest
// such BAR (the port's bridge window is aligned to its largest BAR, so
// placing it can waste up to that much), summed over the ports, rounded
// up to 1 GiB, and at least QEMU's default 32 GiB. For one H200 (BAR1
// 256 GiB, BAR3 32 MiB) that is 513 GiB.
func (p *Plan) Hole64() uint64 {
	var total uint64
	for _, g := range p.GPUs {
		var sum, largest uint64
		for _, f := range g.Functions {
			for _, b := range f.BARs {
				if b.Is64() {
					sum += b.Size
					largest = max(largest, b.Size)
				}
			}
		}
		total += sum + largest
	}
	total = (total + gib - 1) / gib * gib
	return max(total, defaultHole64)
}

// PhysBits is the guest physical address width QEMU needs for memMiB of
// RAM and the PCI hole: QEMU 7.2 refuses to start ("Address space limit
// ... phys-bits too low") when the hole ends above 2^phys-bits. q35 keeps
// 2 GiB of RAM below 4 GiB (2.75 GiB for guests under 2.75 GiB), the hole
// starts at the next GiB after the RAM above 4 GiB, and on AMD hosts QEMU
// moves that RAM to 1 TiB once it would reach the HyperTransport range;
// the larger of the two layouts counts.
func (p *Plan) PhysBits(memMiB uint64) int {
	ram := memMiB << 20
	low := uint64(0x80000000)
	if ram < 0xb0000000 {
		low = 0xb0000000
	}
	above := uint64(0)
	if ram > low {
		above = ram - low
	}
	hole := p.Hole64()
	start := (4*gib + above + gib - 1) / gib * gib
	end := start + hole
	if end > amdHTStart {
		end = max(end, (tib+above+gib-1)/gib*gib+hole)
	}
	return bits.Len64(end - 1)
}
