package oci

import (
	"fmt"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Input is what the sandbox container's spec is made of for one step.
type Input struct {
	// RootfsPath is the container's root filesystem, absolute, mounted by
	// the caller (the cached image with a writable overlay): root.path,
	// writable.
	RootfsPath string
	// Hostname is the container's host name ("" keeps the UTS namespace's
	// inherited one).
	Hostname string
	// UID, GID and AdditionalGids are the job's credentials; the init
	// process runs with them and no capabilities.
	UID, GID       uint32
	AdditionalGids []uint32
	// Init is the container's init process.
	Init Process
	// Mounts are the step's shares, in any order (parents are mounted
	// before what lies beneath them).
	Mounts []Mount
	// CgroupsPath is linux.cgroupsPath: an absolute cgroupfs path, the
	// step's cgroup or one below it (the systemd slice:prefix:name form is
	// refused). Under cgroup v1 scancel does not kill processes in a child
	// of the step's freezer cgroup (doc.go).
	CgroupsPath string
	// NetNS is a network namespace to join (/proc/<pid>/ns/net or a
	// bind-mounted one); "" gives the container a new one with loopback
	// only.
	NetNS string
	// Devices are the VFIO character devices of the step's GPUs:
	// /dev/vfio/<group> for each IOMMU group and /dev/vfio/vfio.
	Devices []Device
	// Annotations are the spec's annotations (Kata's per-sandbox
	// settings, e.g. katacfg.Annotations).
	Annotations map[string]string
}

// Process is the container's init process.
type Process struct {
	// Args is argv; Args[0] is looked up in the container's PATH.
	Args []string
	// Env is KEY=value entries.
	Env []string
	// Cwd is the absolute working directory ("" is /).
	Cwd string
}

// Mount is one share.
type Mount struct {
	// Source is the host directory, a path the runtime resolves in the
	// mount namespace it starts in (the caller's): the launcher opens the
	// user's directory with the user's credentials and bind-mounts that
	// fd onto a root-owned staging path, read-only there for a read-only
	// share. Not in /proc (a /proc/<pid>/fd/<n> name is refused: doc.go).
	Source string
	// Destination is where it appears in the container: absolute, clean,
	// not / and not in /proc, /sys or /dev.
	Destination string
	// ReadOnly makes it read-only in the container.
	ReadOnly bool
}

// Device is a character device passed to the container.
type Device struct {
	// Path is /dev/vfio/vfio or /dev/vfio/<IOMMU group number>, the same
	// path as on the host.
	Path string
	// Major and Minor are the host device's numbers (Kata finds the host
	// device, and the group's PCI devices, from them).
	Major, Minor int64
}

// Spec is the sandbox container's OCI runtime spec for in. Errors name
// the field, the value and the rule. The spec follows containerd's
// defaults (pkg/oci populateDefaultUnixSpec) where doc.go does not say
// otherwise.
func Spec(in Input) (*specs.Spec, error) {
	if err := checkAbs("RootfsPath", in.RootfsPath); err != nil {
		return nil, err
	}
	if in.Hostname != "" && !hostnameRE.MatchString(in.Hostname) {
		return nil, fmt.Errorf("oci spec: Hostname %q must be 1-63 letters, digits and '-' (RFC 1123 label)", in.Hostname)
	}
	proc, err := process(in)
	if err != nil {
		return nil, err
	}
	mounts, err := shares(in.Mounts)
	if err != nil {
		return nil, err
	}
	if err := checkAbs("CgroupsPath", in.CgroupsPath); err != nil {
		return nil, err
	}
	if in.CgroupsPath == "/" || strings.Contains(in.CgroupsPath, ":") {
		return nil, fmt.Errorf("oci spec: CgroupsPath %q must be a cgroup below the step's (cgroupfs path, not / nor systemd's slice:prefix:name)", in.CgroupsPath)
	}
	if in.NetNS != "" {
		if err := checkAbs("NetNS", in.NetNS); err != nil {
			return nil, err
		}
	}
	devices, rules, err := devices(in)
	if err != nil {
		return nil, err
	}
	var ann map[string]string
	for k, v := range in.Annotations {
		if k == "" {
			return nil, fmt.Errorf("oci spec: an annotation with an empty key (value %q)", v)
		}
		if ann == nil {
			ann = make(map[string]string, len(in.Annotations))
		}
		ann[k] = v
	}
	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: in.NetNS}
	return &specs.Spec{
		Version:     specs.Version,
		Root:        &specs.Root{Path: in.RootfsPath, Readonly: false},
		Process:     proc,
		Hostname:    in.Hostname,
		Mounts:      append(defaultMounts(), mounts...),
		Annotations: ann,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				netns,
			},
			CgroupsPath: in.CgroupsPath,
			// Kata's shim dereferences linux.resources: always present.
			Resources:     &specs.LinuxResources{Devices: rules},
			Devices:       devices,
			MaskedPaths:   maskedPaths(),
			ReadonlyPaths: readonlyPaths(),
		},
	}, nil
}

var (
	hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)
	envKeyRE   = regexp.MustCompile(`^[^=\x00]+=`)
	vfioRE     = regexp.MustCompile(`^/dev/vfio/(vfio|[0-9]+)$`)
)

func checkAbs(field, p string) error {
	if p == "" || !path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("oci spec: %s %q must be an absolute, clean path", field, p)
	}
	return nil
}

func process(in Input) (*specs.Process, error) {
	p := in.Init
	if len(p.Args) == 0 || p.Args[0] == "" {
		return nil, fmt.Errorf("oci spec: Init.Args %q: the init process needs a program", p.Args)
	}
	cwd := p.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if err := checkAbs("Init.Cwd", cwd); err != nil {
		return nil, err
	}
	for i, e := range p.Env {
		if !envKeyRE.MatchString(e) {
			return nil, fmt.Errorf("oci spec: Init.Env[%d] %q must be KEY=value", i, e)
		}
	}
	return &specs.Process{
		Args: append([]string(nil), p.Args...),
		Env:  append([]string(nil), p.Env...),
		Cwd:  cwd,
		User: specs.User{UID: in.UID, GID: in.GID, AdditionalGids: append([]uint32(nil), in.AdditionalGids...)},
		// Present and empty: no capability in any set (an absent
		// capabilities object would leave the runtime's defaults).
		Capabilities:    &specs.LinuxCapabilities{},
		NoNewPrivileges: true,
	}, nil
}

// forbidden are the trees a share may not cover or enter: the runtime's
// own mounts.
var forbidden = []string{"/proc", "/sys", "/dev"}

func shares(ms []Mount) ([]specs.Mount, error) {
	seen := map[string]int{}
	out := make([]specs.Mount, 0, len(ms))
	for i, m := range ms {
		what := fmt.Sprintf("Mounts[%d]", i)
		if err := checkAbs(what+".Source", m.Source); err != nil {
			return nil, err
		}
		if m.Source == "/proc" || strings.HasPrefix(m.Source, "/proc/") {
			return nil, fmt.Errorf("oci spec: %s.Source %q is in /proc: a directory held open by the caller (/proc/<pid>/fd/<n>) is in the caller's mount namespace, and the runtime mounts from its own (runc: EINVAL); bind-mount it onto a staging path (read-only there when the share is) and pass that path", what, m.Source)
		}
		d := m.Destination
		if err := checkAbs(what+".Destination", d); err != nil {
			return nil, err
		}
		if d == "/" {
			return nil, fmt.Errorf("oci spec: %s.Destination %q would hide the root filesystem", what, d)
		}
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				return nil, fmt.Errorf("oci spec: %s.Destination %q is inside %s, which the runtime mounts itself (choose another destination)", what, d, f)
			}
		}
		if j, dup := seen[d]; dup {
			return nil, fmt.Errorf("oci spec: %s.Destination %q is also Mounts[%d]'s", what, d, j)
		}
		seen[d] = i
		opts := []string{"rbind", "rprivate", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = []string{"rbind", "rprivate", "ro", "nosuid", "nodev"}
		}
		out = append(out, specs.Mount{Destination: d, Type: "bind", Source: m.Source, Options: opts})
	}
	// A parent before what lies beneath it (else it would hide it).
	sort.SliceStable(out, func(a, b int) bool {
		return strings.Count(out[a].Destination, "/") < strings.Count(out[b].Destination, "/")
	})
	return out, nil
}

func devices(in Input) ([]specs.LinuxDevice, []specs.LinuxDeviceCgroup, error) {
	rules := []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}
	var out []specs.LinuxDevice
	seen := map[string]bool{}
	for i, d := range in.Devices {
		if !vfioRE.MatchString(d.Path) {
			return nil, nil, fmt.Errorf("oci spec: Devices[%d].Path %q: only VFIO devices (/dev/vfio/<group>, /dev/vfio/vfio) are passed", i, d.Path)
		}
		if d.Major <= 0 || d.Minor < 0 {
			return nil, nil, fmt.Errorf("oci spec: Devices[%d] %s: %d:%d is not a device number (stat the host's device)", i, d.Path, d.Major, d.Minor)
		}
		if seen[d.Path] {
			return nil, nil, fmt.Errorf("oci spec: Devices[%d] %s is given twice", i, d.Path)
		}
		seen[d.Path] = true
		// The group's device is the job's (as the built-in driver
		// hands it to QEMU running as the job); the container file is
		// world-usable like on every host.
		mode, uid, gid := uint32(0o600), in.UID, in.GID
		if d.Path == "/dev/vfio/vfio" {
			mode, uid, gid = 0o666, 0, 0
		}
		out = append(out, specs.LinuxDevice{Path: d.Path, Type: "c", Major: d.Major, Minor: d.Minor, FileMode: ptr(os.FileMode(mode)), UID: ptr(uid), GID: ptr(gid)})
		rules = append(rules, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: ptr(d.Major), Minor: ptr(d.Minor), Access: "rwm"})
	}
	return out, rules, nil
}

func ptr[T any](v T) *T { return &v }

// defaultMounts are containerd's (pkg/oci defaultMounts), but for
// /dev/shm's size (doc.go).
func defaultMounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
	}
}

// maskedPaths and readonlyPaths are containerd's defaults.
func maskedPaths() []string {
	return []string{
		"/proc/acpi",
		"/proc/asound",
		"/proc/kcore",
		"/proc/keys",
		"/proc/latency_stats",
		"/proc/timer_list",
		"/proc/timer_stats",
		"/proc/sched_debug",
		"/sys/firmware",
		"/sys/devices/virtual/powercap",
		"/proc/scsi",
	}
}

func readonlyPaths() []string {
	return []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
}
