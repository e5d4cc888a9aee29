package qemu

import "fmt"

// Device slots of the two machine types, measured with QEMU 7.2 (each
// 9p share is one virtio device; see TestShareLimit and doc.go):
const (
	// MicrovmTransports is the number of virtio-mmio transports of
	// -M microvm with its second IOAPIC (ioapic2, on by default): the 25th
	// virtio-mmio device fails with "No 'virtio-bus' bus found".
	MicrovmTransports = 24
	// microvmUnusable: QEMU takes 24 virtio-mmio devices, but with 24 the
	// guest (Debian 12's 6.1 kernel) hangs in the mount of a share; 23
	// boot and serve (TestShareLimit, 21 and 22 shares under TCG).
	microvmUnusable = 1
	// Q35Slots is the number of device slots of q35's pcie.0 that
	// devices may take: 32 less the host bridge (00.0) and the LPC bridge
	// (1f.0). One more fails with "PCI: no slot/function available".
	Q35Slots = 30
	// baseDevices are the root disk, the control channel and the network
	// device (counted whether or not the step has a network, so the limit
	// checked at submit is the one every step gets).
	baseDevices = 3
)

// MaxSharesMicrovm is how many host shares a step without GPUs (-M
// microvm) can take: the 23 virtio-mmio transports a guest can use less
// the root disk, the control channel and the network device. GPU steps (q35) take
// MaxShares(true, gpus).
const MaxSharesMicrovm = MicrovmTransports - microvmUnusable - baseDevices

// MaxShares is how many host shares (site mounts, scratch, user mounts,
// the host MPI share) one VM can take: MaxSharesMicrovm on -M microvm; on
// q35 (pci) Q35Slots less the root disk, the control channel, the network
// device and one pcie-root-port per GPU.
func MaxShares(pci bool, gpus int) int {
	if !pci {
		return MaxSharesMicrovm
	}
	return max(Q35Slots-baseDevices-gpus, 0)
}

// TooManySharesError is a step with more host shares than its VM has
// device slots for.
type TooManySharesError struct {
	Shares, Max int
	PCI         bool
	GPUs        int
}

func (e *TooManySharesError) Error() string {
	if e.PCI {
		return fmt.Sprintf("%d host shares (site mounts, scratch, --microvm-mounts, host MPI, the GPU driver set): a GPU microVM with %d GPUs takes at most %d (q35 has %d device slots; the root disk, the control channel, the network device and one port per GPU use %d); mount a common parent instead of several directories under it",
			e.Shares, e.GPUs, e.Max, Q35Slots, baseDevices+e.GPUs)
	}
	return fmt.Sprintf("%d host shares (site mounts, scratch, --microvm-mounts, host MPI): a microVM takes at most %d (a -M microvm guest can use %d virtio-mmio slots; the root disk, the control channel and the network device use %d); mount a common parent instead of several directories under it",
		e.Shares, e.Max, MicrovmTransports-microvmUnusable, baseDevices)
}
