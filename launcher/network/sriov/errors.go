package sriov

import (
	"errors"
	"fmt"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// The rules a VF plan can break. Every error NewPlan, Bind, Release and
// GC return wraps one of these (errors.Is); the message names the VF or
// PF, the rule and the fix.
var (
	// ErrConfig: network.sriov in microvm.toml is malformed.
	ErrConfig = errors.New("bad network.sriov configuration")
	// ErrNoPF: a configured physical function does not exist here.
	ErrNoPF = errors.New("physical function not found")
	// ErrNotSRIOV: a configured device has no SR-IOV capability or no
	// VFs enabled (sriov_numvfs is 0), or is itself a virtual function.
	ErrNotSRIOV = errors.New("no SR-IOV virtual functions")
	// ErrNoIOMMU: the VF has no IOMMU group (IOMMU off).
	ErrNoIOMMU = errors.New("no IOMMU group")
	// ErrSharedGroup: the VF's IOMMU group holds another device that is
	// not a bridge (the PF, another VF, anything else).
	ErrSharedGroup = errors.New("IOMMU group shared with another device")
	// ErrWrongDriver: the VF is not on vfio-pci and rebinding is not allowed.
	ErrWrongDriver = errors.New("VF not bound to vfio-pci")
	// ErrBusy: the host uses the VF (its netdev is up, its RDMA verbs
	// device or VFIO group is open).
	ErrBusy = errors.New("VF in use on the host")
	// ErrClaimed: another step of this node holds the VF's claim.
	ErrClaimed = errors.New("VF claimed by another step")
	// ErrNoFreeVF: no VF of the configured PFs can be given to the step.
	ErrNoFreeVF = errors.New("no free VF")
	// ErrVFIO: vfio-pci or /dev/vfio is not usable on this host.
	ErrVFIO = errors.New("VFIO not usable")
	// ErrClaim: the claim directory or a claim file cannot be used.
	ErrClaim = errors.New("VF claim failed")
	// ErrRebind: moving the VF to vfio-pci failed or did not take effect.
	ErrRebind = errors.New("rebinding failed")
	// ErrRelease: after the step the VF is not back in a state the next
	// step can use (its claim is kept for gc to retry).
	ErrRelease = errors.New("VF not released")
)

// RuleName is a short name of the rule err breaks ("shared-iommu-group"),
// "" when it wraps none of the Err* values. The names are those of
// gpu.RuleName where the rule is the same.
func RuleName(err error) string {
	for _, r := range []struct {
		err  error
		name string
	}{
		{ErrConfig, "config"}, {ErrNoPF, "no-pf"}, {ErrNotSRIOV, "not-sriov"}, {ErrNoIOMMU, "no-iommu"},
		{ErrSharedGroup, "shared-iommu-group"}, {ErrWrongDriver, "wrong-driver"}, {ErrClaimed, "claimed"},
		{ErrBusy, "busy"}, {ErrVFIO, "vfio"}, {ErrClaim, "claim"}, {ErrRebind, "rebind"}, {ErrRelease, "release"},
		{ErrNoFreeVF, "no-free-vf"},
	} {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return ""
}

// DeviceError is a broken rule for one VF or PF. Its message is
// "VF 0000:3b:00.2 (PF 0000:3b:00.0): <rule> (<rule name>): <detail>".
type DeviceError struct {
	// VF is the VF's PCI address ("" for an error about a PF or the host).
	VF string
	// PF is the physical function as configured ("" when not known).
	PF string
	// Rule is the broken rule (an Err* value).
	Rule error
	// Detail says what was found and how to fix it.
	Detail string
	// Err is an underlying error (may be nil).
	Err error
}

func (e *DeviceError) Error() string {
	var s string
	switch {
	case e.VF != "" && e.PF != "":
		s = fmt.Sprintf("VF %s (PF %s): ", e.VF, e.PF)
	case e.VF != "":
		s = "VF " + e.VF + ": "
	case e.PF != "":
		s = "PF " + e.PF + ": "
	}
	s += e.Rule.Error()
	if n := RuleName(e.Rule); n != "" {
		s += " (" + n + ")"
	}
	if e.Detail != "" {
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
