// Package gpunvml implements gpu.NVML over github.com/NVIDIA/go-nvml.
//
// go-nvml dlopens libnvidia-ml.so.1 at Init, so this package links and
// runs on hosts without the NVIDIA driver: Devices then fails with an
// error wrapping gpu.ErrNVMLUnavailable that carries dlopen's reason
// ("NVML not available: libnvidia-ml.so.1: cannot open shared object
// file: No such file or directory"), and the launcher goes on from sysfs
// and procfs. It needs cgo (go-nvml's dl package), as the launcher's build
// already does.
package gpunvml

import (
	"context"
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
)

// DefaultLibrary is the NVML library go-nvml opens.
const DefaultLibrary = "libnvidia-ml.so.1"

// Library is a gpu.NVML over a go-nvml Interface: the real library
// (New) or a mock (NewFrom, e.g. go-nvml's pkg/nvml/mock/dgxh200).
type Library struct {
	lib  nvml.Interface
	path string
}

var _ gpu.NVML = (*Library)(nil)

// New uses the system's libnvidia-ml.so.1 (loaded at each Devices call).
func New() *Library { return &Library{lib: nvml.New(), path: DefaultLibrary} }

// NewFrom uses lib (a mock in tests).
func NewFrom(lib nvml.Interface) *Library { return &Library{lib: lib} }

// Devices initialises NVML, reads every device (index, minor, PCI bus id,
// UUID, name, MIG mode, compute/graphics/MPS processes) and shuts NVML
// down again. A device NVML cannot open (e.g. ERROR_GPU_IS_LOST) is
// skipped: the sysfs side still sees it. Errors wrap
// gpu.ErrNVMLUnavailable.
func (l *Library) Devices(ctx context.Context) ([]gpu.NVMLDevice, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ret := l.lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: %s", gpu.ErrNVMLUnavailable, l.initReason(ret))
	}
	defer l.lib.Shutdown()
	n, ret := l.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: device count: %s", gpu.ErrNVMLUnavailable, ret.Error())
	}
	var out []gpu.NVMLDevice
	for i := 0; i < n; i++ {
		h, ret := l.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		d, ok := device(i, h)
		if ok {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// initReason explains a failed nvmlInit. For a missing library go-nvml
// only says ERROR_LIBRARY_NOT_FOUND; dlopen's own message says why.
func (l *Library) initReason(ret nvml.Return) string {
	if ret != nvml.ERROR_LIBRARY_NOT_FOUND || l.path == "" {
		return ret.Error()
	}
	lib := dl.New(l.path, dl.RTLD_LAZY|dl.RTLD_GLOBAL)
	if err := lib.Open(); err != nil {
		return err.Error()
	}
	_ = lib.Close()
	return l.path + ": " + ret.Error()
}

func device(i int, h nvml.Device) (gpu.NVMLDevice, bool) {
	d := gpu.NVMLDevice{Index: i, Minor: -1}
	if idx, ret := h.GetIndex(); ret == nvml.SUCCESS {
		d.Index = idx
	}
	minor, ret := h.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return d, false
	}
	d.Minor = minor
	pci, ret := h.GetPciInfo()
	if ret != nvml.SUCCESS {
		return d, false
	}
	bdf, err := gpu.NormalizeBDF(cString(pci.BusId[:]))
	if err != nil {
		if bdf, err = gpu.NormalizeBDF(cString(pci.BusIdLegacy[:])); err != nil {
			return d, false
		}
	}
	d.BDF = bdf
	if u, ret := h.GetUUID(); ret == nvml.SUCCESS {
		d.UUID = u
	}
	if name, ret := h.GetName(); ret == nvml.SUCCESS {
		d.Name = name
	}
	if cur, pend, ret := h.GetMigMode(); ret == nvml.SUCCESS {
		d.MIG = gpu.MIGMode{Supported: true, Current: cur == nvml.DEVICE_MIG_ENABLE, Pending: pend == nvml.DEVICE_MIG_ENABLE}
	}
	d.Processes = []gpu.NVMLProcess{}
	seen := map[uint32]bool{}
	for _, list := range []struct {
		name string
		get  func() ([]nvml.ProcessInfo, nvml.Return)
	}{
		{"compute", h.GetComputeRunningProcesses},
		{"graphics", h.GetGraphicsRunningProcesses},
		{"MPS", h.GetMPSComputeRunningProcesses},
	} {
		ps, ret := list.get()
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED:
			continue
		default:
			d.ProcessesErr = fmt.Sprintf("%s processes: %s", list.name, ret.Error())
			continue
		}
		for _, p := range ps {
			if !seen[p.Pid] {
				seen[p.Pid] = true
				d.Processes = append(d.Processes, gpu.NVMLProcess{PID: p.Pid, UsedMemory: p.UsedGpuMemory})
			}
		}
	}
	return d, true
}

// cString reads a NUL-terminated C char array.
func cString(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
