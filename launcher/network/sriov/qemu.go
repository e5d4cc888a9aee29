package sriov

import (
	"fmt"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// DeviceID is the QEMU id of the VF's vfio-pci device; its root port is
// DeviceID+"-port".
const DeviceID = "nic0"

// DeviceArgs is the VF part of a q35 command line, for QEMU 7.2 and later:
//
//	-device pcie-root-port,id=nic0-port,bus=pcie.0,chassis=<chassis>,io-reserve=0
//	-device vfio-pci,id=nic0,host=<VF>,bus=nic0-port,addr=00.0,rombar=0
//
// chassis must differ from every other root port's (gpu.Plan.QEMUArgs
// numbers its ports 1..len(GPUs): pass len(GPUs)+1). VFs have no I/O BARs
// and no option ROM (the SR-IOV specification gives VFs memory BARs
// only and a read-only zero expansion ROM BAR), hence
// io-reserve=0 and rombar=0. Use it beside gpu.Plan.QEMUArgs, whose
// machine and 64-bit hole leave room for a VF's few MiB of BARs; alone,
// use QEMUArgs. Errors: a VF address that is not one, chassis out of
// 1-255.
func (p *Plan) DeviceArgs(chassis int) ([]string, error) {
	if !pci.ValidBDF(p.VF.BDF) {
		return nil, fmt.Errorf("sriov: %q is not a PCI address", p.VF.BDF)
	}
	if chassis < 1 || chassis > 255 {
		return nil, fmt.Errorf("sriov: root port chassis %d is out of 1-255", chassis)
	}
	port := DeviceID + "-port"
	rp := fmt.Sprintf("pcie-root-port,id=%s,bus=pcie.0,chassis=%d", port, chassis)
	if !hasIOBAR(p.VF) {
		rp += ",io-reserve=0"
	}
	return []string{
		"-device", rp,
		"-device", fmt.Sprintf("vfio-pci,id=%s,host=%s,bus=%s,addr=00.0,rombar=0", DeviceID, p.VF.BDF, port),
	}, nil
}

// QEMUArgs is the whole PCI machine of a step whose only passed device is
// the VF: pci.MachineArgs (q35, the preallocated memory backend VFIO
// pins, the 64-bit hole) and DeviceArgs(1). The caller's duties are those
// of gpu.Plan.QEMUArgs: -m equal to m.MiB, -accel kvm, PCI virtio devices,
// RLIMIT_MEMLOCK of the guest memory plus 1 GiB.
func (p *Plan) QEMUArgs(m pci.Memory) ([]string, error) {
	args, err := pci.MachineArgs(m, p.Hole64())
	if err != nil {
		return nil, fmt.Errorf("sriov: %w", err)
	}
	dev, err := p.DeviceArgs(1)
	if err != nil {
		return nil, err
	}
	return append(args, dev...), nil
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
