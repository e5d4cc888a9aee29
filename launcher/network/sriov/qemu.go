package sriov

import (
	"fmt"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// DeviceID is the VF's id in the sandbox (driver.PCIDevice.ID).
const DeviceID = "nic0"

// Device is the VF as the sandbox gets it (each driver renders it its own
// way; launcher/qemu PCIArgs for QEMU, beside the step's GPUs or alone).
// VFs have no I/O BARs and no option ROM (the SR-IOV specification gives
// VFs memory BARs only and a read-only zero expansion ROM BAR). Errors: a
// VF address that is not one.
func (p *Plan) Device() (driver.PCIDevice, error) {
	if !pci.ValidBDF(p.VF.BDF) {
		return driver.PCIDevice{}, fmt.Errorf("sriov: %q is not a PCI address", p.VF.BDF)
	}
	return driver.PCIDevice{ID: DeviceID, Functions: []string{p.VF.BDF}, IOBAR: hasIOBAR(p.VF), VFIOGroupFile: p.VF.VFIOGroupFile}, nil
}

// Hole64 is the guest's 64-bit PCI hole for the VF alone, in bytes: its
// 64-bit BARs plus the largest (bridge window alignment), rounded up to
// 1 GiB, at least QEMU's default 32 GiB (as gpu.Plan.Hole64 counts).
func (p *Plan) Hole64() uint64 {
	var sum, largest uint64
	for _, b := range p.VF.BARs {
		if b.Is64() {
			sum += b.Size
			largest = max(largest, b.Size)
		}
	}
	const gib = uint64(1) << 30
	total := (sum + largest + gib - 1) / gib * gib
	return max(total, pci.DefaultHole64)
}

func hasIOBAR(vf VF) bool {
	for _, b := range vf.BARs {
		if b.IsIO() {
			return true
		}
	}
	return false
}
