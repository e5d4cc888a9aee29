package sriov_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/network/sriov"
	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// fakeHost is a fake /sys, /proc and /dev under t.TempDir(), laid out as
// Linux 6.1 lays them out for an SR-IOV adapter (mlx5_core): the PF's
// sriov_* attributes and virtfn<n> links, each VF's physfn link, driver,
// IOMMU group, net/<if> and infiniband/<dev> directories while its host
// driver has it, /sys/class/net and /sys/class/infiniband links.
type fakeHost struct {
	t     *testing.T
	root  string
	roots sriov.Roots

	mu  sync.Mutex
	ops []string // sysfs writes seen by the fake kernel, "path=value"
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	root := t.TempDir()
	h := &fakeHost{t: t, root: root, roots: sriov.Roots{
		Sys: filepath.Join(root, "sys"), Proc: filepath.Join(root, "proc"), Dev: filepath.Join(root, "dev"),
	}}
	for _, d := range []string{"sys/bus/pci/devices", "sys/kernel/iommu_groups", "sys/class/net", "sys/class/infiniband", "proc", "dev/vfio"} {
		h.mkdir(d)
	}
	for _, drv := range []string{"vfio-pci", "mlx5_core", "pcieport", "nvme"} {
		h.mkdir("sys/bus/pci/drivers/" + drv)
		h.write("sys/bus/pci/drivers/"+drv+"/bind", "")
		h.write("sys/bus/pci/drivers/"+drv+"/unbind", "")
	}
	h.write("sys/bus/pci/drivers_probe", "")
	h.write("dev/vfio/vfio", "")
	return h
}

func (h *fakeHost) path(rel string) string { return filepath.Join(h.root, rel) }

func (h *fakeHost) mkdir(rel string) {
	h.t.Helper()
	if err := os.MkdirAll(h.path(rel), 0o755); err != nil {
		h.t.Fatal(err)
	}
}

func (h *fakeHost) write(rel, content string) {
	h.t.Helper()
	if err := os.MkdirAll(filepath.Dir(h.path(rel)), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(h.path(rel), []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *fakeHost) symlink(target, rel string) {
	h.t.Helper()
	_ = os.Remove(h.path(rel))
	if err := os.Symlink(target, h.path(rel)); err != nil {
		h.t.Fatal(err)
	}
}

// fn is one PCI function of the fake host.
type fn struct {
	bdf    string
	class  uint32
	vendor uint16
	device uint16
	driver string
	group  int // -1: no IOMMU group
	bar0   uint64
}

const mem64Pre = 0x0014220c // 64-bit prefetchable, as sysfs shows mlx5 BARs

func (h *fakeHost) addPCI(f fn) {
	h.t.Helper()
	dir := "sys/bus/pci/devices/" + f.bdf
	h.mkdir(dir)
	h.write(dir+"/class", fmt.Sprintf("0x%06x\n", f.class))
	h.write(dir+"/vendor", fmt.Sprintf("0x%04x\n", f.vendor))
	h.write(dir+"/device", fmt.Sprintf("0x%04x\n", f.device))
	h.write(dir+"/driver_override", "(null)\n")
	var res strings.Builder
	for i := 0; i < 13; i++ {
		if i == 0 && f.bar0 > 0 {
			start := uint64(0x380000000000)
			fmt.Fprintf(&res, "0x%016x 0x%016x 0x%016x\n", start, start+f.bar0-1, uint64(mem64Pre))
			continue
		}
		res.WriteString("0x0000000000000000 0x0000000000000000 0x0000000000000000\n")
	}
	h.write(dir+"/resource", res.String())
	if f.group >= 0 {
		g := "sys/kernel/iommu_groups/" + strconv.Itoa(f.group)
		h.mkdir(g + "/devices")
		h.symlink(h.path(g), dir+"/iommu_group")
		h.symlink(h.path(dir), g+"/devices/"+f.bdf)
	}
	if f.driver != "" {
		h.bindLink(f.bdf, f.driver)
	}
}

// ConnectX-7 in InfiniBand mode: PF 15b3:1021 (class 0x0207), its VFs
// 15b3:101e ("ConnectX Family mlx5Gen Virtual Function").
const (
	mlxVendor = 0x15b3
	cx7PF     = 0x1021
	cx7VF     = 0x101e
)

// pfWithVFs adds PF pfBDF (mlx5_core, group pfGroup, interface pfNet,
// RDMA device mlx5_0) with len(groups) VFs at functions 2.. of its slot,
// VF i in IOMMU group groups[i], on vfDriver.
func (h *fakeHost) pfWithVFs(pfBDF string, pfGroup int, pfNet string, groups []int, vfDriver string) []string {
	h.t.Helper()
	h.addPCI(fn{bdf: pfBDF, class: 0x020700, vendor: mlxVendor, device: cx7PF, driver: "mlx5_core", group: pfGroup, bar0: 32 << 20})
	dir := "sys/bus/pci/devices/" + pfBDF
	h.write(dir+"/sriov_totalvfs", "8\n")
	h.write(dir+"/sriov_numvfs", fmt.Sprintf("%d\n", len(groups)))
	h.netdev(pfBDF, pfNet, false)
	h.rdma(pfBDF, "mlx5_0", 0)
	var vfs []string
	slot := pfBDF[:len(pfBDF)-2]
	for i, g := range groups {
		vf := fmt.Sprintf("%s.%d", slot, i+2)
		h.addPCI(fn{bdf: vf, class: 0x020700, vendor: mlxVendor, device: cx7VF, group: g, bar0: 1 << 20})
		h.symlink("../"+vf, dir+fmt.Sprintf("/virtfn%d", i))
		h.symlink("../"+pfBDF, "sys/bus/pci/devices/"+vf+"/physfn")
		if vfDriver != "" {
			h.bindLink(vf, vfDriver)
		}
		vfs = append(vfs, vf)
	}
	return vfs
}

// netdev gives bdf an interface (up or down) as its driver registers it.
func (h *fakeHost) netdev(bdf, name string, up bool) {
	flags := "0x1002\n" // IFF_BROADCAST|IFF_MULTICAST
	if up {
		flags = "0x1003\n"
	}
	dir := "sys/bus/pci/devices/" + bdf + "/net/" + name
	h.write(dir+"/flags", flags)
	h.symlink(h.path("sys/bus/pci/devices/"+bdf), dir+"/device")
	h.symlink(h.path(dir), "sys/class/net/"+name)
}

// rdma gives bdf an RDMA device and its verbs device file uverbs<n>.
func (h *fakeHost) rdma(bdf, name string, n int) {
	dir := "sys/bus/pci/devices/" + bdf + "/infiniband/" + name
	h.mkdir(dir)
	h.mkdir(fmt.Sprintf("sys/bus/pci/devices/%s/infiniband_verbs/uverbs%d", bdf, n))
	h.symlink(h.path("sys/bus/pci/devices/"+bdf), dir+"/device")
	h.symlink(h.path(dir), "sys/class/infiniband/"+name)
	h.write(fmt.Sprintf("dev/infiniband/uverbs%d", n), "")
}

// bindLink records bdf as bound to drv, as the driver core does; mlx5_core
// registers a VF's interface and RDMA device, which unbinding removes.
func (h *fakeHost) bindLink(bdf, drv string) {
	h.symlink(h.path("sys/bus/pci/drivers/"+drv), "sys/bus/pci/devices/"+bdf+"/driver")
	h.symlink(h.path("sys/bus/pci/devices/"+bdf), "sys/bus/pci/drivers/"+drv+"/"+bdf)
	if drv == pci.VFIODriver {
		if g, err := os.Readlink(h.path("sys/bus/pci/devices/" + bdf + "/iommu_group")); err == nil {
			h.write("dev/vfio/"+filepath.Base(g), "")
		}
	}
	if _, err := os.Lstat(h.path("sys/bus/pci/devices/" + bdf + "/physfn")); err == nil && drv == "mlx5_core" {
		fnum := bdf[len(bdf)-1:]
		h.netdev(bdf, "ib0v"+fnum, false)
		n, _ := strconv.Atoi(fnum)
		h.rdma(bdf, "mlx5_"+fnum, n)
	}
}

func (h *fakeHost) driverOf(bdf string) string {
	t, err := os.Readlink(h.path("sys/bus/pci/devices/" + bdf + "/driver"))
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

// kernel is the fake kernel's side of sysfs writes: driver_override,
// drivers/<d>/unbind, drivers/<d>/bind and drivers_probe.
func (h *fakeHost) kernel(path, value string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, strings.TrimPrefix(path, h.path("sys")+"/")+"="+strings.TrimSpace(value))
	rel, err := filepath.Rel(h.path("sys/bus/pci"), path)
	if err != nil {
		return err
	}
	parts := strings.Split(rel, "/")
	v := strings.TrimSpace(value)
	switch {
	case len(parts) == 3 && parts[0] == "devices" && parts[2] == "driver_override":
		if v == "" {
			v = "(null)"
		}
		return os.WriteFile(path, []byte(v+"\n"), 0o644)
	case len(parts) == 3 && parts[0] == "drivers" && parts[2] == "unbind":
		if h.driverOf(v) != parts[1] {
			return syscall.ENODEV
		}
		dev := h.path("sys/bus/pci/devices/" + v)
		os.Remove(dev + "/driver")
		os.Remove(h.path("sys/bus/pci/drivers/" + parts[1] + "/" + v))
		if parts[1] == "mlx5_core" {
			for _, sub := range []string{"net", "infiniband", "infiniband_verbs"} {
				ents, _ := os.ReadDir(filepath.Join(dev, sub))
				for _, e := range ents {
					os.Remove(h.path("sys/class/" + sub + "/" + e.Name()))
				}
				os.RemoveAll(filepath.Join(dev, sub))
			}
		}
		if parts[1] == pci.VFIODriver {
			if g, err := os.Readlink(dev + "/iommu_group"); err == nil {
				os.Remove(h.path("dev/vfio/" + filepath.Base(g)))
			}
		}
		return nil
	case len(parts) == 3 && parts[0] == "drivers" && parts[2] == "bind":
		ov, _ := os.ReadFile(h.path("sys/bus/pci/devices/" + v + "/driver_override"))
		if o := strings.TrimSpace(string(ov)); o != "(null)" && o != parts[1] {
			return syscall.ENODEV
		}
		if h.driverOf(v) != "" {
			return syscall.EBUSY
		}
		h.bindLink(v, parts[1])
		return nil
	case len(parts) == 1 && parts[0] == "drivers_probe":
		ov, _ := os.ReadFile(h.path("sys/bus/pci/devices/" + v + "/driver_override"))
		if o := strings.TrimSpace(string(ov)); o != "(null)" && h.driverOf(v) == "" {
			h.bindLink(v, o)
		}
		return nil
	}
	return fmt.Errorf("fake kernel: unexpected write %s", path)
}

// holder makes process pid (comm) hold target (a host path) open as fd 3.
func (h *fakeHost) holder(pid int, comm, target string) {
	h.mkdir(fmt.Sprintf("proc/%d/fd", pid))
	h.write(fmt.Sprintf("proc/%d/comm", pid), comm+"\n")
	h.symlink(target, fmt.Sprintf("proc/%d/fd/3", pid))
}

// claimDir is the node's claim directory of the test.
func (h *fakeHost) claimDir() string { return h.path("run/slurm-microvm/n1/sriov") }
