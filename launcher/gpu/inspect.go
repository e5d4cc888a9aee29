package gpu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu/driverset"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// InspectRequest is what Inspect looks at; fields as in Request.
type InspectRequest struct {
	GresConf    string
	Node        string
	Roots       Roots
	NVML        NVML
	AllowRebind bool
}

// Report is a node's GPU readiness (`slurm-microvm gpus`).
type Report struct {
	Node     string `json:"node"`
	GresConf string `json:"gres_conf"`
	// GresConfError says why gres.conf could not be used ("" when it could).
	GresConfError string `json:"gres_conf_error,omitempty"`
	// GresConfAbsent: gres.conf does not exist (Slurm configures no GPU
	// on this node); GresConfError then says so too.
	GresConfAbsent bool    `json:"gres_conf_absent,omitempty"`
	AutoDetect     string  `json:"autodetect,omitempty"`
	NVML           string  `json:"nvml"`
	Host           []Check `json:"host"`
	// GPUs are the GPUs gres.conf lists for this node, by Slurm index.
	GPUs []GPUStatus `json:"gpus"`
	// Unlisted are NVIDIA GPUs in sysfs that gres.conf does not name.
	Unlisted []UnlistedGPU `json:"unlisted,omitempty"`
	// NoGPUs says why no GPU is listed ("" when some are).
	NoGPUs string   `json:"no_gpus,omitempty"`
	Notes  []string `json:"notes,omitempty"`
	// Driver is the driver set a GPU step would get (filled by the
	// caller, which knows the guest kernel; nil when not asked).
	Driver *DriverReport `json:"driver,omitempty"`
}

// DriverReport is the node's GPU driver as a GPU step's guest would get it
// (package driverset), or why it cannot.
type DriverReport struct {
	// Inject is gpu.driver.inject: false means guests get no driver.
	Inject        bool           `json:"inject"`
	Root          string         `json:"root"`
	KernelRelease string         `json:"kernel_release,omitempty"`
	Set           *driverset.Set `json:"set,omitempty"`
	// GuestLibDir and GuestBinDir are where a guest finds the user-space
	// driver; Devices the nodes a one-GPU guest gets (nvidia<i> for each
	// further GPU).
	GuestLibDir string                 `json:"guest_lib_dir,omitempty"`
	GuestBinDir string                 `json:"guest_bin_dir,omitempty"`
	Devices     []driverset.DeviceNode `json:"devices,omitempty"`
	// Error says why the set cannot be built on this node ("" when it can).
	Error string `json:"error,omitempty"`
}

// Check is one host check.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// GPUStatus is one configured GPU and whether a step could get it now,
// alone.
type GPUStatus struct {
	Index      int      `json:"index"`
	File       string   `json:"file"`
	Gres       string   `json:"gres"`
	GresWhere  string   `json:"gres_where"`
	BDF        string   `json:"bdf,omitempty"`
	IOMMUGroup int      `json:"iommu_group"`
	Members    []Member `json:"members,omitempty"`
	Driver     string   `json:"driver,omitempty"`
	Minor      int      `json:"minor"`
	NVMLIndex  int      `json:"nvml_index"`
	UUID       string   `json:"uuid,omitempty"`
	Name       string   `json:"name,omitempty"`
	MIG        string   `json:"mig,omitempty"`
	// Passable: a step given only this GPU would get it now.
	Passable bool `json:"passable"`
	// Rebind lists the functions Bind would move to vfio-pci.
	Rebind []string `json:"rebind,omitempty"`
	// Why says why it is not passable; Rules names the rules broken.
	Why   string   `json:"why,omitempty"`
	Rules []string `json:"rules,omitempty"`
}

// UnlistedGPU is an NVIDIA GPU that gres.conf does not name.
type UnlistedGPU struct {
	BDF        string `json:"bdf"`
	Desc       string `json:"desc"`
	IOMMUGroup int    `json:"iommu_group"`
}

// Passable tells whether every configured GPU is passable.
func (r *Report) Passable() bool {
	for _, g := range r.GPUs {
		if !g.Passable {
			return false
		}
	}
	return true
}

// Err is nil when the node is as usable as the report shows: gres.conf
// was read, or does not exist (no GPU is configured, nothing to pass
// through), and every GPU it configures can be passed through now. It
// says what is unusable otherwise; `slurm-microvm gpus` exits 1 on it.
func (r *Report) Err() error {
	if r.GresConfError != "" && !r.GresConfAbsent {
		return fmt.Errorf("gres.conf cannot be used: %s", r.GresConfError)
	}
	bad := 0
	for _, g := range r.GPUs {
		if !g.Passable {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d configured GPU(s) cannot be passed through now", bad, len(r.GPUs))
	}
	if d := r.Driver; d != nil && d.Inject && d.Error != "" && len(r.GPUs) > 0 {
		return fmt.Errorf("GPU steps would fail: %s", d.Error)
	}
	return nil
}

// RuleName is a short name of the rule err breaks ("shared-iommu-group"),
// "" when it wraps none of the Err* values.
func RuleName(err error) string {
	for _, r := range []struct {
		err  error
		name string
	}{
		{ErrStepGPUs, "step-gpus"}, {ErrGresConf, "gres-conf"}, {ErrNotInGresConf, "not-in-gres-conf"},
		{ErrUnsupportedFile, "unsupported-file"}, {ErrNoIOMMU, "no-iommu"}, {ErrSharedGroup, "shared-iommu-group"},
		{ErrWrongDriver, "wrong-driver"}, {ErrMIGEnabled, "mig-enabled"}, {ErrRelease, "release"}, {ErrBusy, "busy"},
		{ErrVFIO, "vfio"}, {ErrAddressSpace, "address-space"}, {ErrRebind, "rebind"}, {ErrNoDevice, "no-device"},
		{ErrNVMLUnavailable, "nvml"},
	} {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return ""
}

// Inspect reports the node's GPUs and host readiness. It only reads; a
// missing gres.conf is reported, not returned.
func Inspect(ctx context.Context, req InspectRequest) *Report {
	r := req.Roots
	rep := &Report{Host: hostChecks(r), GPUs: []GPUStatus{}}
	pl, err := newPlanner(ctx, Request{GresConf: req.GresConf, Node: req.Node, Roots: r, NVML: req.NVML, AllowRebind: req.AllowRebind})
	if err != nil {
		rep.GresConf, rep.Node, rep.NVML = or(req.GresConf, DefaultGresConf), or(req.Node, shortHostname()), "not used"
		rep.GresConfError = err.Error()
		rep.NoGPUs = "gres.conf cannot be used: " + err.Error()
		if errors.Is(err, fs.ErrNotExist) {
			rep.GresConfAbsent = true
			rep.NoGPUs = fmt.Sprintf("no gres.conf at %s: Slurm has no GPUs configured on this node", rep.GresConf)
		}
		if req.NVML != nil {
			if _, err := req.NVML.Devices(ctx); err != nil {
				rep.NVML = err.Error()
			} else {
				rep.NVML = "available"
			}
		}
	} else {
		rep.GresConf, rep.Node, rep.NVML, rep.AutoDetect = pl.conf.Path, pl.conf.Node, pl.nvmlMsg, pl.conf.AutoDetect
		rep.Notes = append(rep.Notes, pl.conf.Notes...)
		if len(pl.conf.Devices) == 0 {
			rep.NoGPUs = fmt.Sprintf("%s lists no gpu device files (Name=gpu File=...) for node %q", pl.conf.Path, pl.conf.Node)
		}
		for _, d := range pl.conf.Devices {
			rep.GPUs = append(rep.GPUs, pl.status(d))
		}
	}
	rep.Host = append(rep.Host, Check{Name: "nvml", OK: rep.NVML == "available", Detail: rep.NVML})
	rep.Unlisted = unlisted(r, rep.GPUs)
	if rep.NoGPUs != "" && len(rep.Unlisted) > 0 {
		rep.NoGPUs += fmt.Sprintf(" (%d NVIDIA GPU(s) in sysfs are not in gres.conf)", len(rep.Unlisted))
	} else if rep.NoGPUs != "" {
		rep.NoGPUs += "; no NVIDIA GPU in " + r.SysPath("bus", "pci", "devices")
	}
	return rep
}

func (pl *planner) status(d GresDevice) GPUStatus {
	st := GPUStatus{Index: d.Index, File: d.File, Gres: d.Entry, GresWhere: d.Where(), IOMMUGroup: -1, Minor: -1, NVMLIndex: -1}
	p, errs := pl.plan([]int{d.Index})
	if len(p.GPUs) == 1 {
		g := p.GPUs[0]
		st.BDF, st.IOMMUGroup, st.Members, st.Minor = g.BDF, g.IOMMUGroup, g.Members, g.Minor
		st.NVMLIndex, st.UUID, st.Name, st.MIG = g.NVMLIndex, g.UUID, g.Name, g.MIG
		for _, f := range g.Functions {
			if f.BDF == g.BDF {
				st.Driver = or(f.Driver, "none")
			}
			if f.Rebind {
				st.Rebind = append(st.Rebind, f.BDF)
			}
		}
	}
	st.Passable = len(errs) == 0
	var why []string
	for _, e := range errs {
		why = append(why, e.Error())
		if n := RuleName(e); n != "" {
			st.Rules = append(st.Rules, n)
		}
	}
	st.Why = strings.Join(why, "; ")
	return st
}

// hostChecks: IOMMU on, vfio-pci loaded, /dev/vfio and its permissions,
// and whether the NVIDIA driver is loaded.
func hostChecks(r Roots) []Check {
	var out []Check
	groups, _ := os.ReadDir(r.SysPath("kernel", "iommu_groups"))
	units, _ := os.ReadDir(r.SysPath("class", "iommu"))
	c := Check{Name: "iommu", OK: len(groups) > 0 || len(units) > 0}
	if c.OK {
		c.Detail = fmt.Sprintf("%d IOMMU groups, %d IOMMU units", len(groups), len(units))
	} else {
		c.Detail = fmt.Sprintf("%s and %s are empty: the IOMMU is off; boot with intel_iommu=on iommu=pt (Intel) or amd_iommu=on iommu=pt (AMD)",
			r.SysPath("kernel", "iommu_groups"), r.SysPath("class", "iommu"))
	}
	out = append(out, c)

	c = Check{Name: "vfio-pci"}
	if _, err := os.Stat(r.SysPath("bus", "pci", "drivers", VFIODriver)); err == nil {
		c.OK, c.Detail = true, "driver loaded"
		if ents, err := os.ReadDir(r.SysPath("bus", "pci", "drivers", VFIODriver)); err == nil {
			var bound []string
			for _, e := range ents {
				if pci.ValidBDF(e.Name()) {
					bound = append(bound, e.Name())
				}
			}
			if len(bound) > 0 {
				c.Detail += "; bound: " + strings.Join(bound, " ")
			}
		}
	} else {
		c.Detail = "driver not loaded (no " + r.SysPath("bus", "pci", "drivers", VFIODriver) + "): modprobe vfio-pci"
	}
	out = append(out, c)

	c = Check{Name: "/dev/vfio"}
	if st, err := os.Stat(r.DevPath("/dev/vfio/vfio")); err != nil {
		c.Detail = "/dev/vfio/vfio does not exist: modprobe vfio-pci"
	} else if st.Mode()&os.ModeCharDevice == 0 {
		c.Detail = "/dev/vfio/vfio is not a character device"
	} else {
		c.OK = true
		parts := []string{"vfio " + permString(st)}
		ents, _ := os.ReadDir(r.DevPath("/dev/vfio"))
		sort.Slice(ents, func(i, j int) bool { return numLess(ents[i].Name(), ents[j].Name()) })
		for _, e := range ents {
			if e.Name() == "vfio" {
				continue
			}
			if st, err := os.Stat(r.DevPath("/dev/vfio/" + e.Name())); err == nil {
				parts = append(parts, e.Name()+" "+permString(st))
			}
		}
		c.Detail = strings.Join(parts, "; ") + " (QEMU opens them as root before -runas)"
	}
	out = append(out, c)

	c = Check{Name: "nvidia driver"}
	if infos, err := nvidiaGPUs(r); err == nil {
		c.OK, c.Detail = true, fmt.Sprintf("loaded, %d GPU(s) in %s", len(infos), r.ProcPath("driver", "nvidia", "gpus"))
	} else {
		c.OK, c.Detail = true, "not loaded (GPUs must then be listed as /dev/vfio/<group>)"
	}
	out = append(out, c)
	return out
}

func permString(st os.FileInfo) string {
	owner, group := "?", "?"
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		owner, group = strconv.Itoa(int(sys.Uid)), strconv.Itoa(int(sys.Gid))
		if u, err := user.LookupId(owner); err == nil {
			owner = u.Username
		}
		if g, err := user.LookupGroupId(group); err == nil {
			group = g.Name
		}
	}
	return fmt.Sprintf("%s %s:%s", st.Mode().String(), owner, group)
}

func numLess(a, b string) bool {
	x, err1 := strconv.Atoi(a)
	y, err2 := strconv.Atoi(b)
	if err1 == nil && err2 == nil {
		return x < y
	}
	return a < b
}

// unlisted finds NVIDIA display-class functions that no listed GPU maps to.
func unlisted(r Roots, listed []GPUStatus) []UnlistedGPU {
	known := map[string]bool{}
	for _, g := range listed {
		known[g.BDF] = true
		for _, m := range g.Members {
			known[m.BDF] = true
		}
	}
	ents, err := os.ReadDir(r.SysPath("bus", "pci", "devices"))
	if err != nil {
		return nil
	}
	var out []UnlistedGPU
	for _, e := range ents {
		if !pci.ValidBDF(e.Name()) || known[e.Name()] {
			continue
		}
		info, err := r.ReadPCI(e.Name())
		if err != nil || info.Vendor != 0x10de || !isDisplay(info.Class) {
			continue
		}
		out = append(out, UnlistedGPU{BDF: info.BDF, Desc: info.Describe(), IOMMUGroup: info.Group})
	}
	return out
}
