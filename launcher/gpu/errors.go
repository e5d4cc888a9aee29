package gpu

import (
	"errors"
	"fmt"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// The rules a GPU can break. Every error Plan, Bind, Release and Inspect
// return wraps one of these, so callers test with errors.Is; the message
// names the device, the rule and the fix.
var (
	// ErrStepGPUs: SLURM_STEP_GPUS is malformed (or "NoDevFiles").
	ErrStepGPUs = errors.New("bad SLURM_STEP_GPUS")
	// ErrGresConf: gres.conf is missing, unreadable or malformed.
	ErrGresConf = errors.New("bad gres.conf")
	// ErrNotInGresConf: an index of SLURM_STEP_GPUS is not a gpu device
	// file of this node in gres.conf.
	ErrNotInGresConf = errors.New("GPU index not in gres.conf")
	// ErrUnsupportedFile: a gres.conf File= is neither /dev/vfio/<group>,
	// /dev/nvidia<minor> nor an NVIDIA character device (major 195).
	ErrUnsupportedFile = errors.New("unsupported GPU device file")
	// ErrNoDevice: the device file, its PCI device or its IOMMU group does
	// not exist on this host.
	ErrNoDevice = errors.New("GPU device not found")
	// ErrNoIOMMU: the PCI device has no IOMMU group (IOMMU off).
	ErrNoIOMMU = errors.New("no IOMMU group")
	// ErrSharedGroup: the GPU's IOMMU group holds a device that is not
	// part of the step's allocation.
	ErrSharedGroup = errors.New("IOMMU group shared with a device outside the allocation")
	// ErrWrongDriver: a group member is not bound to vfio-pci and
	// rebinding is not allowed.
	ErrWrongDriver = errors.New("device not bound to vfio-pci")
	// ErrMIGEnabled: the GPU is in MIG mode.
	ErrMIGEnabled = errors.New("MIG mode enabled")
	// ErrBusy: a process uses the GPU or holds its VFIO group.
	ErrBusy = errors.New("GPU in use")
	// ErrVFIO: vfio-pci or /dev/vfio is not usable on this host.
	ErrVFIO = errors.New("VFIO not usable")
	// ErrAddressSpace: the guest's PCI hole does not fit the host CPU's
	// physical address width.
	ErrAddressSpace = errors.New("guest address space too small")
	// ErrNVSwitch: a multi-GPU step on an NVSwitch node would have no
	// NVLink (the switches stay on the host).
	ErrNVSwitch = errors.New("GPUs linked by NVSwitch")
	// ErrNVMLUnavailable: libnvidia-ml could not be loaded or initialised.
	ErrNVMLUnavailable = errors.New("NVML not available")
	// ErrRebind: writing driver_override/unbind/bind failed or did not
	// take effect.
	ErrRebind = errors.New("rebinding failed")
	// ErrRelease: after the step the GPU is not back in a state the next
	// job can use.
	ErrRelease = errors.New("GPU not released")
)

// DeviceError is a broken rule for one GPU (or one function of it).
// Unwrap gives the rule (one of the Err* values above) and, where there
// is one, the underlying system error.
type DeviceError struct {
	// Index is the Slurm global GPU index (-1 when not known).
	Index int
	// File is the gres.conf device file ("" when not known).
	File string
	// BDF is the PCI address of the function concerned ("" when not known).
	BDF string
	// Rule is the broken rule.
	Rule error
	// Detail says what was found and how to fix it.
	Detail string
	// Err is an underlying error (may be nil).
	Err error
}

func (e *DeviceError) Error() string {
	var who []string
	if e.Index >= 0 {
		who = append(who, fmt.Sprintf("GPU %d", e.Index))
	}
	var where []string
	if e.File != "" {
		where = append(where, e.File)
	}
	if e.BDF != "" {
		where = append(where, e.BDF)
	}
	s := strings.Join(who, " ")
	if len(where) > 0 {
		if s != "" {
			s += " "
		}
		s += "(" + strings.Join(where, ", ") + ")"
	}
	if s == "" {
		s = e.Detail
	} else {
		s += ": " + e.Detail
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the rule and the underlying error.
func (e *DeviceError) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Rule, e.Err}
	}
	return []error{e.Rule}
}

// ListError is several errors as one line (package pci).
type ListError = pci.ListError

func joinErrors(what string, errs []error) error { return pci.JoinErrors(what, errs) }
