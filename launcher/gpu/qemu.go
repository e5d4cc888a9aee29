package gpu

import (
	"fmt"
	"math/bits"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// Devices are the plan's GPUs as the sandbox gets them (each driver
// renders them its own way; launcher/qemu PCIArgs for QEMU): per GPU, in
// guest order, id gpu<i>, its functions (function 0 first) and its VFIO
// group file. A pure function of the plan. No GPUs gives nil.
func (p *Plan) Devices() []driver.PCIDevice {
	var out []driver.PCIDevice
	for i, g := range p.GPUs {
		d := driver.PCIDevice{ID: fmt.Sprintf("gpu%d", i), IOBAR: hasIOBAR(g), VFIOGroupFile: g.VFIOGroupFile}
		for _, f := range g.Functions {
			d.Functions = append(d.Functions, f.BDF)
		}
		out = append(out, d)
	}
	return out
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
