package gpu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// Request is what Plan maps.
type Request struct {
	// StepGPUs is SLURM_STEP_GPUS: the node's global GPU indices
	// ("0,1,4,5"); "" means no GPUs.
	StepGPUs string
	// GresConf is the gres.conf path ("" = DefaultGresConf).
	GresConf string
	// Node is the Slurm node name NodeName= lines are matched against
	// ("" = the short host name; differs under multiple-slurmd).
	Node string
	// Roots locate /sys, /proc and /dev (zero value: the real ones).
	Roots Roots
	// NVML, when set, gives UUIDs, MIG mode, running processes and a
	// second minor -> PCI address source. A library that fails to load is
	// noted in Plan.NVML and the plan goes on from sysfs and procfs.
	NVML NVML
	// AllowRebind lets Bind move group members that are on another driver
	// (nvidia, snd_hda_intel, none) to vfio-pci, and Release move them
	// back. Without it such members are refused (ErrWrongDriver).
	AllowRebind bool
	// GuestMemoryMiB, when set, is checked with the PCI hole against the
	// host CPU's physical address width (ErrAddressSpace).
	GuestMemoryMiB uint64
	// NVSwitch is the node's rule for multi-GPU steps when its GPUs are
	// linked by NVSwitch: "refuse" ("" too; ErrNVSwitch) or
	// "without-nvlink" (a note says the step has no NVLink).
	NVSwitch string
}

// Plan is how a step's GPUs reach its VM. It is plain data (JSON) so a
// fresh process can Release it: write it into the step's state directory.
type Plan struct {
	// StepGPUs is the SLURM_STEP_GPUS the plan was made from.
	StepGPUs string `json:"step_gpus"`
	// Node and GresConf are where the mapping came from.
	Node     string `json:"node"`
	GresConf string `json:"gres_conf"`
	Roots    Roots  `json:"roots"`
	// AllowRebind is Request.AllowRebind.
	AllowRebind bool `json:"allow_rebind"`
	// GPUs are in guest order: sorted by Slurm index, GPUs[i].Guest == i.
	GPUs []GPU `json:"gpus"`
	// NVML says whether NVML was used: "available", "not available:
	// <reason>", or "not used".
	NVML string `json:"nvml"`
	// HostPhysBits is the host CPU's physical address width (0: unknown).
	HostPhysBits int `json:"host_phys_bits,omitempty"`
	// Notes are facts worth a line in the step's debug log.
	Notes []string `json:"notes,omitempty"`

	nvml  NVML
	write func(path, value string) error
}

// GPU is one allocated GPU: the PCI device in its IOMMU group that
// gres.conf names, with every function the guest gets.
type GPU struct {
	// Index is Slurm's global index (an element of SLURM_STEP_GPUS).
	Index int `json:"index"`
	// Guest is the index the guest sees (0..n-1; CUDA_VISIBLE_DEVICES).
	Guest int `json:"guest"`
	// File is the gres.conf device file; Gres the whole entry.
	File string     `json:"file"`
	Gres GresDevice `json:"gres"`
	// Minor is the NVIDIA device minor (/dev/nvidia<Minor>) when gres.conf
	// names the GPU by it or the nvidia driver has it; -1 otherwise.
	Minor int `json:"minor"`
	// BDF is the PCI address of the GPU function.
	BDF string `json:"bdf"`
	// IOMMUGroup is its IOMMU group; VFIOGroupFile the host's
	// /dev/vfio/<group>.
	IOMMUGroup    int    `json:"iommu_group"`
	VFIOGroupFile string `json:"vfio_group_file"`
	// Functions are the GPU's PCI functions the guest gets (the GPU and,
	// e.g., its audio function), function 0 first.
	Functions []Function `json:"functions"`
	// Members is the whole IOMMU group with each member's role.
	Members []Member `json:"members"`
	// NVMLIndex, UUID, Name and MIG come from NVML (or the nvidia
	// driver's procfs); NVMLIndex is -1 and MIG "" when unknown.
	NVMLIndex int    `json:"nvml_index"`
	UUID      string `json:"uuid,omitempty"`
	Name      string `json:"name,omitempty"`
	MIG       string `json:"mig,omitempty"`

	nvml *NVMLDevice
}

// Function is one PCI function passed to the guest.
type Function struct {
	BDF    string `json:"bdf"`
	Class  uint32 `json:"class"`
	Vendor uint16 `json:"vendor"`
	Device uint16 `json:"device"`
	// Driver is the driver it was bound to when planned ("" = none).
	Driver string `json:"driver"`
	// Rebind: Bind moves it to vfio-pci, Release back to Driver.
	Rebind bool  `json:"rebind,omitempty"`
	BARs   []BAR `json:"bars,omitempty"`
}

// Roles of IOMMU group members.
const (
	RoleGPU       = "gpu"       // the GPU function gres.conf names
	RoleFunction  = "function"  // another function of the same PCI device (audio, USB)
	RoleAllocated = "allocated" // a function of another GPU of the same step
	RoleBridge    = "bridge"    // a bridge: may stay on its driver, not passed
	RoleForeign   = "foreign"   // anything else: the group cannot be passed
)

// Member is one device of an IOMMU group.
type Member struct {
	BDF    string `json:"bdf"`
	Desc   string `json:"desc"`
	Driver string `json:"driver"`
	Role   string `json:"role"`
	// GresIndex is the Slurm index of the GPU this member is, when
	// gres.conf names it (-1 otherwise).
	GresIndex int `json:"gres_index"`
}

// ParseStepGPUs parses SLURM_STEP_GPUS ("0,1,4,5"; ranges such as "0-3"
// are accepted too) into sorted, distinct indices. "" gives none. Slurm's
// "NoDevFiles" (gres.conf has no File=) is an error.
func ParseStepGPUs(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	if strings.EqualFold(s, "NoDevFiles") {
		return nil, fmt.Errorf("%w %q: gres.conf lists no File= for this node's GPUs, so Slurm cannot say which GPUs the step has; list them with File= (see etc/gres.conf)", ErrStepGPUs, s)
	}
	seen := map[int]bool{}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		l, err := strconv.Atoi(lo)
		h := l
		if err == nil && isRange {
			h, err = strconv.Atoi(hi)
		}
		if err != nil || l < 0 || h < l || h-l > 4096 {
			return nil, fmt.Errorf("%w %q: %q is not a GPU index or range", ErrStepGPUs, s, part)
		}
		for i := l; i <= h; i++ {
			if seen[i] {
				return nil, fmt.Errorf("%w %q: GPU %d listed twice", ErrStepGPUs, s, i)
			}
			seen[i] = true
			out = append(out, i)
		}
	}
	sort.Ints(out)
	return out, nil
}

// NewPlan maps the step's GPUs (SLURM_STEP_GPUS) to PCI devices through the
// node's gres.conf and checks that each can be passed to the step's VM
// whole and alone: every non-bridge member of each IOMMU group is a
// function of an allocated GPU, bound to vfio-pci (or, with AllowRebind,
// free to be rebound: no NVML processes, nobody holding /dev/nvidiaN),
// no MIG mode, the VFIO group device present and unused, and the PCI hole
// within the CPU's address width. It reads only; Bind changes drivers.
//
// No GPUs ("") gives an empty plan. Errors are *DeviceError (or a
// *ListError of them, one line) wrapping the Err* rule.
func NewPlan(ctx context.Context, req Request) (*Plan, error) {
	idx, err := ParseStepGPUs(req.StepGPUs)
	if err != nil {
		return nil, err
	}
	if len(idx) == 0 {
		return &Plan{StepGPUs: req.StepGPUs, Roots: req.Roots, NVML: "not used"}, nil
	}
	pl, err := newPlanner(ctx, req)
	if err != nil {
		return nil, err
	}
	p, errs := pl.plan(idx)
	if len(errs) > 0 {
		return nil, joinErrors("SLURM_STEP_GPUS="+req.StepGPUs, errs)
	}
	return p, nil
}

// planner holds what every GPU's mapping reads once.
type planner struct {
	req     Request
	r       Roots
	conf    *GresConf
	nvml    []NVMLDevice
	nvmlMsg string
	proc    []nvidiaProcInfo
	procErr error
}

func newPlanner(ctx context.Context, req Request) (*planner, error) {
	if req.GresConf == "" {
		req.GresConf = DefaultGresConf
	}
	if req.Node == "" {
		req.Node = shortHostname()
	}
	pl := &planner{req: req, r: req.Roots, nvmlMsg: "not used"}
	conf, err := LoadGresConf(req.GresConf, req.Node)
	if err != nil {
		return nil, err
	}
	pl.conf = conf
	if req.NVML != nil {
		devs, err := req.NVML.Devices(ctx)
		if err != nil {
			pl.nvmlMsg = err.Error()
			if !errors.Is(err, ErrNVMLUnavailable) {
				pl.nvmlMsg = ErrNVMLUnavailable.Error() + ": " + err.Error()
			}
		} else {
			pl.nvml = devs
			pl.nvmlMsg = "available"
		}
	}
	pl.proc, pl.procErr = nvidiaGPUs(pl.r)
	return pl, nil
}

func shortHostname() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	h, _, _ = strings.Cut(h, ".")
	return h
}

// plan maps and checks the given indices together.
func (pl *planner) plan(indices []int) (*Plan, []error) {
	p := &Plan{
		StepGPUs:     pl.req.StepGPUs,
		Node:         pl.conf.Node,
		GresConf:     pl.conf.Path,
		Roots:        pl.r,
		AllowRebind:  pl.req.AllowRebind,
		NVML:         pl.nvmlMsg,
		HostPhysBits: physBits(pl.r),
		Notes:        append([]string(nil), pl.conf.Notes...),
		nvml:         pl.req.NVML,
	}
	if p.NVML != "available" && p.NVML != "not used" {
		p.Notes = append(p.Notes, p.NVML+" (continuing with sysfs and procfs)")
	}
	var errs []error
	for _, i := range indices {
		g, err := pl.resolve(i)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		g.Guest = len(p.GPUs)
		p.GPUs = append(p.GPUs, *g)
	}
	if len(errs) > 0 {
		return p, errs
	}
	errs = append(errs, pl.checkGroups(p)...)
	errs = append(errs, pl.checkNVSwitch(p)...)
	errs = append(errs, pl.checkUse(p)...)
	if len(errs) > 0 {
		return p, errs
	}
	errs = append(errs, pl.checkHost(p)...)
	return p, errs
}

// resolve maps one Slurm index to its PCI device and IOMMU group.
func (pl *planner) resolve(idx int) (*GPU, error) {
	d, ok := pl.conf.Device(idx)
	if !ok {
		return nil, &DeviceError{Index: idx, Rule: ErrNotInGresConf, Detail: fmt.Sprintf(
			"not in gres.conf: %s lists %s for node %q", pl.conf.Path, countGPUs(len(pl.conf.Devices)), pl.conf.Node)}
	}
	g := &GPU{Index: idx, File: d.File, Gres: d, Minor: -1, IOMMUGroup: -1, NVMLIndex: -1}
	fail := func(rule error, format string, a ...any) error {
		return &DeviceError{Index: idx, File: d.File, BDF: g.BDF, Rule: rule, Detail: fmt.Sprintf(format, a...)}
	}
	if grp, ok := vfioGroupFromName(d.File); ok {
		g.IOMMUGroup = grp
		members, err := pl.r.GroupMembers(grp)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fail(ErrNoDevice, "IOMMU group %d does not exist on this host (no %s): no such VFIO device here (IOMMU off, or not a GPU node?)",
				grp, pl.r.SysPath("kernel", "iommu_groups", strconv.Itoa(grp)))
		}
		if err != nil {
			return nil, fail(ErrNoDevice, "read IOMMU group %d: %v", grp, err)
		}
		var gpus []pciInfo
		for _, m := range members {
			info, err := pl.r.ReadPCI(m)
			if err != nil {
				return nil, fail(ErrNoDevice, "read PCI device %s of IOMMU group %d: %v", m, grp, err)
			}
			if isDisplay(info.Class) && !info.Bridge {
				gpus = append(gpus, info)
			}
		}
		if len(gpus) == 0 {
			return nil, fail(ErrNoDevice, "IOMMU group %d holds no GPU (no display-class function among %s)", grp, strings.Join(members, ", "))
		}
		if len(gpus) > 1 && slotOf(gpus[0].BDF) != slotOf(gpus[len(gpus)-1].BDF) {
			var ds []string
			for _, x := range gpus {
				ds = append(ds, x.Describe())
			}
			return nil, fail(ErrSharedGroup, "IOMMU group %d holds %d GPUs (%s) but Slurm counts %s as one GPU: give each GPU its own IOMMU group (ACS on the PCIe switch) or list them as one gres.conf entry per group",
				grp, len(gpus), strings.Join(ds, ", "), d.File)
		}
		g.BDF = gpus[0].BDF
	} else {
		minor, ok := charDevMinor(pl.r.DevPath(d.File), nvidiaMajor)
		if !ok {
			minor, ok = nvidiaMinorFromName(d.File)
		}
		if !ok {
			if _, err := os.Stat(pl.r.DevPath(d.File)); err != nil {
				return nil, fail(ErrNoDevice, "device file does not exist (%v)", err)
			}
			return nil, fail(ErrUnsupportedFile, "%s is neither /dev/vfio/<group> nor an NVIDIA GPU (/dev/nvidia<minor>, character major %d); list the GPU's VFIO group or NVIDIA device in gres.conf", d.File, nvidiaMajor)
		}
		g.Minor = minor
		for _, pi := range pl.proc {
			if pi.Minor == minor {
				g.BDF, g.UUID, g.Name = pi.BDF, pi.UUID, pi.Model
			}
		}
		if g.BDF == "" {
			for _, nd := range pl.nvml {
				if nd.Minor == minor {
					g.BDF = nd.BDF
				}
			}
		}
		if g.BDF == "" {
			return nil, fail(ErrNoDevice, "no PCI device has NVIDIA device minor %d: %s; NVML %s",
				minor, pl.procStatus(), strings.TrimPrefix(pl.nvmlMsg, "NVML "))
		}
		info, err := pl.r.ReadPCI(g.BDF)
		if err != nil {
			return nil, fail(ErrNoDevice, "PCI device %s of NVIDIA minor %d not in sysfs: %v", g.BDF, minor, err)
		}
		if info.Group < 0 {
			return nil, fail(ErrNoIOMMU, "no IOMMU group (%s missing): the IOMMU is off; boot the host with intel_iommu=on iommu=pt (Intel) or amd_iommu=on iommu=pt (AMD)",
				pl.r.DevicePath(g.BDF, "iommu_group"))
		}
		g.IOMMUGroup = info.Group
	}
	g.VFIOGroupFile = fmt.Sprintf("/dev/vfio/%d", g.IOMMUGroup)
	if g.Minor < 0 { // a /dev/vfio/<group> entry whose GPU the nvidia driver still has
		for _, pi := range pl.proc {
			if pi.BDF == g.BDF {
				g.Minor, g.UUID, g.Name = pi.Minor, pi.UUID, pi.Model
			}
		}
	}
	for i := range pl.nvml {
		if nd := pl.nvml[i]; nd.BDF == g.BDF {
			g.nvml = &pl.nvml[i]
			g.NVMLIndex, g.UUID, g.MIG = nd.Index, nd.UUID, nd.MIG.String()
			if g.Minor < 0 {
				g.Minor = nd.Minor
			}
			if nd.Name != "" {
				g.Name = nd.Name
			}
		}
	}
	members, err := pl.r.GroupMembers(g.IOMMUGroup)
	if err != nil {
		return nil, fail(ErrNoDevice, "read IOMMU group %d: %v", g.IOMMUGroup, err)
	}
	for _, m := range members {
		info, err := pl.r.ReadPCI(m)
		if err != nil {
			return nil, fail(ErrNoDevice, "read PCI device %s of IOMMU group %d: %v", m, g.IOMMUGroup, err)
		}
		mem := Member{BDF: m, Desc: info.Describe(), Driver: info.Driver, GresIndex: pl.gresIndexOf(m)}
		switch {
		case info.Bridge:
			mem.Role = RoleBridge
		case m == g.BDF:
			mem.Role = RoleGPU
		case slotOf(m) == slotOf(g.BDF):
			mem.Role = RoleFunction
		default:
			mem.Role = RoleForeign // checkGroups turns allocated ones into RoleAllocated
		}
		g.Members = append(g.Members, mem)
		if mem.Role == RoleGPU || mem.Role == RoleFunction {
			g.Functions = append(g.Functions, Function{BDF: m, Class: info.Class, Vendor: info.Vendor, Device: info.Device, Driver: info.Driver, BARs: info.BARs})
		}
	}
	return g, nil
}

func countGPUs(n int) string {
	switch n {
	case 0:
		return "no gpu device files"
	case 1:
		return "1 gpu device file (index 0)"
	}
	return fmt.Sprintf("%d gpu device files (indices 0-%d)", n, n-1)
}

func (pl *planner) procStatus() string {
	dir := pl.r.ProcPath("driver", "nvidia", "gpus")
	if errors.Is(pl.procErr, fs.ErrNotExist) {
		return dir + " does not exist (NVIDIA driver not loaded)"
	}
	if pl.procErr != nil {
		return pl.procErr.Error()
	}
	return fmt.Sprintf("%s lists %d GPU(s), none with that minor (a GPU already bound to vfio-pci is not listed: name it as /dev/vfio/<group> in gres.conf)", dir, len(pl.proc))
}

// gresIndexOf is the Slurm index of the GPU at bdf when this node's
// gres.conf names it (through its NVIDIA minor), -1 otherwise.
func (pl *planner) gresIndexOf(bdf string) int {
	minor := -1
	for _, pi := range pl.proc {
		if pi.BDF == bdf {
			minor = pi.Minor
		}
	}
	for _, nd := range pl.nvml {
		if nd.BDF == bdf && minor < 0 {
			minor = nd.Minor
		}
	}
	for _, d := range pl.conf.Devices {
		if minor >= 0 {
			if m, ok := charDevMinor(pl.r.DevPath(d.File), nvidiaMajor); ok && m == minor {
				return d.Index
			}
			if m, ok := nvidiaMinorFromName(d.File); ok && m == minor {
				return d.Index
			}
		}
	}
	return -1
}

// checkGroups applies the group rules: every non-bridge member belongs
// to an allocated GPU's PCI device; each is on vfio-pci or may be rebound.
func (pl *planner) checkGroups(p *Plan) []error {
	allocated := map[string]int{}
	for _, g := range p.GPUs {
		allocated[slotOf(g.BDF)] = g.Index
	}
	var errs []error
	for gi := range p.GPUs {
		g := &p.GPUs[gi]
		var foreign []string
		for mi := range g.Members {
			m := &g.Members[mi]
			if m.Role != RoleForeign {
				continue
			}
			if _, ok := allocated[slotOf(m.BDF)]; ok {
				m.Role = RoleAllocated
				continue
			}
			d := m.Desc
			if m.GresIndex >= 0 {
				d += fmt.Sprintf(" = GPU %d, not allocated to this step", m.GresIndex)
			}
			foreign = append(foreign, d)
		}
		if len(foreign) > 0 {
			errs = append(errs, &DeviceError{Index: g.Index, File: g.File, BDF: g.BDF, Rule: ErrSharedGroup, Detail: fmt.Sprintf(
				"IOMMU group %d also holds %s: the VM would reach it; give the GPU its own IOMMU group (ACS on the PCIe switch, another slot) or keep this GPU out of --microvm steps",
				g.IOMMUGroup, strings.Join(foreign, ", "))})
			continue
		}
		for fi := range g.Functions {
			f := &g.Functions[fi]
			if f.Driver == VFIODriver {
				continue
			}
			if pl.req.AllowRebind {
				f.Rebind = true
				continue
			}
			drv := "bound to " + f.Driver
			if f.Driver == "" {
				drv = "bound to no driver"
			}
			errs = append(errs, &DeviceError{Index: g.Index, File: g.File, BDF: f.BDF, Rule: ErrWrongDriver, Detail: fmt.Sprintf(
				"%s (%s) is %s, not %s: bind it to %s on the node (e.g. driverctl set-override %s %s) or allow slurm-microvm to rebind GPUs (allow_rebind in microvm.toml)",
				f.BDF, pci.ClassName(f.Class), drv, VFIODriver, VFIODriver, f.BDF, VFIODriver)})
		}
	}
	return errs
}

// checkUse refuses MIG GPUs and GPUs something else uses: NVML processes
// or open /dev/nvidia<minor> on a GPU to be rebound, an open
// /dev/vfio/<group> (a VM of another step) on one already on vfio-pci.
func (pl *planner) checkUse(p *Plan) []error {
	var errs []error
	var paths []string
	for _, g := range p.GPUs {
		paths = append(paths, g.VFIOGroupFile)
		if g.Minor >= 0 {
			paths = append(paths, nvidiaDevFile(g.Minor))
		}
	}
	held, herr := pl.r.Holders(paths...)
	if herr != nil {
		p.Notes = append(p.Notes, fmt.Sprintf("could not scan %s for open devices: %v", pl.r.ProcPath(), herr))
	}
	for _, g := range p.GPUs {
		fail := func(rule error, format string, a ...any) {
			errs = append(errs, &DeviceError{Index: g.Index, File: g.File, BDF: g.BDF, Rule: rule, Detail: fmt.Sprintf(format, a...)})
		}
		if g.nvml != nil && g.nvml.MIG.Supported && g.nvml.MIG.Current {
			fail(ErrMIGEnabled, "MIG mode is %s: its MIG instances can serve other steps, so the GPU cannot be passed whole; disable MIG (nvidia-smi -i %d -mig 0, then reset the GPU) or keep MIG GPUs out of --microvm steps",
				g.nvml.MIG, g.nvml.Index)
			continue
		}
		if g.Functions[0].Rebind && g.nvml == nil {
			p.Notes = append(p.Notes, fmt.Sprintf("GPU %d (%s): MIG mode and running processes unknown (NVML %s); relying on the scan of open device files", g.Index, g.BDF, strings.TrimPrefix(p.NVML, "NVML ")))
		}
		if g.nvml != nil && len(g.nvml.Processes) > 0 {
			var ps []string
			for _, pr := range g.nvml.Processes {
				ps = append(ps, fmt.Sprintf("pid %d (%d MiB)", pr.PID, pr.UsedMemory>>20))
			}
			fail(ErrBusy, "NVML lists processes running on it: %s", strings.Join(ps, ", "))
			continue
		}
		if g.Minor >= 0 && g.Functions[0].Rebind {
			if hs := held[nvidiaDevFile(g.Minor)]; len(hs) > 0 {
				fail(ErrBusy, "%s is held open by %s: rebinding the GPU would pull it from under them; stop them first (for nvidia-persistenced: nvidia-smi drain -p %s -m 1)",
					nvidiaDevFile(g.Minor), pci.HolderList(hs), g.BDF)
				continue
			}
		}
		if hs := held[g.VFIOGroupFile]; len(hs) > 0 {
			fail(ErrBusy, "VFIO group %s is held open by %s (a VM of another step still running?)", g.VFIOGroupFile, pci.HolderList(hs))
		}
	}
	return errs
}

// checkHost checks what QEMU needs from the host: vfio-pci loaded when a
// rebind is planned, /dev/vfio/vfio, /dev/vfio/<group> for groups already
// on vfio-pci, and the address width for the PCI hole.
func (pl *planner) checkHost(p *Plan) []error {
	var errs []error
	rebind := false
	groups := map[int]bool{}
	for _, g := range p.GPUs {
		all := true
		for _, f := range g.Functions {
			if f.Rebind {
				rebind, all = true, false
			}
		}
		if all && !groups[g.IOMMUGroup] {
			groups[g.IOMMUGroup] = true
			if _, err := os.Stat(pl.r.DevPath(g.VFIOGroupFile)); err != nil {
				errs = append(errs, &DeviceError{Index: g.Index, File: g.File, BDF: g.BDF, Rule: ErrNoDevice, Detail: fmt.Sprintf(
					"VFIO group device %s does not exist although the group's devices are on %s", g.VFIOGroupFile, VFIODriver)})
			}
		}
	}
	if rebind {
		if _, err := os.Stat(pl.r.SysPath("bus", "pci", "drivers", VFIODriver)); err != nil {
			errs = append(errs, &DeviceError{Index: -1, Rule: ErrVFIO, Detail: fmt.Sprintf("the %s driver is not loaded (no %s): modprobe vfio-pci",
				VFIODriver, pl.r.SysPath("bus", "pci", "drivers", VFIODriver))})
		}
	} else if _, err := os.Stat(pl.r.DevPath("/dev/vfio/vfio")); err != nil {
		errs = append(errs, &DeviceError{Index: -1, Rule: ErrVFIO, Detail: "/dev/vfio/vfio does not exist: load vfio-pci (modprobe vfio-pci)"})
	}
	if pl.req.GuestMemoryMiB > 0 && p.HostPhysBits > 0 {
		if need := p.PhysBits(pl.req.GuestMemoryMiB); need > p.HostPhysBits {
			errs = append(errs, &DeviceError{Index: -1, Rule: ErrAddressSpace, Detail: fmt.Sprintf(
				"%d MiB of guest memory and a %d GiB PCI hole need %d physical address bits; this CPU has %d: allocate fewer GPUs or less memory per step",
				pl.req.GuestMemoryMiB, p.Hole64()>>30, need, p.HostPhysBits)})
		}
	}
	return errs
}

// checkNVSwitch refuses a multi-GPU step on a node whose GPUs are linked
// by NVSwitch: the switches stay on the host (they are no function of any
// GPU and serve every tenant's GPUs), so the VM's GPUs would reach each
// other over PCIe only, silently, unless the site accepted that
// (Request.NVSwitch "without-nvlink").
func (pl *planner) checkNVSwitch(p *Plan) []error {
	if len(p.GPUs) < 2 {
		return nil
	}
	sw := nvSwitches(pl.r)
	if len(sw) == 0 {
		return nil
	}
	if pl.req.NVSwitch == "without-nvlink" {
		p.Notes = append(p.Notes, fmt.Sprintf("this node's GPUs are linked by %d NVSwitch(es) that stay on the host: the step's %d GPUs talk over PCIe only, without NVLink (gpu.nvswitch = without-nvlink)", len(sw), len(p.GPUs)))
		return nil
	}
	return []error{&DeviceError{Index: -1, Rule: ErrNVSwitch, Detail: fmt.Sprintf(
		"this node's GPUs are linked by NVSwitch (%s), which stays on the host: the step's %d GPUs would run without NVLink. "+
			"Ask for one GPU, run Fabric Manager's shared NVSwitch multitenancy mode on the host with partitions the site activates, "+
			"or set gpu.nvswitch = \"without-nvlink\" in microvm.toml to accept PCIe-only peer traffic", strings.Join(sw, " "), len(p.GPUs))}}
}

func nvidiaDevFile(minor int) string { return fmt.Sprintf("/dev/nvidia%d", minor) }

// NeedsBind tells whether Bind has drivers to change.
func (p *Plan) NeedsBind() bool {
	for _, g := range p.GPUs {
		for _, f := range g.Functions {
			if f.Rebind {
				return true
			}
		}
	}
	return false
}

// VFIOGroupFiles are the host's /dev/vfio/<group> files the VM opens,
// once each, in guest order.
func (p *Plan) VFIOGroupFiles() []string {
	var out []string
	seen := map[string]bool{}
	for _, g := range p.GPUs {
		if !seen[g.VFIOGroupFile] {
			seen[g.VFIOGroupFile] = true
			out = append(out, g.VFIOGroupFile)
		}
	}
	return out
}
