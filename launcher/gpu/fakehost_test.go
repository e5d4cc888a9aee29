package gpu_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
)

// fakeHost is a fake /sys, /proc and /dev under t.TempDir(), laid out as
// Linux 6.1 lays them out for PCI devices, IOMMU groups, the nvidia
// driver's procfs and open files.
type fakeHost struct {
	t     *testing.T
	root  string
	roots gpu.Roots

	mu  sync.Mutex
	ops []string // sysfs writes seen by the fake kernel, "path=value"
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	root := t.TempDir()
	h := &fakeHost{t: t, root: root, roots: gpu.Roots{
		Sys: filepath.Join(root, "sys"), Proc: filepath.Join(root, "proc"), Dev: filepath.Join(root, "dev"),
	}}
	for _, d := range []string{"sys/bus/pci/devices", "sys/kernel/iommu_groups", "sys/class/iommu", "proc", "dev/vfio"} {
		h.mkdir(d)
	}
	for _, drv := range []string{"nvidia", "vfio-pci", "snd_hda_intel", "mlx5_core", "pcieport"} {
		h.mkdir("sys/bus/pci/drivers/" + drv)
		h.write("sys/bus/pci/drivers/"+drv+"/bind", "")
		h.write("sys/bus/pci/drivers/"+drv+"/unbind", "")
	}
	h.write("sys/bus/pci/drivers_probe", "")
	h.write("dev/vfio/vfio", "")
	h.write("proc/cpuinfo", "processor\t: 0\naddress sizes\t: 46 bits physical, 57 bits virtual\n")
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

// bar is one sysfs resource line.
type bar struct {
	index int
	size  uint64
	flags uint64
}

// Kernel resource flags as sysfs shows them for real GPUs.
const (
	mem32    = 0x00040200 // 32-bit, non-prefetchable
	mem64Pre = 0x0014220c // 64-bit, prefetchable
	ioPort   = 0x00040101
)

// fn is one PCI function of the fake host.
type fn struct {
	bdf    string
	class  uint32
	vendor uint16
	device uint16
	driver string
	group  int // -1: no IOMMU group
	bars   []bar
}

// addPCI creates the function's sysfs directory, driver and iommu_group
// links, group membership and, when it is on vfio-pci, /dev/vfio/<group>.
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
		var b *bar
		for j := range f.bars {
			if f.bars[j].index == i {
				b = &f.bars[j]
			}
		}
		if b == nil {
			res.WriteString("0x0000000000000000 0x0000000000000000 0x0000000000000000\n")
			continue
		}
		start := uint64(0x200000000000) + uint64(i)<<40
		fmt.Fprintf(&res, "0x%016x 0x%016x 0x%016x\n", start, start+b.size-1, b.flags)
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

// bindLink records f as bound to drv, as the driver core does.
func (h *fakeHost) bindLink(bdf, drv string) {
	h.symlink(h.path("sys/bus/pci/drivers/"+drv), "sys/bus/pci/devices/"+bdf+"/driver")
	h.symlink(h.path("sys/bus/pci/devices/"+bdf), "sys/bus/pci/drivers/"+drv+"/"+bdf)
	if drv == gpu.VFIODriver {
		if g, err := os.Readlink(h.path("sys/bus/pci/devices/" + bdf + "/iommu_group")); err == nil {
			h.write("dev/vfio/"+filepath.Base(g), "")
		}
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
	h.ops = append(h.ops, strings.TrimPrefix(path, h.path("sys")+"/")+"="+strings.TrimSpace(value))
	h.mu.Unlock()
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
		os.Remove(h.path("sys/bus/pci/devices/" + v + "/driver"))
		os.Remove(h.path("sys/bus/pci/drivers/" + parts[1] + "/" + v))
		if parts[1] == gpu.VFIODriver {
			h.dropVFIOGroupIfUnused(v)
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

func (h *fakeHost) dropVFIOGroupIfUnused(bdf string) {
	g, err := os.Readlink(h.path("sys/bus/pci/devices/" + bdf + "/iommu_group"))
	if err != nil {
		return
	}
	ents, _ := os.ReadDir(filepath.Join(g, "devices"))
	for _, e := range ents {
		if h.driverOf(e.Name()) == gpu.VFIODriver {
			return
		}
	}
	os.Remove(h.path("dev/vfio/" + filepath.Base(g)))
}

// nvidiaProc adds /proc/driver/nvidia/gpus/<bdf>/information.
func (h *fakeHost) nvidiaProc(bdf string, minor int, uuid string) {
	h.write("proc/driver/nvidia/gpus/"+bdf+"/information", fmt.Sprintf(
		"Model: \t\t NVIDIA H200\nIRQ:   \t\t 300\nGPU UUID: \t %s\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No\n",
		uuid, bdf, minor))
	h.write(fmt.Sprintf("dev/nvidia%d", minor), "")
}

// holder makes process pid (comm) hold target (a host path) open as fd 3.
func (h *fakeHost) holder(pid int, comm, target string) {
	h.mkdir(fmt.Sprintf("proc/%d/fd", pid))
	h.write(fmt.Sprintf("proc/%d/comm", pid), comm+"\n")
	h.symlink(target, fmt.Sprintf("proc/%d/fd/3", pid))
}

func (h *fakeHost) gresConf(text string) string {
	h.write("etc/gres.conf", text)
	return h.path("etc/gres.conf")
}

// GPU models. BAR layouts as sysfs shows them on real boards.
func h200(bdf string, group int, driver string) []fn {
	return []fn{{bdf: bdf, class: 0x030200, vendor: 0x10de, device: 0x2335, driver: driver, group: group, bars: []bar{
		{0, 16 << 20, mem32}, {1, 256 << 30, mem64Pre}, {3, 32 << 20, mem64Pre},
	}}}
}

// l40s is a PCIe GPU with an HDMI audio function at .1.
func l40s(bdf string, group int, driver, audioDriver string) []fn {
	audio := bdf[:len(bdf)-1] + "1"
	return []fn{
		{bdf: bdf, class: 0x030200, vendor: 0x10de, device: 0x26b9, driver: driver, group: group, bars: []bar{
			{0, 16 << 20, mem32}, {1, 64 << 30, mem64Pre}, {3, 32 << 20, mem64Pre},
		}},
		{bdf: audio, class: 0x040300, vendor: 0x10de, device: 0x22ba, driver: audioDriver, group: group, bars: []bar{
			{0, 16 << 10, mem32},
		}},
	}
}

// The 8 GPUs of an HGX H200 node, by PCI bus (= NVML index) order, with
// the device minors the nvidia driver handed out in probe order: NVML
// index 0 is minor 2.
var (
	dgxBDFs   = []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"}
	dgxMinors = []int{2, 3, 0, 1, 6, 7, 4, 5}
)

func dgxGroup(i int) int { return 30 + i }

func dgxUUID(i int) string { return fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i) }

// dgx builds the 8-GPU node with every GPU on driver; nvidia GPUs get
// their procfs entries and /dev/nvidia<minor>.
func dgx(t *testing.T, driver string) *fakeHost {
	h := newFakeHost(t)
	for i, b := range dgxBDFs {
		for _, f := range h200(b, dgxGroup(i), driver) {
			h.addPCI(f)
		}
		if driver == "nvidia" {
			h.nvidiaProc(b, dgxMinors[i], dgxUUID(i))
		}
	}
	return h
}

// dgxNVML is go-nvml's DGX H200 mock with the fake host's minors, bus ids
// and UUIDs, no processes and MIG disabled.
func dgxNVML() *server.Server {
	s := dgxh200.New()
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		dev.Minor = dgxMinors[i]
		dev.PciBusID = "0000" + strings.ToUpper(dgxBDFs[i]) // NVML's 8-digit domain
		dev.UUID = dgxUUID(i)
		setMockPCI(dev)
		noProcesses(dev)
	}
	return s
}

func setMockPCI(dev *server.Device) {
	dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		var p nvml.PciInfo
		for i, c := range []byte(dev.PciBusID) {
			p.BusId[i] = int8(c)
		}
		p.PciDeviceId = dev.Config.PciDeviceId
		return p, nvml.SUCCESS
	}
}

func noProcesses(dev *server.Device) {
	none := func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	dev.GetComputeRunningProcessesFunc = none
	dev.GetGraphicsRunningProcessesFunc = none
	dev.GetMPSComputeRunningProcessesFunc = none
}

// deviceErrors collects the *gpu.DeviceError values in err's tree.
func deviceErrors(err error) []*gpu.DeviceError {
	var out []*gpu.DeviceError
	var walk func(error)
	walk = func(e error) {
		if de, ok := e.(*gpu.DeviceError); ok {
			out = append(out, de)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}
