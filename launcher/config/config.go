// Package config reads the node configuration of slurm-microvm,
// /etc/slurm/microvm.toml, with BurntSushi/toml.
//
// Design decision: unknown keys are errors, not warnings. A typo in an admin's
// file (`overlay_mb` for `overlay_mib`) would otherwise silently keep a
// default on every node; `slurm-microvm config check` and every command that
// loads the file report it with its line.
package config

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/slurm-microvm/slurm-microvm/fs"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// DefaultPath is where the plugin and the launcher look for the file.
const DefaultPath = "/etc/slurm/microvm.toml"

// Config is the whole file. Zero values are replaced by Defaults().
type Config struct {
	// RuntimeDir holds one directory per running step (root-owned).
	RuntimeDir string `toml:"runtime_dir"`
	// CacheDir holds converted images (per user) and guest assets.
	CacheDir string `toml:"cache_dir"`
	// Driver is the runtime driver (launcher/runtime): "qemu" (built in)
	// or "kata" (Kata Containers through the containerd shim API). The
	// file's key is runtime; driver, its older name, is still read.
	Driver string `toml:"runtime"`
	// LegacyDriver is the file's driver key (the older name of runtime).
	LegacyDriver string `toml:"driver"`

	QEMU      QEMU      `toml:"qemu"`
	Kata      Kata      `toml:"kata"`
	Resources Resources `toml:"resources"`
	Timeouts  Timeouts  `toml:"timeouts"`
	GPU       GPU       `toml:"gpu"`
	// Mounts is the host-path policy (package fs).
	Mounts fs.Policy `toml:"mounts"`
	MPI    MPI       `toml:"mpi"`
	Log    Log       `toml:"log"`
	Images Images    `toml:"images"`
	// Network is the guests' network (launcher/network).
	Network Network `toml:"network"`
	// Metrics is the node's Prometheus textfile (launcher/metrics).
	Metrics Metrics `toml:"metrics"`
}

// Log keeps each step's supervisor log for the admin after the step (the
// copy in the step's state goes with it at stop).
type Log struct {
	// Dir holds <job>.<step>.<restart>.log per step (root-owned 0700,
	// files 0600); "" keeps no copy.
	Dir string `toml:"dir"`
	// Keep is the most log files Dir holds; the oldest go first. 0: no
	// limit by count.
	Keep int `toml:"keep"`
	// MaxAge removes logs not written for longer. "0s": no limit by age.
	MaxAge Duration `toml:"max_age"`
}

// Images bounds what converting one image writes into cache_dir as root
// (launcher/image.Limits, whose errors name these keys). Every value is
// at least 1; there is no "unlimited".
type Images struct {
	// MaxImageMiB: the unpacked size of one image (its files, all layers
	// together).
	MaxImageMiB MiB `toml:"max_image_mib"`
	// MaxLayerMiB: one layer, uncompressed.
	MaxLayerMiB MiB `toml:"max_layer_mib"`
	// MaxEntries: files, directories and links of one image.
	MaxEntries int64 `toml:"max_entries"`
	// UserCacheMiB: one user's converted images together.
	UserCacheMiB MiB `toml:"user_cache_mib"`
	// CacheMiB: every user's converted images together; the least
	// recently used that no running step holds are pruned past it.
	CacheMiB MiB `toml:"cache_mib"`
	// AssetsCacheMiB: the guest boot pairs (<cache_dir>/assets); the least
	// recently used are pruned past it.
	AssetsCacheMiB MiB `toml:"assets_cache_mib"`
}

// MPI configures the injection of the host's MPI stack (package mpi).
type MPI struct {
	// Default is --microvm-mpi when a step gives none: "auto" (inject when
	// the ABI check passes), "host" (inject or fail), "image" or "off"
	// (never inject).
	Default string `toml:"default"`
	// Version is the version rule of the check: "major", "full" (host
	// minor >= image minor) or "strict" (Sarus' modes).
	Version string `toml:"version"`
}

// GPU configures VFIO passthrough of the step's GPUs (launcher/gpu).
type GPU struct {
	// GresConf is the node's gres.conf (Slurm gres.conf(5)).
	GresConf string `toml:"gres_conf"`
	// AllowRebind lets a step move its GPUs (and their IOMMU group
	// members) from the nvidia driver to vfio-pci, and back at stop, when
	// NVML shows no process on them. Off: gres.conf must list
	// File=/dev/vfio/<group> GPUs already bound to vfio-pci.
	AllowRebind bool `toml:"allow_rebind"`
	// Driver is the node's NVIDIA driver as a GPU step's guest gets it.
	Driver GPUDriver `toml:"driver"`
	// NVSwitch decides a multi-GPU step on a node whose GPUs are linked
	// by NVSwitch (HGX baseboards): "refuse" (default; passed GPUs would
	// run without NVLink, the switches staying on the host) or
	// "without-nvlink" (the site accepts PCIe-only peer traffic).
	NVSwitch string `toml:"nvswitch"`
}

// GPUDriver is [gpu.driver] (launcher/gpu/driverset).
type GPUDriver struct {
	// Inject brings the node's driver (kernel modules for the guest
	// kernel, firmware, user-space libraries and tools) into every step
	// with GPUs; default true. false: the guest kernel and the image must
	// drive the GPUs themselves.
	Inject *bool `toml:"inject"`
	// Root is where the driver is installed: "/" (default), or a driver
	// container's root (the GPU Operator's /run/nvidia/driver).
	Root string `toml:"root"`
	// Modules are the kernel modules loaded in the guest (kernel names);
	// default nvidia and nvidia_uvm. Add nvidia_modeset, nvidia_drm or
	// nvidia_peermem where needed.
	Modules []string `toml:"modules"`
	// Params are module parameters by module, as insmod(8) takes them,
	// e.g. nvidia = "NVreg_EnableGpuFirmware=1".
	Params map[string]string `toml:"params"`
}

// QEMU configures the built-in driver.
type QEMU struct {
	// Binary is the qemu-system-x86_64 to run (PATH lookup when relative).
	Binary string `toml:"binary"`
	// Accel is "auto" (KVM when kvm_intel or kvm_amd is loaded, else TCG),
	// "kvm" or "tcg".
	Accel string `toml:"accel"`
	// Kernel is the bzImage to boot (default: the newest /boot/vmlinuz-*).
	Kernel string `toml:"kernel"`
	// Agent is the static guest agent binary put into the initramfs.
	Agent string `toml:"agent"`
	// RunAs executes QEMU with the job's numeric uid, gid and
	// supplementary groups (launcher/qemu). false keeps QEMU as root, and
	// is refused while any host share is possible (see sharesPossible).
	RunAs *bool `toml:"runas"`
	// Seccomp turns on QEMU's seccomp sandbox (-sandbox on,...).
	Seccomp *bool `toml:"seccomp"`
	// HugePages is the huge page size ("2M" or "1G", x86-64's) the guest
	// RAM of a step with passed-through devices (GPUs) is taken in: VFIO
	// pins all of a passthrough guest's memory when the VMM starts, and
	// pinning 2 MiB or 1 GiB pages is what keeps that start short for a
	// large guest. The memory is a memfd of the VMM's own
	// (memory-backend-memfd, hugetlb=on): no shared hugetlbfs mount that
	// every user of the node could fill and keep, and the pages go back
	// to the pool when the VMM exits. The pages come from the node's
	// hugetlb pool (vm.nr_hugepages or /sys/kernel/mm/hugepages), which
	// Slurm's memory cgroup does not charge: size the pool for the
	// passthrough steps. The guest's memory is rounded down to whole
	// pages. "" (default): anonymous memory, preallocated by as many
	// threads as the guest has vCPUs. Steps without passthrough always use
	// anonymous memory, populated lazily.
	HugePages string `toml:"hugepages"`
}

// Kata is [kata]: the Kata Containers driver (launcher/kata), used with
// runtime = "kata".
type Kata struct {
	// Mode is how the driver reaches Kata: "shim" (default: it starts
	// Shim for the step and speaks the shim's task API, no node daemon) or
	// "containerd" (through the containerd daemon at ContainerdAddress,
	// with the runtime handler RuntimeHandler).
	Mode string `toml:"mode"`
	// Shim is the containerd-shim-kata-v2 binary (PATH lookup when
	// relative).
	Shim string `toml:"shim"`
	// Configuration is Kata's configuration.toml the sandbox runs with
	// (passed to the shim as KATA_CONF_FILE, read by config check); ""
	// uses Kata's own search path (/etc/kata-containers, then
	// /usr/share/defaults/kata-containers).
	Configuration string `toml:"configuration"`
	// ContainerdAddress is containerd's socket (mode "containerd").
	ContainerdAddress string `toml:"containerd_address"`
	// RuntimeHandler is the runtime name containerd starts the sandbox
	// with (mode "containerd").
	RuntimeHandler string `toml:"runtime_handler"`
	// Namespace is the containerd namespace of the steps' sandboxes.
	Namespace string `toml:"namespace"`
	// AllowRootVirtiofsd accepts host shares served by Kata's virtiofsd
	// as root (Kata's default). Off (the default), runtime = "kata" is
	// refused while host shares are possible: a guest root would apply
	// chown, setuid bits and device nodes in read-write shares and read
	// past host permissions in every share (checkShares).
	AllowRootVirtiofsd bool `toml:"allow_root_virtiofsd"`
}

// Resources size the guest.
type Resources struct {
	// VMMOverheadMiB is subtracted from the step's memory allocation
	// (S_STEP_ALLOC_MEM) to size the guest: the VMM counts against --mem.
	VMMOverheadMiB MiB `toml:"vmm_overhead_mib"`
	// DefaultMemoryMiB is the guest memory when the step has no limit.
	DefaultMemoryMiB MiB `toml:"default_memory_mib"`
	// MinMemoryMiB is the smallest guest that may boot.
	MinMemoryMiB MiB `toml:"min_memory_mib"`
	// OverlayMiB is the size of the writable tmpfs layer over the image,
	// taken from guest memory when written.
	OverlayMiB MiB `toml:"overlay_mib"`
}

// Timeouts bound every wait. Values are Go durations ("90s", "2m").
type Timeouts struct {
	// Boot bounds VMM start to agent ready.
	Boot Duration `toml:"boot"`
	// Start bounds the whole sandbox start including image conversion,
	// as seen by a task waiting for it.
	Start Duration `toml:"start"`
	// StopGrace is how long a graceful guest poweroff may take before the
	// VMM is killed.
	StopGrace Duration `toml:"stop_grace"`
	// AgentPing is how often the supervisor pings the guest agent while
	// the step runs; AgentHang how long the agent may leave every ping
	// unanswered before the guest is taken as hung and the step fails
	// (its microVM is killed). Both positive, AgentPing < AgentHang.
	AgentPing Duration `toml:"agent_ping"`
	AgentHang Duration `toml:"agent_hang"`
}

// MiB is a size in mebibytes, a non-negative integer in TOML.
type MiB uint64

// UnmarshalTOML refuses negative and non-integer values (a plain uint64
// would wrap -5 around to 2^64-5).
func (m *MiB) UnmarshalTOML(v any) error {
	n, ok := v.(int64)
	if !ok {
		return fmt.Errorf("%v is not a whole number of MiB", v)
	}
	if n < 0 {
		return fmt.Errorf("%d is negative: sizes are MiB >= 0", n)
	}
	*m = MiB(n)
	return nil
}

// Duration is a time.Duration written as a string in TOML.
type Duration struct{ time.Duration }

// UnmarshalText parses a Go duration such as "90s".
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration (use e.g. \"90s\" or \"2m\")", b)
	}
	d.Duration = v
	return nil
}

// MarshalText renders the duration.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Defaults returns the configuration used for every key the file omits.
func Defaults() Config {
	// One variable per *bool: the TOML decoder writes a key's value
	// through the pointer it finds, so a shared one would turn every
	// such default off with the first key set to false.
	runAs, seccomp, inject := true, true, true
	return Config{
		RuntimeDir: "/run/slurm-microvm",
		CacheDir:   "/var/cache/slurm-microvm",
		Driver:     "qemu",
		Kata: Kata{
			Mode:              "shim",
			Shim:              "containerd-shim-kata-v2",
			ContainerdAddress: "/run/containerd/containerd.sock",
			RuntimeHandler:    "io.containerd.kata.v2",
			Namespace:         "slurm-microvm",
		},
		QEMU: QEMU{
			Binary:  "qemu-system-x86_64",
			Accel:   "auto",
			Agent:   "/usr/local/libexec/slurm-microvm/slurm-microvm-agent",
			RunAs:   &runAs,
			Seccomp: &seccomp,
		},
		Resources: Resources{
			VMMOverheadMiB:   256,
			DefaultMemoryMiB: 1024,
			MinMemoryMiB:     128,
			OverlayMiB:       1024,
		},
		GPU:     GPU{GresConf: "/etc/slurm/gres.conf", Driver: GPUDriver{Inject: &inject, Root: "/"}, NVSwitch: "refuse"},
		Mounts:  fs.DefaultPolicy(),
		MPI:     MPI{Default: "auto", Version: "full"},
		Log:     Log{Dir: "/var/log/slurm-microvm", Keep: 1000, MaxAge: Duration{30 * 24 * time.Hour}},
		Images:  Images{MaxImageMiB: 65536, MaxLayerMiB: 32768, MaxEntries: 2000000, UserCacheMiB: 131072, CacheMiB: 262144, AssetsCacheMiB: 4096},
		Network: defaultNetwork(),
		Timeouts: Timeouts{
			Boot:      Duration{90 * time.Second},
			Start:     Duration{15 * time.Minute},
			StopGrace: Duration{5 * time.Second},
			AgentPing: Duration{5 * time.Second},
			AgentHang: Duration{15 * time.Second},
		},
	}
}

// Error is one problem in the file, with the line it was found on (0 when
// unknown).
type Error struct {
	Path string
	Line int
	Key  string
	Msg  string
}

func (e *Error) Error() string {
	loc := e.Path
	if e.Line > 0 {
		loc = fmt.Sprintf("%s:%d", e.Path, e.Line)
	}
	if e.Key != "" {
		return fmt.Sprintf("%s: %s: %s", loc, e.Key, e.Msg)
	}
	return fmt.Sprintf("%s: %s", loc, e.Msg)
}

// Load reads path over Defaults(). A missing file gives the defaults when
// missingOK is set. Every problem found is returned, joined (errors.Join of
// *Error).
func Load(path string, missingOK bool) (*Config, error) {
	c := Defaults()
	data, err := os.ReadFile(path)
	if err != nil {
		if missingOK && errors.Is(err, os.ErrNotExist) {
			return &c, nil
		}
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes data (named path in errors) over Defaults() and validates it.
func Parse(path string, data []byte) (*Config, error) {
	c := Defaults()
	md, err := toml.Decode(string(data), &c)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, &Error{Path: path, Line: pe.Position.Line, Key: pe.LastKey, Msg: pe.Message}
		}
		return nil, &Error{Path: path, Msg: err.Error()}
	}
	var errs []error
	for _, k := range md.Undecoded() {
		errs = append(errs, &Error{Path: path, Line: lineOf(data, k), Key: k.String(),
			Msg: "unknown key (see etc/microvm.toml for the keys this version knows)"})
	}
	if md.IsDefined("driver") {
		// The older name of runtime.
		switch {
		case md.IsDefined("runtime") && c.Driver != c.LegacyDriver:
			errs = append(errs, &Error{Path: path, Line: lineOf(data, toml.Key{"driver"}), Key: "driver",
				Msg: fmt.Sprintf("%q contradicts runtime = %q (driver is the older name of runtime: keep one)", c.LegacyDriver, c.Driver)})
		default:
			c.Driver = c.LegacyDriver
		}
	}
	errs = append(errs, c.validate(path, data)...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &c, nil
}

// validNamespace is containerd's namespace rule (pkg/identifiers): 1-76
// characters of [A-Za-z0-9._-], starting and ending alphanumeric.
func validNamespace(s string) bool {
	return namespaceRE.MatchString(s) && len(s) <= 76
}

var namespaceRE = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-](?:[A-Za-z0-9]+))*$`)

func (c *Config) validate(path string, data []byte) []error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, &Error{Path: path, Line: lineOf(data, strings.Split(key, ".")), Key: key, Msg: fmt.Sprintf(format, a...)})
	}
	for key, v := range map[string]string{"runtime_dir": c.RuntimeDir, "cache_dir": c.CacheDir} {
		if !strings.HasPrefix(v, "/") {
			bad(key, "%q must be an absolute path", v)
		}
	}
	if c.Driver != "qemu" && c.Driver != "kata" {
		bad("runtime", "%q is not a runtime driver (known: qemu, kata)", c.Driver)
	}
	switch c.Kata.Mode {
	case "shim", "containerd":
	default:
		bad("kata.mode", "%q must be one of shim, containerd", c.Kata.Mode)
	}
	if c.Kata.Shim == "" {
		bad("kata.shim", "must not be empty")
	}
	if c.Kata.Configuration != "" && !strings.HasPrefix(c.Kata.Configuration, "/") {
		bad("kata.configuration", "%q must be an absolute path", c.Kata.Configuration)
	}
	if c.Kata.Mode == "containerd" && !strings.HasPrefix(c.Kata.ContainerdAddress, "/") {
		bad("kata.containerd_address", "%q must be an absolute path", c.Kata.ContainerdAddress)
	}
	if c.Kata.RuntimeHandler == "" {
		bad("kata.runtime_handler", "must not be empty")
	}
	if !validNamespace(c.Kata.Namespace) {
		bad("kata.namespace", "%q must be at most 76 letters and digits, with single '.', '_' or '-' between them (containerd namespaces)", c.Kata.Namespace)
	}
	switch c.QEMU.Accel {
	case "auto", "kvm", "tcg":
	default:
		bad("qemu.accel", "%q must be one of auto, kvm, tcg", c.QEMU.Accel)
	}
	if c.QEMU.Binary == "" {
		bad("qemu.binary", "must not be empty")
	}
	if _, err := HugePageMiB(c.QEMU.HugePages); err != nil {
		bad("qemu.hugepages", "%v", err)
	}
	if !strings.HasPrefix(c.QEMU.Agent, "/") {
		bad("qemu.agent", "%q must be an absolute path", c.QEMU.Agent)
	}
	for _, err := range c.Mounts.Validate() {
		var pe *fs.PolicyError
		if errors.As(err, &pe) {
			msg := pe.Msg
			if pe.Index > 0 {
				msg = fmt.Sprintf("entry %d: %s", pe.Index, pe.Msg)
			}
			errs = append(errs, &Error{Path: path, Line: lineOf(data, strings.Split(pe.Key, ".")), Key: pe.Key, Msg: msg})
			continue
		}
		errs = append(errs, &Error{Path: path, Key: "mounts", Msg: err.Error()})
	}
	switch c.MPI.Default {
	case "auto", "host", "image", "off":
	default:
		bad("mpi.default", "%q must be one of auto, host, image, off", c.MPI.Default)
	}
	switch c.MPI.Version {
	case "major", "full", "strict":
	default:
		bad("mpi.version", "%q must be one of major, full, strict", c.MPI.Version)
	}
	if c.Log.Dir != "" && !strings.HasPrefix(c.Log.Dir, "/") {
		bad("log.dir", "%q must be an absolute path, or \"\" for no kept logs", c.Log.Dir)
	}
	if c.Log.Keep < 0 {
		bad("log.keep", "%d is negative: a number of files, 0 for no limit", c.Log.Keep)
	}
	if c.Log.MaxAge.Duration < 0 {
		bad("log.max_age", "%s is negative: use \"0s\" for no limit", c.Log.MaxAge.Duration)
	}
	if !strings.HasPrefix(c.GPU.GresConf, "/") {
		bad("gpu.gres_conf", "%q must be an absolute path", c.GPU.GresConf)
	}
	checkGPUDriver(&c.GPU, bad)
	checkNetwork(&c.Network, bad)
	if c.QEMU.Kernel != "" && !strings.HasPrefix(c.QEMU.Kernel, "/") {
		bad("qemu.kernel", "%q must be an absolute path", c.QEMU.Kernel)
	}
	r := c.Resources
	if r.MinMemoryMiB < 64 {
		bad("resources.min_memory_mib", "%d MiB is below the 64 MiB a guest kernel needs", r.MinMemoryMiB)
	}
	if r.DefaultMemoryMiB < r.MinMemoryMiB {
		bad("resources.default_memory_mib", "%d MiB is below min_memory_mib (%d MiB)", r.DefaultMemoryMiB, r.MinMemoryMiB)
	}
	if r.OverlayMiB == 0 {
		bad("resources.overlay_mib", "must be at least 1 MiB")
	}
	for key, n := range map[string]int64{"images.max_image_mib": int64(c.Images.MaxImageMiB), "images.max_layer_mib": int64(c.Images.MaxLayerMiB),
		"images.max_entries": c.Images.MaxEntries, "images.user_cache_mib": int64(c.Images.UserCacheMiB),
		"images.cache_mib": int64(c.Images.CacheMiB), "images.assets_cache_mib": int64(c.Images.AssetsCacheMiB)} {
		if n < 1 {
			bad(key, "%d must be at least 1", n)
		}
	}
	errs = append(errs, c.checkShares(path, data)...)
	for key, d := range map[string]Duration{"timeouts.boot": c.Timeouts.Boot, "timeouts.start": c.Timeouts.Start, "timeouts.stop_grace": c.Timeouts.StopGrace,
		"timeouts.agent_ping": c.Timeouts.AgentPing, "timeouts.agent_hang": c.Timeouts.AgentHang} {
		if d.Duration <= 0 {
			bad(key, "%s must be positive", d.Duration)
		}
	}
	if p, h := c.Timeouts.AgentPing.Duration, c.Timeouts.AgentHang.Duration; p > 0 && h > 0 && p >= h {
		bad("timeouts.agent_ping", "%s is not below timeouts.agent_hang (%s): a hung guest is detected only after a ping went unanswered; make agent_ping shorter than agent_hang (e.g. a third of it)", p, h)
	}
	errs = append(errs, c.Metrics.validate(path, data)...)
	return errs
}

// checkShares refuses qemu.runas = false while the file allows host shares,
// and more shares than a microVM takes before a user adds any.
//
// Rule (launcher/qemu identity): host shares use 9p security_model=none,
// under which QEMU applies a guest's chown, setuid bits and mknod with its
// own credentials. A root QEMU would make a guest root a host root in
// every writable share, and read past every permission in read-only ones.
func (c *Config) checkShares(path string, data []byte) []error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, &Error{Path: path, Line: lineOf(data, strings.Split(key, ".")), Key: key, Msg: fmt.Sprintf(format, a...)})
	}
	if c.QEMU.RunAs != nil && !*c.QEMU.RunAs {
		if why := c.sharesPossible(); len(why) > 0 {
			bad("qemu.runas", "false runs QEMU as root, and QEMU applies a guest root's chown, setuid bits and device nodes in host shares with its own credentials (a guest root would be root on the host): refused while host shares are possible (%s); set runas = true (the default), or turn every share off",
				strings.Join(why, ", "))
		}
	}
	if c.Driver == "kata" && !c.Kata.AllowRootVirtiofsd {
		if why := c.sharesPossible(); len(why) > 0 {
			bad("runtime", "\"kata\": Kata's virtiofsd serves the host shares as root, so a guest root (the guest kernel runs the tenant's code) would apply chown, setuid bits and device nodes in read-write shares and read past host permissions in every share: refused while host shares are possible (%s); turn every share off, or set kata.allow_root_virtiofsd = true where virtiofsd drops its privileges or translates the guest's ids (virtio_fs_extra_args)",
				strings.Join(why, ", "))
		}
	}
	if c.Driver == "kata" {
		return errs // the share count is QEMU's (virtio-fs takes one device)
	}
	entries, err := c.Mounts.Plan(fs.User{Name: "user", Home: "/home/user"}, "", "", "")
	if err != nil {
		return errs // reported by Mounts.Validate
	}
	n := len(entries)
	if c.MPI.Default == "auto" || c.MPI.Default == "host" {
		n++
	}
	if n > qemu.MaxSharesMicrovm {
		bad("mounts.site", "%d site mounts, scratch and the host MPI share: a microVM takes at most %d host shares (launcher/qemu MaxSharesMicrovm), so every step would be refused; mount common parents instead", n, qemu.MaxSharesMicrovm)
	}
	return errs
}

// sharesPossible names the settings under which a step gets a host share.
func (c *Config) sharesPossible() []string {
	var why []string
	if len(c.Mounts.Site) > 0 {
		why = append(why, "mounts.site")
	}
	if c.Mounts.ScratchBase != "" {
		why = append(why, "mounts.scratch_base")
	}
	if len(c.Mounts.Allowed) > 0 {
		why = append(why, "mounts.allowed")
	}
	if c.MPI.Default == "auto" || c.MPI.Default == "host" {
		why = append(why, "mpi.default = "+c.MPI.Default)
	}
	return why
}

// lineOf finds the line where key is set: the line "last = ..." inside the
// table named by the leading components. 0 when not found.
func lineOf(data []byte, key toml.Key) int {
	if len(key) == 0 {
		return 0
	}
	table := strings.Join(key[:len(key)-1], ".")
	last := key[len(key)-1]
	cur := ""
	for i, line := range strings.Split(string(data), "\n") {
		s := strings.TrimSpace(line)
		if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
			cur = strings.Trim(s, "[] ")
			if cur == strings.Join(key, ".") {
				return i + 1
			}
			continue
		}
		k, _, ok := strings.Cut(s, "=")
		if !ok {
			continue
		}
		k = strings.Trim(strings.TrimSpace(k), `"`)
		if cur == table && k == last {
			return i + 1
		}
		if cur == "" && table != "" && k == table+"."+last {
			return i + 1
		}
	}
	return 0
}

// checkRuntimeDir checks, as root, that the runtime root (created when
// missing, as prepare would) is root's alone and carries the ACL that lets
// only a step's user into its state (package launcher/state).
func checkRuntimeDir(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	if err := state.MakeDir(dir, 0o711); err != nil {
		return err
	}
	return state.CheckACLSupport(dir)
}

// CheckHost checks what the file names on this node: the QEMU binary, the
// guest agent and the kernel image exist. `config check` runs it; parsing
// alone does not, so that login nodes can read the file.
func (c *Config) CheckHost(path string) error {
	var errs []error
	if _, err := exec.LookPath(c.QEMU.Binary); err != nil && c.Driver != "kata" { // Kata runs its own VMM
		errs = append(errs, &Error{Path: path, Key: "qemu.binary", Msg: fmt.Sprintf("%q is not an executable on this node (install qemu-system-x86)", c.QEMU.Binary)})
	}
	if fi, err := os.Stat(c.QEMU.Agent); err != nil || !fi.Mode().IsRegular() {
		errs = append(errs, &Error{Path: path, Key: "qemu.agent", Msg: fmt.Sprintf("%q is not a file on this node (make install puts it there)", c.QEMU.Agent)})
	}
	for i, spec := range c.Mounts.Site {
		if strings.Contains(spec, "$") {
			continue // per user: checked when a step starts
		}
		ms, err := fs.Parse(fmt.Sprintf("mounts.site[%d]", i+1), spec)
		if err != nil {
			continue // reported by Parse already
		}
		for _, m := range ms {
			if fi, err := os.Stat(m.Source); (err != nil || !fi.IsDir()) && !m.Optional {
				errs = append(errs, &Error{Path: path, Key: fmt.Sprintf("mounts.site[%d]", i+1),
					Msg: fmt.Sprintf("source %q is not a directory on this node; every step would be refused (mark it +optional if some nodes lack it)", m.Source)})
			}
		}
	}
	if b := c.Mounts.ScratchBase; b != "" {
		if err := fs.CheckScratchBase(b); err != nil {
			errs = append(errs, &Error{Path: path, Key: "mounts.scratch_base", Msg: err.Error()})
		}
	}
	if err := checkRuntimeDir(c.RuntimeDir); err != nil {
		errs = append(errs, &Error{Path: path, Key: "runtime_dir", Msg: err.Error()})
	}
	if err := fs.CheckLocalStore("cache_dir", c.CacheDir); err != nil {
		errs = append(errs, &Error{Path: path, Key: "cache_dir", Msg: err.Error()})
	}
	if c.QEMU.HugePages != "" {
		if err := CheckHugePages("/sys/kernel/mm/hugepages", c.QEMU.HugePages); err != nil {
			errs = append(errs, &Error{Path: path, Key: "qemu.hugepages", Msg: err.Error()})
		}
	}
	if c.QEMU.Kernel != "" {
		if _, err := os.Stat(c.QEMU.Kernel); err != nil {
			errs = append(errs, &Error{Path: path, Key: "qemu.kernel", Msg: fmt.Sprintf("%q: %v", c.QEMU.Kernel, err)})
		}
	}
	return errors.Join(errs...)
}

// HugePageMiB is the page size qemu.hugepages names, in MiB: "2M" 2,
// "1G" 1024, "" 0 (none). Errors: any other value (x86-64 has these two).
func HugePageMiB(size string) (uint64, error) {
	switch size {
	case "":
		return 0, nil
	case "2M":
		return 2, nil
	case "1G":
		return 1024, nil
	}
	return 0, fmt.Errorf("%q is not a huge page size of x86-64: give \"2M\", \"1G\" or nothing", size)
}

// CheckHugePages checks that the kernel has huge pages of size (a
// hugepages-<kB>kB directory under sysfs, /sys/kernel/mm/hugepages) and
// that its pool can hand any out: nr_hugepages or nr_overcommit_hugepages
// above 0 (the kernel's hugetlbpage documentation).
func CheckHugePages(sysfs, size string) error {
	mib, err := HugePageMiB(size)
	if err != nil || mib == 0 {
		return err
	}
	dir := filepath.Join(sysfs, fmt.Sprintf("hugepages-%dkB", mib*1024))
	read := func(name string) (uint64, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0, err
		}
		return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	n, err := read("nr_hugepages")
	if err != nil {
		return fmt.Errorf("this kernel has no %s huge pages (%v)", size, err)
	}
	over, _ := read("nr_overcommit_hugepages")
	if n == 0 && over == 0 {
		return fmt.Errorf("the node's pool of %s huge pages is empty: reserve them (echo N > %s/nr_hugepages, or hugepagesz=%s hugepages=N on the kernel command line)", size, dir, size)
	}
	return nil
}

// moduleName is a kernel module name as modules.dep(5) and insmod take it.
var moduleName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,54}$`)

// checkGPUDriver validates [gpu.driver] and gpu.nvswitch, and spells
// module names the kernel's way ('-' -> '_').
func checkGPUDriver(g *GPU, bad func(key, format string, a ...any)) {
	d := &g.Driver
	if d.Root == "" {
		d.Root = "/"
	}
	if !strings.HasPrefix(d.Root, "/") {
		bad("gpu.driver.root", "%q must be an absolute path (\"/\" for the node's own driver)", d.Root)
	}
	mods := map[string]bool{}
	for i, m := range d.Modules {
		if !moduleName.MatchString(m) {
			bad("gpu.driver.modules", "%q is not a kernel module name (letters, digits, '_' and '-')", m)
			continue
		}
		d.Modules[i] = strings.ReplaceAll(m, "-", "_")
		mods[d.Modules[i]] = true
	}
	if len(d.Modules) > 0 && !mods["nvidia"] {
		bad("gpu.driver.modules", "%q lacks nvidia, the driver every other NVIDIA module needs", d.Modules)
	}
	if len(d.Modules) == 0 {
		mods = map[string]bool{"nvidia": true, "nvidia_uvm": true}
	}
	params := map[string]string{}
	spelled := map[string]string{}
	for _, m := range sortedKeys(boolKeys(d.Params)) {
		p := d.Params[m]
		k := strings.ReplaceAll(m, "-", "_")
		switch {
		case spelled[k] != "":
			bad("gpu.driver.params", "%q and %q name the same module (the kernel reads '-' as '_'): give its parameters once", spelled[k], m)
		case !mods[k]:
			bad("gpu.driver.params", "%q is not in gpu.driver.modules (%s): add it there to load it with these parameters", m, strings.Join(sortedKeys(mods), ", "))
		case strings.ContainsAny(p, "\n\x00"):
			bad("gpu.driver.params", "%s: parameters contain a newline or NUL", m)
		}
		spelled[k] = m
		params[k] = p
	}
	d.Params = nil
	if len(params) > 0 {
		d.Params = params
	}
	switch g.NVSwitch {
	case "":
		g.NVSwitch = "refuse"
	case "refuse", "without-nvlink":
	default:
		bad("gpu.nvswitch", "%q must be refuse or without-nvlink", g.NVSwitch)
	}
}

func boolKeys(m map[string]string) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
