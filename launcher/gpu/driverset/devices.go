package driverset

import (
	"fmt"

	"github.com/slurm-microvm/slurm-microvm/fs"
)

// NVIDIA's device numbering, as nvidia-modprobe(1) creates the nodes (the
// driver makes none itself): GPUs and the control device on the fixed
// major 195 (NV_MAJOR_DEVICE_NUMBER), GPU i at minor i, /dev/nvidiactl at
// 255, /dev/nvidia-modeset at 254; nvidia-uvm on the dynamic major that
// /proc/devices lists as "nvidia-uvm", /dev/nvidia-uvm at minor 0 and
// /dev/nvidia-uvm-tools at minor 1.
const (
	nvidiaMajor   = 195
	ctlMinor      = 255
	modesetMinor  = 254
	deviceMode    = 0o666 // NVreg_DeviceFileMode's default
	nvidiaName    = "nvidia"
	uvmDeviceName = "nvidia-uvm"
)

// DeviceNode is a character device the guest makes once the modules are
// loaded: the major /proc/devices lists for MajorName, or FallbackMajor
// when that name is absent (0: none, the node is then an error).
type DeviceNode struct {
	Path          string `json:"path"` // under /dev
	MajorName     string `json:"major_name"`
	FallbackMajor uint32 `json:"fallback_major,omitempty"`
	Minor         uint32 `json:"minor"`
	Mode          uint32 `json:"mode"`
}

// DeviceNodes are the nodes a guest with gpus GPUs needs for the modules
// it loads (kernel names). The guest's driver numbers its GPUs 0..gpus-1
// in probe order, which is the plan's guest order.
func DeviceNodes(gpus int, modules []string) []DeviceNode {
	loaded := map[string]bool{}
	for _, m := range modules {
		loaded[m] = true
	}
	if !loaded["nvidia"] {
		return nil
	}
	var out []DeviceNode
	for i := 0; i < gpus; i++ {
		out = append(out, DeviceNode{Path: fmt.Sprintf("nvidia%d", i), MajorName: nvidiaName, FallbackMajor: nvidiaMajor, Minor: uint32(i), Mode: deviceMode})
	}
	out = append(out, DeviceNode{Path: "nvidiactl", MajorName: nvidiaName, FallbackMajor: nvidiaMajor, Minor: ctlMinor, Mode: deviceMode})
	if loaded["nvidia_modeset"] {
		out = append(out, DeviceNode{Path: "nvidia-modeset", MajorName: nvidiaName, FallbackMajor: nvidiaMajor, Minor: modesetMinor, Mode: deviceMode})
	}
	if loaded["nvidia_uvm"] {
		out = append(out,
			DeviceNode{Path: "nvidia-uvm", MajorName: uvmDeviceName, Minor: 0, Mode: deviceMode},
			DeviceNode{Path: "nvidia-uvm-tools", MajorName: uvmDeviceName, Minor: 1, Mode: deviceMode})
	}
	return out
}

// Where a guest finds the user-space driver: NVIDIA's CUDA images already
// search these (their ENV has LD_LIBRARY_PATH=/usr/local/nvidia/lib64 and
// PATH=/usr/local/nvidia/bin:...), as the Kubernetes GPU device plugin's
// volume did; the agent puts them first for every process anyway.
const (
	GuestLibDir = fs.GuestGPUDriver + "/lib64"
	GuestBinDir = fs.GuestGPUDriver + "/bin"
)

// DeviceNodes are the nodes a guest with gpus GPUs needs for s's modules.
func (s *Set) DeviceNodes(gpus int) []DeviceNode {
	names := make([]string, len(s.Modules))
	for i, m := range s.Modules {
		names[i] = m.Name
	}
	return DeviceNodes(gpus, names)
}
