package sriov

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// Roots locate /sys, /proc and /dev (package pci; zero value: the real ones).
type Roots = pci.Roots

// PF is one configured physical function and its virtual functions as
// sysfs shows them.
type PF struct {
	// Config is the entry of network.sriov.pfs ("ib0", "0000:3b:00.0").
	Config string `json:"config"`
	// BDF is its PCI address.
	BDF    string `json:"bdf"`
	Desc   string `json:"desc"`
	Driver string `json:"driver"`
	// Netdevs and RDMA are the PF's network interfaces and RDMA devices.
	Netdevs []string `json:"netdevs,omitempty"`
	RDMA    []string `json:"rdma,omitempty"`
	// NumVFs is sriov_numvfs (enabled), TotalVFs sriov_totalvfs (the most
	// the device offers).
	NumVFs   int  `json:"num_vfs"`
	TotalVFs int  `json:"total_vfs"`
	VFs      []VF `json:"vfs"`
}

// VF is one virtual function of a PF.
type VF struct {
	BDF string `json:"bdf"`
	// Index is n of the PF's virtfn<n> link.
	Index  int    `json:"index"`
	Class  uint32 `json:"class"`
	Vendor uint16 `json:"vendor"`
	Device uint16 `json:"device"`
	Desc   string `json:"desc"`
	// Driver is the driver bound now ("" = none).
	Driver string `json:"driver"`
	// IOMMUGroup is -1 without IOMMU; VFIOGroupFile is the host's
	// /dev/vfio/<group>.
	IOMMUGroup    int    `json:"iommu_group"`
	VFIOGroupFile string `json:"vfio_group_file,omitempty"`
	// Members is the VF's IOMMU group with each member's role.
	Members []Member `json:"members,omitempty"`
	// Netdevs, RDMA and Verbs are the host's names for the VF while its
	// host driver has it (none on vfio-pci): interfaces, RDMA devices
	// (mlx5_2) and verbs device files (/dev/infiniband/uverbs2).
	Netdevs []string  `json:"netdevs,omitempty"`
	RDMA    []string  `json:"rdma,omitempty"`
	Verbs   []string  `json:"verbs,omitempty"`
	BARs    []pci.BAR `json:"bars,omitempty"`
}

// Roles of IOMMU group members.
const (
	RoleVF      = "vf"      // the VF itself
	RoleBridge  = "bridge"  // a bridge: tolerated, not passed (as for GPUs)
	RoleForeign = "foreign" // anything else: the group cannot be passed
)

// Member is one device of a VF's IOMMU group.
type Member struct {
	BDF    string `json:"bdf"`
	Desc   string `json:"desc"`
	Driver string `json:"driver"`
	Role   string `json:"role"`
}

// ResolvePF finds the PCI address of a configured PF: a PCI address as
// is, a network interface through /sys/class/net/<name>/device, an RDMA
// device through /sys/class/infiniband/<name>/device. Errors: ErrNoPF
// when nothing has that name, ErrNotSRIOV when the device is a VF or has
// no SR-IOV capability (no sriov_totalvfs).
func ResolvePF(r Roots, name string) (string, error) {
	bdf, err := pci.NormalizeBDF(name)
	if err != nil {
		for _, class := range []string{"net", "infiniband"} {
			if b, _ := pci.LinkBase(r.SysPath("class", class, name, "device")); b != "" {
				bdf = b
				break
			}
		}
		if bdf == "" {
			return "", &DeviceError{PF: name, Rule: ErrNoPF, Detail: fmt.Sprintf(
				"no network interface %s or RDMA device %s (nor a PCI address): list the PF by a name `ip link` or `rdma dev` shows, or by its PCI address (lspci -D)",
				r.SysPath("class", "net", name), r.SysPath("class", "infiniband", name))}
		}
		if !pci.ValidBDF(bdf) {
			return "", &DeviceError{PF: name, Rule: ErrNoPF, Detail: fmt.Sprintf("%s is not on the PCI bus (its device is %q)", name, bdf)}
		}
	}
	if _, err := os.Stat(r.DevicePath(bdf)); err != nil {
		return "", &DeviceError{PF: name, Rule: ErrNoPF, Detail: fmt.Sprintf("no PCI device %s on this host", bdf), Err: err}
	}
	if pf, _ := pci.LinkBase(r.DevicePath(bdf, "physfn")); pf != "" {
		return "", &DeviceError{PF: name, Rule: ErrNotSRIOV, Detail: fmt.Sprintf("%s is a virtual function of %s: list the physical function", bdf, pf)}
	}
	if _, err := os.Stat(r.DevicePath(bdf, "sriov_totalvfs")); err != nil {
		return "", &DeviceError{PF: name, Rule: ErrNotSRIOV, Detail: fmt.Sprintf(
			"%s has no SR-IOV capability (no %s): enable SR-IOV in the adapter's firmware (mlxconfig -d %s set SRIOV_EN=1 NUM_OF_VFS=<n>) and in the BIOS",
			bdf, r.DevicePath(bdf, "sriov_totalvfs"), bdf)}
	}
	return bdf, nil
}

// ReadPF reads one configured PF and its VFs (each with its IOMMU group).
// It only reads. Errors: those of ResolvePF, and ErrNotSRIOV when no VF
// is enabled.
func ReadPF(r Roots, name string) (PF, error) {
	pf := PF{Config: name}
	bdf, err := ResolvePF(r, name)
	if err != nil {
		return pf, err
	}
	pf.BDF = bdf
	info, err := r.ReadPCI(bdf)
	if err != nil {
		return pf, &DeviceError{PF: name, Rule: ErrNoPF, Detail: "read " + bdf, Err: err}
	}
	pf.Desc, pf.Driver = info.Describe(), info.Driver
	pf.Netdevs, pf.RDMA = names(r, bdf, "net"), names(r, bdf, "infiniband")
	pf.NumVFs, _ = readInt(r.DevicePath(bdf, "sriov_numvfs"))
	pf.TotalVFs, _ = readInt(r.DevicePath(bdf, "sriov_totalvfs"))
	ents, err := os.ReadDir(r.DevicePath(bdf))
	if err != nil {
		return pf, &DeviceError{PF: name, Rule: ErrNoPF, Detail: "read " + r.DevicePath(bdf), Err: err}
	}
	for _, e := range ents {
		n, ok := strings.CutPrefix(e.Name(), "virtfn")
		idx, err := strconv.Atoi(n)
		if !ok || err != nil {
			continue
		}
		vbdf, err := pci.LinkBase(r.DevicePath(bdf, e.Name()))
		if err != nil || !pci.ValidBDF(vbdf) {
			continue
		}
		vf, err := readVF(r, vbdf, idx)
		if err != nil {
			return pf, &DeviceError{VF: vbdf, PF: name, Rule: ErrNoPF, Detail: "read the VF", Err: err}
		}
		pf.VFs = append(pf.VFs, vf)
	}
	sort.Slice(pf.VFs, func(i, j int) bool { return pf.VFs[i].Index < pf.VFs[j].Index })
	if len(pf.VFs) == 0 {
		return pf, &DeviceError{PF: name, Rule: ErrNotSRIOV, Detail: fmt.Sprintf(
			"%s has no virtual functions enabled (sriov_numvfs %d of %d): enable them at boot (echo <n> > %s, e.g. from a systemd unit or the NIC operator)",
			bdf, pf.NumVFs, pf.TotalVFs, "/sys/bus/pci/devices/"+bdf+"/sriov_numvfs")}
	}
	return pf, nil
}

func readVF(r Roots, bdf string, idx int) (VF, error) {
	info, err := r.ReadPCI(bdf)
	if err != nil {
		return VF{}, err
	}
	vf := VF{BDF: bdf, Index: idx, Class: info.Class, Vendor: info.Vendor, Device: info.Device, Desc: info.Describe(),
		Driver: info.Driver, IOMMUGroup: info.Group, BARs: info.BARs}
	vf.Netdevs, vf.RDMA = names(r, bdf, "net"), names(r, bdf, "infiniband")
	for _, v := range names(r, bdf, "infiniband_verbs") {
		vf.Verbs = append(vf.Verbs, "/dev/infiniband/"+v)
	}
	if vf.IOMMUGroup < 0 {
		return vf, nil
	}
	vf.VFIOGroupFile = fmt.Sprintf("/dev/vfio/%d", vf.IOMMUGroup)
	members, err := r.GroupMembers(vf.IOMMUGroup)
	if err != nil {
		return vf, fmt.Errorf("read IOMMU group %d: %w", vf.IOMMUGroup, err)
	}
	for _, m := range members {
		mi, err := r.ReadPCI(m)
		if err != nil {
			return vf, fmt.Errorf("read PCI device %s of IOMMU group %d: %w", m, vf.IOMMUGroup, err)
		}
		mem := Member{BDF: m, Desc: mi.Describe(), Driver: mi.Driver, Role: RoleForeign}
		switch {
		case m == bdf:
			mem.Role = RoleVF
		case mi.Bridge:
			mem.Role = RoleBridge
		}
		vf.Members = append(vf.Members, mem)
	}
	return vf, nil
}

// names lists the entries of /sys/bus/pci/devices/<bdf>/<sub> (net,
// infiniband, infiniband_verbs), sorted; none when absent.
func names(r Roots, bdf, sub string) []string {
	ents, err := os.ReadDir(r.DevicePath(bdf, sub))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// ifUp is IFF_UP (include/uapi/linux/if.h) in /sys/class/net/<dev>/flags.
const ifUp = 0x1

// upNetdevs lists the VF's interfaces the host has brought up: something
// on the host uses the VF (a container's interface, an address).
func upNetdevs(r Roots, vf VF) []string {
	var up []string
	for _, n := range vf.Netdevs {
		if v, err := pci.ReadHex(r.DevicePath(vf.BDF, "net", n, "flags"), 32); err == nil && v&ifUp != 0 {
			up = append(up, n)
		}
	}
	return up
}

// checkVF applies the passthrough rules to one VF read by ReadPF: an
// IOMMU group of its own (bridges tolerated, as for GPUs), on vfio-pci
// or free to be rebound (allowRebind, netdev down, verbs device closed),
// its VFIO group not open. held maps host device paths to holders
// (pci.Roots.Holders). It returns whether Bind must rebind it.
func checkVF(r Roots, pfName string, vf VF, allowRebind bool, held map[string][]pci.Holder) (rebind bool, err error) {
	fail := func(rule error, format string, a ...any) error {
		return &DeviceError{VF: vf.BDF, PF: pfName, Rule: rule, Detail: fmt.Sprintf(format, a...)}
	}
	if vf.IOMMUGroup < 0 {
		return false, fail(ErrNoIOMMU, "no IOMMU group (%s missing): the IOMMU is off; boot the host with intel_iommu=on iommu=pt (Intel) or amd_iommu=on iommu=pt (AMD)",
			r.DevicePath(vf.BDF, "iommu_group"))
	}
	var foreign []string
	for _, m := range vf.Members {
		if m.Role == RoleForeign {
			foreign = append(foreign, m.Desc)
		}
	}
	if len(foreign) > 0 {
		return false, fail(ErrSharedGroup, "IOMMU group %d also holds %s: the VM would reach it; give each VF its own IOMMU group (ACS on the root port or PCIe switch above the adapter: check `lspci -vvv` for ACSCtl, another slot), or leave this PF out of network.sriov.pfs",
			vf.IOMMUGroup, strings.Join(foreign, ", "))
	}
	if hs := held[vf.VFIOGroupFile]; len(hs) > 0 {
		return false, fail(ErrBusy, "VFIO group %s is held open by %s (a VM not started by this node's slurm-microvm?)", vf.VFIOGroupFile, pci.HolderList(hs))
	}
	if vf.Driver == pci.VFIODriver {
		if err := statOK(r.DevPath(vf.VFIOGroupFile)); err != nil {
			return false, fail(ErrVFIO, "VFIO group device %s does not exist although the VF is on %s", vf.VFIOGroupFile, pci.VFIODriver)
		}
		return false, nil
	}
	if !allowRebind {
		drv := "bound to " + vf.Driver
		if vf.Driver == "" {
			drv = "bound to no driver"
		}
		return false, fail(ErrWrongDriver, "%s is %s, not %s: bind the node's VFs to %s at boot (driverctl set-override %s %s) or let slurm-microvm rebind them (network.sriov.allow_rebind = true)",
			vf.BDF, drv, pci.VFIODriver, pci.VFIODriver, vf.BDF, pci.VFIODriver)
	}
	if err := statOK(r.SysPath("bus", "pci", "drivers", pci.VFIODriver)); err != nil {
		return false, fail(ErrVFIO, "the %s driver is not loaded (no %s): modprobe vfio-pci", pci.VFIODriver, r.SysPath("bus", "pci", "drivers", pci.VFIODriver))
	}
	if up := upNetdevs(r, vf); len(up) > 0 {
		return false, fail(ErrBusy, "its interface %s is up on the host: something uses it; bring it down or keep it out of the VF pool", strings.Join(up, ", "))
	}
	for _, v := range vf.Verbs {
		if hs := held[v]; len(hs) > 0 {
			return false, fail(ErrBusy, "%s is held open by %s: an RDMA program on the host uses the VF", v, pci.HolderList(hs))
		}
	}
	return true, nil
}

// heldDevices scans /proc once for the VFIO group and verbs files of vfs.
func heldDevices(r Roots, pfs []PF) (map[string][]pci.Holder, error) {
	var paths []string
	for _, pf := range pfs {
		for _, vf := range pf.VFs {
			if vf.VFIOGroupFile != "" {
				paths = append(paths, vf.VFIOGroupFile)
			}
			paths = append(paths, vf.Verbs...)
		}
	}
	held, err := r.Holders(paths...)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string][]pci.Holder{}, nil
	}
	return held, err
}

func readDirNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ents))
	for i, e := range ents {
		out[i] = e.Name()
	}
	return out, nil
}

func statOK(path string) error {
	_, err := os.Stat(path)
	return err
}
