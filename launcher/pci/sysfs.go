package pci

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Roots are the directories the host's kernel interfaces are read from.
// Empty fields mean the real ones ("/sys", "/proc", "/dev"); tests point
// them into a fake tree. Paths the kernel reports (fd links in /proc,
// device files a configuration names) stay host paths such as
// "/dev/vfio/12"; only the place they are looked up moves.
type Roots struct {
	Sys  string `json:"sys,omitempty"`
	Proc string `json:"proc,omitempty"`
	Dev  string `json:"dev,omitempty"`
}

// SysPath joins p under the sysfs root.
func (r Roots) SysPath(p ...string) string {
	return filepath.Join(append([]string{or(r.Sys, "/sys")}, p...)...)
}

// ProcPath joins p under the procfs root.
func (r Roots) ProcPath(p ...string) string {
	return filepath.Join(append([]string{or(r.Proc, "/proc")}, p...)...)
}

// DevPath maps a host device path ("/dev/vfio/12") to where it is looked up.
func (r Roots) DevPath(hostPath string) string {
	if r.Dev == "" {
		return hostPath
	}
	if rest, ok := strings.CutPrefix(hostPath, "/dev/"); ok {
		return filepath.Join(r.Dev, rest)
	}
	return filepath.Join(r.Dev, hostPath)
}

// DevicePath is /sys/bus/pci/devices/<bdf>/<p...> under the sysfs root.
func (r Roots) DevicePath(bdf string, p ...string) string {
	return r.SysPath(append([]string{"bus", "pci", "devices", bdf}, p...)...)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// VFIODriver is the kernel driver a passed-through function must be bound to.
const VFIODriver = "vfio-pci"

var bdfRE = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$`)

// ValidBDF tells a PCI address in sysfs form ("0000:3b:00.0").
func ValidBDF(s string) bool { return bdfRE.MatchString(s) }

// NormalizeBDF turns a PCI address as NVML or lspci writes it
// ("00000000:3B:00.0", "3b:00.0") into sysfs form ("0000:3b:00.0").
func NormalizeBDF(s string) (string, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	parts := strings.Split(t, ":")
	switch len(parts) {
	case 2:
		parts = append([]string{"0"}, parts...)
	case 3:
	default:
		return "", fmt.Errorf("%q is not a PCI address (domain:bus:device.function)", s)
	}
	dom, err1 := strconv.ParseUint(parts[0], 16, 32)
	bus, err2 := strconv.ParseUint(parts[1], 16, 8)
	dv, fn, ok := strings.Cut(parts[2], ".")
	d, err3 := strconv.ParseUint(dv, 16, 8)
	f, err4 := strconv.ParseUint(fn, 16, 8)
	if !ok || errors.Join(err1, err2, err3, err4) != nil || d > 31 || f > 7 || dom > 0xffff {
		return "", fmt.Errorf("%q is not a PCI address (domain:bus:device.function)", s)
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", dom, bus, d, f), nil
}

// BAR is one base address register of a function as sysfs `resource`
// lists it (kernel struct resource flags).
type BAR struct {
	// Index is the BAR number (0-5).
	Index int `json:"index"`
	// Size in bytes.
	Size uint64 `json:"size"`
	// Flags are the kernel's IORESOURCE_* flags.
	Flags uint64 `json:"flags"`
}

const (
	ioresourceIO       = 0x00000100
	ioresourceMem      = 0x00000200
	ioresourcePrefetch = 0x00002000
	ioresourceMem64    = 0x00100000
)

// IsIO tells an I/O-port BAR.
func (b BAR) IsIO() bool { return b.Flags&ioresourceIO != 0 }

// Is64 tells a 64-bit memory BAR (placed in the guest's 64-bit PCI hole).
func (b BAR) Is64() bool { return b.Flags&ioresourceMem != 0 && b.Flags&ioresourceMem64 != 0 }

// Prefetchable tells a prefetchable memory BAR.
func (b BAR) Prefetchable() bool { return b.Flags&ioresourcePrefetch != 0 }

// Info is what sysfs says about one PCI function.
type Info struct {
	BDF    string
	Class  uint32
	Vendor uint16
	Device uint16
	Driver string // "" when unbound
	Group  int    // -1 without IOMMU group
	BARs   []BAR
	Bridge bool
}

// Describe is the function for a message:
// "0000:3b:00.2 (Ethernet controller [15b3:101e], driver mlx5_core)".
func (p Info) Describe() string {
	s := fmt.Sprintf("%s (%s [%04x:%04x]", p.BDF, ClassName(p.Class), p.Vendor, p.Device)
	if p.Driver != "" {
		s += ", driver " + p.Driver
	} else {
		s += ", no driver"
	}
	return s + ")"
}

// ClassName names the PCI base class/subclass of the classes an IOMMU
// group of a GPU or NIC is likely to hold (PCI Code and ID Assignment
// Specification), "class 0xNNNNNN" for others.
func ClassName(class uint32) string {
	switch class >> 8 {
	case 0x0300:
		return "VGA controller"
	case 0x0302:
		return "3D controller"
	case 0x0380:
		return "display controller"
	case 0x0403:
		return "audio device"
	case 0x0200:
		return "Ethernet controller"
	case 0x0207:
		return "InfiniBand controller"
	case 0x0108:
		return "NVMe controller"
	case 0x0c03:
		return "USB controller"
	case 0x0c80:
		return "serial bus controller"
	case 0x0604:
		return "PCI bridge"
	case 0x0680:
		return "bridge"
	}
	return fmt.Sprintf("class %06x", class)
}

// ReadHex reads a sysfs attribute holding one hex number ("0x15b3\n").
func ReadHex(path string, bits int) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimPrefix(strings.TrimSpace(string(b)), "0x")
	v, err := strconv.ParseUint(s, 16, bits)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a hex number", path, strings.TrimSpace(string(b)))
	}
	return v, nil
}

// LinkBase is the last element of a symlink's target ("" when absent).
func LinkBase(path string) (string, error) {
	t, err := os.Readlink(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		return "", err
	}
	return filepath.Base(t), nil
}

// ReadPCI reads one function from sysfs. A missing device is an error
// wrapping os.ErrNotExist.
func (r Roots) ReadPCI(bdf string) (Info, error) {
	p := Info{BDF: bdf, Group: -1}
	if _, err := os.Stat(r.DevicePath(bdf)); err != nil {
		return p, err
	}
	class, err := ReadHex(r.DevicePath(bdf, "class"), 32)
	if err != nil {
		return p, err
	}
	p.Class = uint32(class)
	if v, err := ReadHex(r.DevicePath(bdf, "vendor"), 16); err == nil {
		p.Vendor = uint16(v)
	}
	if v, err := ReadHex(r.DevicePath(bdf, "device"), 16); err == nil {
		p.Device = uint16(v)
	}
	if p.Driver, err = LinkBase(r.DevicePath(bdf, "driver")); err != nil {
		return p, err
	}
	g, err := LinkBase(r.DevicePath(bdf, "iommu_group"))
	if err != nil {
		return p, err
	}
	if g != "" {
		if p.Group, err = strconv.Atoi(g); err != nil {
			return p, fmt.Errorf("%s: iommu_group link %q is not a group number", r.DevicePath(bdf), g)
		}
	}
	if p.BARs, err = readBARs(r.DevicePath(bdf, "resource")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return p, err
	}
	p.Bridge = isBridge(r.DevicePath(bdf, "config"), p.Class)
	return p, nil
}

// isBridge tells a function whose config header is not type 0 (a bridge):
// the kernel lets such functions share a VFIO group whatever their driver
// (vfio_dev_driver_allowed). The header type is byte 0x0e of config
// space (world-readable); without it, PCI-to-PCI and CardBus bridge
// classes count.
func isBridge(configPath string, class uint32) bool {
	if f, err := os.Open(configPath); err == nil {
		defer f.Close()
		var hdr [16]byte
		if n, _ := f.Read(hdr[:]); n >= 15 {
			return hdr[0x0e]&0x7f != 0
		}
	}
	return class>>8 == 0x0604 || class>>8 == 0x0607
}

// readBARs parses sysfs `resource`: one "start end flags" line per
// resource, BARs 0-5 first. Unused entries are all zero.
func readBARs(path string) ([]BAR, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var bars []BAR
	sc := bufio.NewScanner(f)
	for i := 0; sc.Scan() && i < 6; i++ {
		var start, end, flags uint64
		if _, err := fmt.Sscanf(sc.Text(), "0x%x 0x%x 0x%x", &start, &end, &flags); err != nil {
			return nil, fmt.Errorf("%s line %d: %q: %w", path, i+1, sc.Text(), err)
		}
		if end == 0 || end < start || flags == 0 {
			continue
		}
		bars = append(bars, BAR{Index: i, Size: end - start + 1, Flags: flags})
	}
	return bars, sc.Err()
}

// GroupMembers lists the functions of IOMMU group g, sorted.
func (r Roots) GroupMembers(g int) ([]string, error) {
	ents, err := os.ReadDir(r.SysPath("kernel", "iommu_groups", strconv.Itoa(g), "devices"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if bdfRE.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// Holder is a process that has a device open.
type Holder struct {
	PID  int    `json:"pid"`
	Comm string `json:"comm"`
}

func (h Holder) String() string { return fmt.Sprintf("%s (pid %d)", h.Comm, h.PID) }

// HolderList is "comm (pid N), comm (pid M)".
func HolderList(hs []Holder) string {
	s := make([]string, len(hs))
	for i, h := range hs {
		s[i] = h.String()
	}
	return strings.Join(s, ", ")
}

// Holders lists, for each host device path, the processes that have it
// open: an fd whose link reads the path, or (for a character device) whose
// target has the same device number, which also finds it opened under
// another mount namespace's path. One pass over /proc for all paths.
func (r Roots) Holders(hostPaths ...string) (map[string][]Holder, error) {
	want := map[string]bool{}
	byRdev := map[uint64]string{}
	for _, hp := range hostPaths {
		want[hp] = true
		if st, err := os.Stat(r.DevPath(hp)); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			if sys, ok := st.Sys().(*syscall.Stat_t); ok {
				byRdev[uint64(sys.Rdev)] = hp
			}
		}
	}
	out := map[string][]Holder{}
	if len(want) == 0 {
		return out, nil
	}
	procs, err := os.ReadDir(r.ProcPath())
	if err != nil {
		return nil, err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fdDir := r.ProcPath(p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // gone, or not ours to read
		}
		seen := map[string]bool{}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil || !strings.HasPrefix(link, "/dev/") {
				continue
			}
			hit := ""
			if want[link] {
				hit = link
			} else if len(byRdev) > 0 {
				if st, err := os.Stat(filepath.Join(fdDir, fd.Name())); err == nil && st.Mode()&os.ModeCharDevice != 0 {
					if sys, ok := st.Sys().(*syscall.Stat_t); ok {
						hit = byRdev[uint64(sys.Rdev)]
					}
				}
			}
			if hit == "" || seen[hit] {
				continue
			}
			seen[hit] = true
			comm, _ := os.ReadFile(r.ProcPath(p.Name(), "comm"))
			out[hit] = append(out[hit], Holder{PID: pid, Comm: strings.TrimSpace(string(comm))})
		}
	}
	return out, nil
}
