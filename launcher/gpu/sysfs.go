package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// Roots are the directories the host's kernel interfaces are read from
// (package pci): empty fields mean /sys, /proc and /dev; tests point them
// into a fake tree.
type Roots = pci.Roots

// BAR is one base address register of a function (package pci).
type BAR = pci.BAR

// Holder is a process that has a device open (package pci).
type Holder = pci.Holder

// pciInfo is what sysfs says about one PCI function.
type pciInfo = pci.Info

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// VFIODriver is the kernel driver a passed-through function must be bound to.
const VFIODriver = pci.VFIODriver

// nvidiaMajor is the character major of /dev/nvidia<minor> (NV_MAJOR_DEVICE_NUMBER).
const nvidiaMajor = 195

// NormalizeBDF turns a PCI address as NVML or lspci writes it
// ("00000000:3B:00.0", "3b:00.0") into sysfs form ("0000:3b:00.0").
func NormalizeBDF(s string) (string, error) { return pci.NormalizeBDF(s) }

// slotOf is the BDF without its function ("0000:3b:00").
func slotOf(bdf string) string { return bdf[:len(bdf)-2] }

// isDisplay tells a GPU function (PCI base class 03).
func isDisplay(class uint32) bool { return class>>16 == 0x03 }

// nvidiaProcInfo is /proc/driver/nvidia/gpus/<BDF>/information.
type nvidiaProcInfo struct {
	BDF   string
	Minor int
	UUID  string
	Model string
}

// nvidiaGPUs reads every /proc/driver/nvidia/gpus/<BDF>/information. A
// missing directory (driver not loaded) gives os.ErrNotExist.
func nvidiaGPUs(r Roots) ([]nvidiaProcInfo, error) {
	dir := r.ProcPath("driver", "nvidia", "gpus")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []nvidiaProcInfo
	for _, e := range ents {
		bdf, err := NormalizeBDF(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "information"))
		if err != nil {
			continue
		}
		info := nvidiaProcInfo{BDF: bdf, Minor: -1}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch strings.TrimSpace(k) {
			case "Device Minor":
				if n, err := strconv.Atoi(v); err == nil {
					info.Minor = n
				}
			case "GPU UUID":
				info.UUID = v
			case "Model":
				info.Model = v
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// physBits reads the CPU's physical address width from /proc/cpuinfo
// ("address sizes : 46 bits physical, 57 bits virtual"); 0 when unknown.
func physBits(r Roots) int {
	b, err := os.ReadFile(r.ProcPath("cpuinfo"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "address sizes" {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d bits physical", &n); err == nil {
			return n
		}
	}
	return 0
}

// charDevMinor returns the minor of a character device with the given
// major, following symlinks.
func charDevMinor(path string, major uint32) (int, bool) {
	st, err := os.Stat(path)
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return 0, false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	rdev := uint64(sys.Rdev)
	if unixMajor(rdev) != major {
		return 0, false
	}
	return int(unixMinor(rdev)), true
}

// unixMajor and unixMinor decode a Linux dev_t (glibc's gnu_dev_major/minor).
func unixMajor(dev uint64) uint32 {
	return uint32((dev>>8)&0xfff) | uint32((dev>>32)&^0xfff)
}

func unixMinor(dev uint64) uint32 {
	return uint32(dev&0xff) | uint32((dev>>12)&^0xff)
}

// nvSwitches lists the node's NVSwitch functions: NVIDIA (vendor 0x10de)
// PCI functions of class 0x0680 ("Bridge: NVIDIA Corporation GH100 [H100
// NVSwitch]" in lspci on HGX H100/H200 baseboards), by address.
func nvSwitches(r Roots) []string {
	ents, err := os.ReadDir(r.SysPath("bus", "pci", "devices"))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		vendor, err1 := pci.ReadHex(r.DevicePath(e.Name(), "vendor"), 16)
		class, err2 := pci.ReadHex(r.DevicePath(e.Name(), "class"), 32)
		if err1 == nil && err2 == nil && vendor == 0x10de && class>>8 == 0x0680 {
			out = append(out, e.Name())
		}
	}
	return out
}
