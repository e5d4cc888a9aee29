package sriov

import (
	"fmt"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// InspectRequest is what Inspect looks at (fields as in Request).
type InspectRequest struct {
	Config   Config
	Roots    Roots
	ClaimDir string
}

// Report is a node's VF readiness (`slurm-microvm nics`).
type Report struct {
	Config Config `json:"config"`
	// ConfigError says why the configuration cannot be used.
	ConfigError string `json:"config_error,omitempty"`
	// NoPFs says why no PF is listed: network.sriov.pfs is empty (the
	// node passes no VFs; not an error).
	NoPFs    string `json:"no_pfs,omitempty"`
	ClaimDir string `json:"claim_dir"`
	// ClaimError says why the claims could not be read ("" when they could).
	ClaimError string     `json:"claim_error,omitempty"`
	Host       []Check    `json:"host"`
	PFs        []PFStatus `json:"pfs"`
	// Free counts the VFs a step could get now.
	Free int `json:"free"`
}

// Check is one host check.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// PFStatus is one configured PF: its VFs, or why it cannot be used.
type PFStatus struct {
	PF
	// Error says why the PF cannot be used ("" when it can); Rule names it.
	Error string     `json:"error,omitempty"`
	Rule  string     `json:"rule,omitempty"`
	VFs   []VFStatus `json:"vfs"`
}

// VFStatus is one VF and whether a step could get it now.
type VFStatus struct {
	VF
	// State is "free" (a step would get it), "claimed" (by Claim.Owner)
	// or "unusable" (Why, Rule).
	State string `json:"state"`
	Claim *Claim `json:"claim,omitempty"`
	// Rebind: a step would move it to vfio-pci (allow_rebind).
	Rebind bool   `json:"rebind,omitempty"`
	Why    string `json:"why,omitempty"`
	Rule   string `json:"rule,omitempty"`
}

// VF states of a report.
const (
	StateFree     = "free"
	StateClaimed  = "claimed"
	StateUnusable = "unusable"
)

// Err is nil when every configured PF can be read (or none is configured);
// `slurm-microvm nics` exits 1 on it. VFs that are claimed or unusable
// are reported, not errors (a node can run with some VFs in use).
func (r *Report) Err() error {
	if r.ConfigError != "" {
		return fmt.Errorf("network.sriov cannot be used: %s", r.ConfigError)
	}
	if r.ClaimError != "" {
		return fmt.Errorf("VF claims cannot be read: %s", r.ClaimError)
	}
	bad := 0
	for _, pf := range r.PFs {
		if pf.Error != "" {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d configured PF(s) cannot be used", bad, len(r.PFs))
	}
	return nil
}

// Inspect reports the configured PFs, their VFs, which are free or
// claimed, and each VF's verdict under the rules NewPlan applies. It only
// reads (it takes no lock: a step claiming at the same time may be
// missed).
func Inspect(req InspectRequest) *Report {
	r := req.Roots
	cfg := req.Config
	cfg.PFs = append([]string(nil), cfg.PFs...)
	rep := &Report{Config: cfg, ClaimDir: req.ClaimDir, Host: hostChecks(r), PFs: []PFStatus{}}
	if err := cfg.Validate(); err != nil {
		rep.ConfigError = err.Error()
		return rep
	}
	rep.Config = cfg
	if !cfg.Enabled() {
		rep.NoPFs = "network.sriov.pfs lists no physical function: this node passes no VFs"
		return rep
	}
	claims := map[string]Claim{}
	if req.ClaimDir != "" {
		c, err := ReadClaims(req.ClaimDir)
		if err != nil {
			rep.ClaimError = err.Error()
		}
		claims = c
	}
	var pfs []PF
	for _, name := range cfg.PFs {
		pf, err := ReadPF(r, name)
		st := PFStatus{PF: pf, VFs: []VFStatus{}}
		if err != nil {
			st.Error, st.Rule = err.Error(), RuleName(err)
		}
		pfs = append(pfs, pf)
		rep.PFs = append(rep.PFs, st)
	}
	held, _ := heldDevices(r, pfs)
	for i := range rep.PFs {
		st := &rep.PFs[i]
		for _, vf := range st.PF.VFs {
			vs := VFStatus{VF: vf}
			if c, ok := claims[vf.BDF]; ok {
				vs.State, vs.Claim = StateClaimed, &c
			} else if rebind, err := checkVF(r, st.Config, vf, cfg.AllowRebind, held); err != nil {
				vs.State, vs.Why, vs.Rule = StateUnusable, err.Error(), RuleName(err)
			} else {
				vs.State, vs.Rebind = StateFree, rebind
				rep.Free++
			}
			st.VFs = append(st.VFs, vs)
		}
		st.PF.VFs = nil
	}
	return rep
}

// hostChecks: IOMMU on, vfio-pci loaded, /dev/vfio/vfio present.
func hostChecks(r Roots) []Check {
	var out []Check
	groups, _ := readDirNames(r.SysPath("kernel", "iommu_groups"))
	c := Check{Name: "iommu", OK: len(groups) > 0}
	if c.OK {
		c.Detail = fmt.Sprintf("%d IOMMU groups", len(groups))
	} else {
		c.Detail = fmt.Sprintf("%s is empty: the IOMMU is off; boot with intel_iommu=on iommu=pt (Intel) or amd_iommu=on iommu=pt (AMD)", r.SysPath("kernel", "iommu_groups"))
	}
	out = append(out, c)
	c = Check{Name: "vfio-pci", Detail: "driver not loaded (no " + r.SysPath("bus", "pci", "drivers", pci.VFIODriver) + "): modprobe vfio-pci"}
	if _, err := readDirNames(r.SysPath("bus", "pci", "drivers", pci.VFIODriver)); err == nil {
		c.OK, c.Detail = true, "driver loaded"
	}
	out = append(out, c)
	c = Check{Name: "/dev/vfio/vfio", Detail: "/dev/vfio/vfio does not exist: modprobe vfio-pci"}
	if err := statOK(r.DevPath("/dev/vfio/vfio")); err == nil {
		c.OK, c.Detail = true, "present"
	}
	return append(out, c)
}
