package sriov

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// releaseWait bounds waiting for the step's VMM to close the VF's VFIO
// group at Release (a context deadline shortens it).
const releaseWait = 10 * time.Second

// Request is what NewPlan plans one step's VF from, on one node.
type Request struct {
	// Config is [network.sriov] (validated).
	Config Config
	// Roots locate /sys, /proc and /dev (zero value: the real ones).
	Roots Roots
	// ClaimDir is the node's claim directory, shared by all steps of this
	// node and by nothing else: under the runtime directory and named
	// after the node (multiple-slurmd), e.g.
	// /run/slurm-microvm/<node>/sriov. Absolute.
	ClaimDir string
	// Owner names the step in its claim ("<node>/<job>.<step>.<restart>").
	Owner string
	// StateDir is the step's state directory (recorded in the claim for gc).
	StateDir string
}

// Plan is how one VF reaches a step's VM. It is plain data (JSON): write
// it into the step's state directory so that stop, or gc, can Release it
// from a fresh process.
type Plan struct {
	// PF is the VF's physical function as configured, PFBDF its address.
	PF    string `json:"pf"`
	PFBDF string `json:"pf_bdf"`
	// VF is the claimed VF as planned; VF.Driver is the driver it had.
	VF VF `json:"vf"`
	// Rebind: Bind moves the VF to vfio-pci, Release back to VF.Driver.
	Rebind bool `json:"rebind,omitempty"`
	// ClaimDir and Owner locate the step's claim.
	ClaimDir string `json:"claim_dir"`
	Owner    string `json:"owner"`
	Roots    Roots  `json:"roots"`
	// Notes are facts worth a line in the step's debug log (VFs passed
	// over and why).
	Notes []string `json:"notes,omitempty"`

	write pci.Writer
}

// NewPlan claims one free VF of the configured PFs for the step and
// checks that it can be passed to the VM alone: its own IOMMU group
// (bridges tolerated), on vfio-pci or, with allow_rebind, free to be
// rebound (interface down, verbs device closed), its VFIO group closed,
// and no other step's claim. VFs are tried in PF order, then by VF
// number; the first that passes is claimed (the claim file is created
// under the claim directory's lock, so concurrent steps get different
// VFs). It changes no driver; Bind does.
//
// Errors: ErrConfig, ErrClaim; ErrNoFreeVF (with every VF's own rule,
// ErrClaimed, ErrSharedGroup, ..., in one *ListError line) when no VF can
// be given; a PF that cannot be read (ErrNoPF, ErrNotSRIOV) is part of
// that line when no other PF has a VF to give, and a note otherwise.
func NewPlan(ctx context.Context, req Request) (*Plan, error) {
	cfg := req.Config
	cfg.PFs = append([]string(nil), cfg.PFs...)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return nil, fmt.Errorf("%w: network.sriov.pfs lists no physical function on this node", ErrConfig)
	}
	if req.Owner == "" {
		return nil, fmt.Errorf("%w: a VF claim needs the step's name (Request.Owner)", ErrClaim)
	}
	unlock, err := lockClaims(ctx, req.ClaimDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	claims, err := ReadClaims(req.ClaimDir)
	if err != nil {
		return nil, err
	}
	r := req.Roots
	var pfs []PF
	var notes []string
	var why []error
	for _, name := range cfg.PFs {
		pf, err := ReadPF(r, name)
		if err != nil {
			why = append(why, err)
			notes = append(notes, err.Error())
			continue
		}
		pfs = append(pfs, pf)
	}
	held, herr := heldDevices(r, pfs)
	if herr != nil {
		notes = append(notes, fmt.Sprintf("could not scan %s for open devices: %v", r.ProcPath(), herr))
	}
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			if c, ok := claims[vf.BDF]; ok {
				why = append(why, &DeviceError{VF: vf.BDF, PF: pf.Config, Rule: ErrClaimed, Detail: fmt.Sprintf("claimed by step %s since %s", c.Owner, c.Time.UTC().Format(time.RFC3339))})
				continue
			}
			rebind, err := checkVF(r, pf.Config, vf, cfg.AllowRebind, held)
			if err != nil {
				why = append(why, err)
				notes = append(notes, err.Error())
				continue
			}
			p := &Plan{PF: pf.Config, PFBDF: pf.BDF, VF: vf, Rebind: rebind, ClaimDir: req.ClaimDir, Owner: req.Owner, Roots: r, Notes: notes}
			c := Claim{VF: vf.BDF, PF: pf.BDF, Owner: req.Owner, StateDir: req.StateDir, Driver: vf.Driver, Rebind: rebind,
				VFIOGroupFile: vf.VFIOGroupFile, PID: os.Getpid(), Time: time.Now()}
			if err := writeClaim(req.ClaimDir, c); err != nil {
				return nil, err
			}
			return p, nil
		}
	}
	all := append([]error{ErrNoFreeVF}, why...)
	return nil, joinErrors("network.sriov.pfs="+strings.Join(cfg.PFs, ","), all)
}

// VFIOGroupFiles are the host's /dev/vfio/<group> files the VMM opens
// (the same shape as gpu.Plan.VFIOGroupFiles; give both to the VMM).
func (p *Plan) VFIOGroupFiles() []string {
	if p.VF.VFIOGroupFile == "" {
		return nil
	}
	return []string{p.VF.VFIOGroupFile}
}

// Bind moves the VF to vfio-pci when the plan says Rebind (pci.ToVFIO),
// checking again first that its interface is down and its verbs device
// closed, then waits for /dev/vfio/<group>. Idempotent. A failure moves
// the VF back and names it (ErrBusy, ErrVFIO, ErrRebind, ErrNoPF); the
// claim stays until Release.
func (p *Plan) Bind(ctx context.Context) error {
	r := p.Roots
	fail := func(rule error, err error, format string, a ...any) error {
		return &DeviceError{VF: p.VF.BDF, PF: p.PF, Rule: rule, Detail: fmt.Sprintf(format, a...), Err: err}
	}
	if p.Rebind {
		cur, err := readVF(r, p.VF.BDF, p.VF.Index)
		if err != nil {
			return fail(ErrNoPF, err, "read the VF")
		}
		if cur.Driver != pci.VFIODriver {
			held, err := r.Holders(cur.Verbs...)
			if err != nil {
				return fail(ErrBusy, err, "scan open device files")
			}
			if up := upNetdevs(r, cur); len(up) > 0 {
				return fail(ErrBusy, nil, "its interface %s is up on the host", strings.Join(up, ", "))
			}
			for _, v := range cur.Verbs {
				if hs := held[v]; len(hs) > 0 {
					return fail(ErrBusy, nil, "%s is held open by %s", v, pci.HolderList(hs))
				}
			}
			if _, err := os.Stat(r.SysPath("bus", "pci", "drivers", pci.VFIODriver)); err != nil {
				return fail(ErrVFIO, err, "the vfio-pci driver is not loaded: modprobe vfio-pci")
			}
			moved, err := pci.ToVFIO(ctx, r, p.write, p.VF.BDF)
			if err != nil {
				ferr := fail(ErrRebind, nil, "%v", err)
				if moved {
					if uerr := pci.Restore(ctx, r, p.write, p.VF.BDF, p.VF.Driver); uerr != nil {
						return joinErrors("bind VF to vfio-pci", []error{ferr, fmt.Errorf("undo: %w", fail(ErrRelease, nil, "%v", uerr))})
					}
				}
				return ferr
			}
		}
	}
	dev := r.DevPath(p.VF.VFIOGroupFile)
	if !pci.Poll(ctx, pci.BindWait, func() bool { _, err := os.Stat(dev); return err == nil }) {
		return fail(ErrVFIO, nil, "VFIO group device %s did not appear", p.VF.VFIOGroupFile)
	}
	return nil
}

// Release gives the VF back once the step's VMM is gone: it waits (up to
// 10 s or the context's deadline) until no process holds its VFIO group,
// moves a rebound VF back to its planned driver (pci.Restore), checks the
// VF is usable again (back on its driver, or /dev/vfio/<group> opens for
// a VF that stays on vfio-pci), and removes the step's claim. Works on a
// plan read back from JSON, whether or not Bind ran; idempotent. On
// failure the claim stays (the VF is not handed out; gc retries) and the
// error wraps ErrRelease (with ErrBusy when a process holds the group).
func (p *Plan) Release(ctx context.Context) error {
	r := p.Roots
	fail := func(err error, format string, a ...any) error {
		return &DeviceError{VF: p.VF.BDF, PF: p.PF, Rule: ErrRelease, Detail: fmt.Sprintf(format, a...), Err: err}
	}
	if g := p.VF.VFIOGroupFile; g != "" {
		var held map[string][]pci.Holder
		if !pci.Poll(ctx, releaseWait, func() bool {
			var err error
			held, err = r.Holders(g)
			return err == nil && len(held[g]) == 0
		}) && len(held[g]) > 0 {
			return fail(ErrBusy, "VFIO group %s is still held open by %s", g, pci.HolderList(held[g]))
		}
	}
	if p.Rebind {
		if err := pci.Restore(ctx, r, p.write, p.VF.BDF, p.VF.Driver); err != nil {
			return fail(nil, "%v", err)
		}
		if d, _ := pci.LinkBase(r.DevicePath(p.VF.BDF, "driver")); d != p.VF.Driver {
			return fail(nil, "bound to %q, not back on %q", d, p.VF.Driver)
		}
	} else if p.VF.VFIOGroupFile != "" {
		if err := pci.OpenClose(r.DevPath(p.VF.VFIOGroupFile)); err != nil {
			return fail(err, "VFIO group %s does not open", p.VF.VFIOGroupFile)
		}
	}
	if p.ClaimDir == "" {
		return nil
	}
	unlock, err := lockClaims(ctx, p.ClaimDir)
	if err != nil {
		return err
	}
	defer unlock()
	return removeClaim(p.ClaimDir, p.VF.BDF, p.Owner)
}

// Guest is what the guest sees and needs.
type Guest struct {
	// Vendor and Device are the VF's PCI ids (15b3:101e for a ConnectX-6
	// Dx/7 VF); Driver the guest kernel module that drives it.
	Vendor uint16 `json:"vendor"`
	Device uint16 `json:"device"`
	Driver string `json:"driver"`
	// Modules are the guest kernel modules to pack into the initramfs
	// (assets.Options.Modules, beside assets.DefaultModules), dependencies
	// left to the module index: the driver, and for RDMA its verbs
	// provider and ib_uverbs. None for an unknown vendor.
	Modules []string `json:"modules,omitempty"`
	// Note says what the guest image must bring.
	Note string `json:"note"`
}

// Guest is what the step's guest gets: one PCI function at 00.0 of its
// own root port (QEMU id nic0), which the guest's driver names (its
// interface and RDMA device names, e.g. ib0/mlx5_0, are the guest's
// own; the host's names are not carried over).
func (p *Plan) Guest() Guest {
	g := Guest{Vendor: p.VF.Vendor, Device: p.VF.Device, Driver: guestDriver(p.VF.Vendor)}
	g.Modules = guestModules(p.VF.Vendor)
	g.Note = fmt.Sprintf("the guest loads %s from the initramfs (modules %s of the node's kernel); RDMA from user space needs rdma-core (libibverbs and its provider) in the image", g.Driver, strings.Join(g.Modules, " "))
	if g.Driver == "" {
		g.Driver = "unknown"
		g.Note = fmt.Sprintf("no known guest driver for PCI id %04x:%04x: the guest image must bring one", p.VF.Vendor, p.VF.Device)
	}
	return g
}

// guestModules are the modules a guest needs for a VF of vendor: the
// driver, its RDMA (verbs) provider and the verbs character devices.
func guestModules(vendor uint16) []string {
	switch vendor {
	case 0x15b3:
		return []string{"mlx5_core", "mlx5_ib", "ib_uverbs"}
	case 0x8086:
		return []string{"iavf", "irdma", "ib_uverbs"}
	case 0x14e4:
		return []string{"bnxt_en", "bnxt_re", "ib_uverbs"}
	}
	return nil
}

// guestDriver names the Linux driver of a VF vendor's functions.
func guestDriver(vendor uint16) string {
	switch vendor {
	case 0x15b3: // Mellanox / NVIDIA Networking (ConnectX-4 and later)
		return "mlx5_core"
	case 0x8086: // Intel (E810: iavf)
		return "iavf"
	case 0x14e4: // Broadcom (bnxt)
		return "bnxt_en"
	}
	return ""
}

// Mapping is a one-line summary for the step's log:
// "nic: VF 0000:3b:00.2 (vf 0 of ib0 0000:3b:00.0) group 41 (vfio-pci) -> guest nic0".
func (p *Plan) Mapping() string {
	drv := p.VF.Driver
	if p.Rebind {
		drv += "->" + pci.VFIODriver
	}
	return fmt.Sprintf("nic: VF %s (vf %d of %s %s) group %d (%s) -> guest %s", p.VF.BDF, p.VF.Index, p.PF, p.PFBDF, p.VF.IOMMUGroup, drv, DeviceID)
}
