package driverset

import "errors"

// DefaultModules are the kernel modules a GPU step loads unless the site
// configures others (gpu.driver.modules): the core driver and unified
// memory (CUDA needs both). nvidia_modeset and nvidia_drm serve displays
// and KMS and are loaded only when named; nvidia_peermem (GPUDirect RDMA)
// too.
var DefaultModules = []string{"nvidia", "nvidia_uvm"}

// Options say where the node's driver is and what the guest needs.
type Options struct {
	// Root is where the driver is installed: "/" for the node's own, or a
	// driver container's root (the NVIDIA GPU Operator's /run/nvidia/driver).
	Root string
	// KernelRelease is the guest kernel's release (`uname -r` in the
	// guest); its modules are looked up in Root/lib/modules/<release>.
	KernelRelease string
	// Modules are kernel module names (kernel spelling, '_' not '-') to
	// load, dependencies resolved; empty means DefaultModules.
	Modules []string
	// Params are module parameters by module name, as insmod takes them
	// ("NVreg_EnableGpuFirmware=1 NVreg_OpenRmEnableUnsupportedGpus=1").
	Params map[string]string
}

// Set is a node's NVIDIA driver as a guest gets it: its kernel modules
// for the guest kernel, the firmware they declare, and the user-space
// driver of the same version. Paths are absolute on the host (under Root).
type Set struct {
	// Version is the driver version of the kernel modules (modinfo
	// version=), e.g. "550.54.15"; every library carries it in its file
	// name.
	Version       string `json:"version"`
	KernelRelease string `json:"kernel_release"`
	Root          string `json:"root"`
	// Open is set for NVIDIA's open kernel modules (license "Dual
	// MIT/GPL"), which need the GSP firmware on every GPU.
	Open bool `json:"open,omitempty"`
	// LoadedVersion is the version of the driver loaded on the node now
	// (/sys/module/nvidia/version), "" when it is not loaded.
	LoadedVersion string `json:"loaded_version,omitempty"`
	// Modules in load order, dependencies first.
	Modules   []Module  `json:"modules"`
	Firmware  []File    `json:"firmware"`
	Libraries []Library `json:"libraries"`
	Binaries  []File    `json:"binaries"`
	// Notes are facts an admin should know that do not stop a step
	// (version loaded differs from installed, optional library missing).
	Notes []string `json:"notes,omitempty"`
}

// Module is one kernel module of the set.
type Module struct {
	// Name is the kernel's name for it (modinfo name=), which may differ
	// from the file name (Debian's nvidia-current.ko is "nvidia").
	Name string `json:"name"`
	// Path is the module file on the host (.ko, .ko.xz, .ko.zst, .ko.gz).
	Path string `json:"path"`
	// Params are the parameters it is loaded with.
	Params string `json:"params,omitempty"`
	// Dependency is set for a module loaded only because another needs it
	// (modules.dep), such as drm for nvidia_drm.
	Dependency bool `json:"dependency,omitempty"`
}

// File is one file of the set: where it is on the host and where it goes
// in the built set (slash-separated, relative).
type File struct {
	Path string `json:"path"`
	Rel  string `json:"rel"`
}

// Library is a user-space driver library found through the node's linker
// cache (ld.so.cache): its file (libcuda.so.550.54.15) and soname
// (libcuda.so.1).
type Library struct {
	File
	Soname string `json:"soname"`
}

// ErrNoDriver is returned (wrapped, with the reason) when the node has no
// usable driver set for the guest kernel.
var ErrNoDriver = errors.New("no usable NVIDIA driver set")

// Built is a set copied into the cache, immutable, shared read-only into
// guests. Rel paths are relative to Dir.
type Built struct {
	Dir string `json:"dir"`
	// Key names the entry: a hash of every input file's identity.
	Key string `json:"key"`
	// Modules in load order: File relative to Dir (decompressed .ko).
	Modules []BuiltModule `json:"modules"`
	// FirmwareDir holds the firmware tree (nvidia/<version>/...), for the
	// guest's firmware_class.path; "" when the set has no firmware.
	FirmwareDir string `json:"firmware_dir,omitempty"`
	// LibDir holds the libraries and their soname links; BinDir the tools.
	LibDir string `json:"lib_dir"`
	BinDir string `json:"bin_dir"`
	// Notes are facts of this build an admin should know that did not stop
	// it (an old entry that could not be removed).
	Notes []string `json:"notes,omitempty"`
}

// BuiltModule is a module file of a built set.
type BuiltModule struct {
	Name   string `json:"name"`
	File   string `json:"file"`
	Params string `json:"params,omitempty"`
}
