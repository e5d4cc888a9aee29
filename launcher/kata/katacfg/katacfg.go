package katacfg

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
)

// SearchPath is where Load looks when it is given no path, in order: Kata's
// own order (/etc first, then the defaults of a distribution package), then
// the defaults of Kata's static release (kata-deploy, prefix /opt/kata),
// whose shim has that directory compiled in instead of /usr/share.
func SearchPath() []string {
	return []string{
		"/etc/kata-containers/configuration.toml",
		"/usr/share/defaults/kata-containers/configuration.toml",
		"/opt/kata/share/defaults/kata-containers/configuration.toml",
	}
}

// Config is what the driver needs of one Kata configuration.toml. Every
// other key of the file is ignored.
type Config struct {
	// Path is the file that was read.
	Path string
	// HypervisorName is the [hypervisor.<name>] table in use (qemu, clh,
	// dragonball, firecracker, ...; Kata's NVIDIA GPU files use qemu).
	HypervisorName string
	// Hypervisor is that table.
	Hypervisor Hypervisor
	// Runtime is [runtime].
	Runtime Runtime

	// lines maps a dotted key ("runtime.sandbox_cgroup_only") or a table
	// ("hypervisor.qemu") to its line in the file.
	lines map[string]int
}

// Hypervisor is the part of a [hypervisor.<name>] table the driver reads
// (Kata's names; src/runtime/config/configuration-qemu.toml.in).
type Hypervisor struct {
	// EnableAnnotations are regular expressions; an annotation
	// io.katacontainers.config.hypervisor.<suffix> is accepted when one
	// of them matches <suffix> anywhere (Kata: regexp.MatchString, not
	// anchored). Empty: every hypervisor annotation is refused.
	EnableAnnotations []string `toml:"enable_annotations"`
	// DefaultVCPUs is the VM's vCPUs without an annotation (< 0: all
	// physical cores).
	DefaultVCPUs float64 `toml:"default_vcpus"`
	// DefaultMaxVCPUs bounds the VM's vCPUs; 0: the host's CPUs.
	DefaultMaxVCPUs uint32 `toml:"default_maxvcpus"`
	// DefaultMemory is the VM's RAM in MiB without an annotation.
	DefaultMemory uint32 `toml:"default_memory"`
	// DefaultMaxMemory bounds the VM's RAM in MiB; 0: the host's RAM.
	DefaultMaxMemory uint64 `toml:"default_maxmemory"`
	// SharedFS is virtio-fs (Kata's default), virtio-9p, virtio-fs-nydus
	// or none.
	SharedFS string `toml:"shared_fs"`
	// FileMemBackend is the directory QEMU keeps guest RAM files in;
	// "": /dev/shm when SharedFS is virtio-fs.
	FileMemBackend string `toml:"file_mem_backend"`
	// EnableHugepages backs guest RAM with huge pages instead.
	EnableHugepages bool `toml:"enable_hugepages"`
	// ColdPlugVFIO is where VFIO devices are plugged before boot:
	// no-port (default: off), root-port, switch-port or bridge-port.
	ColdPlugVFIO string `toml:"cold_plug_vfio"`
	// HotPlugVFIO is the same for plugging after boot.
	HotPlugVFIO string `toml:"hot_plug_vfio"`
	// PCIeRootPort is the number of PCIe root ports the VM gets.
	PCIeRootPort uint32 `toml:"pcie_root_port"`
	// PCIeSwitchPort is the number of PCIe switch ports the VM gets.
	PCIeSwitchPort uint32 `toml:"pcie_switch_port"`
	// ConfidentialGuest runs the VM as a TEE guest (SEV-SNP, TDX, ...).
	ConfidentialGuest bool `toml:"confidential_guest"`
}

// Runtime is the part of [runtime] the driver reads.
type Runtime struct {
	// SandboxCgroupOnly puts every Kata process of the sandbox (shim,
	// VMM and its threads, virtiofsd) into the sandbox's cgroup, the OCI
	// spec's linux.cgroupsPath.
	SandboxCgroupOnly bool `toml:"sandbox_cgroup_only"`
	// StaticSandboxResourceMgmt sizes the VM once at boot (default vCPUs
	// and memory plus the container's resources) and never hot-plugs.
	StaticSandboxResourceMgmt bool `toml:"static_sandbox_resource_mgmt"`
	// VFIOMode is how a VFIO device appears in the container: "vfio" (a
	// /dev/vfio group node in the guest) or "guest-kernel" (the guest's
	// kernel drives the device; Kata's default).
	VFIOMode string `toml:"vfio_mode"`
	// HypervisorName picks the [hypervisor.<name>] table (runtime-rs);
	// "": the file must hold exactly one.
	HypervisorName string `toml:"hypervisor_name"`
}

type file struct {
	Hypervisor map[string]Hypervisor `toml:"hypervisor"`
	Runtime    Runtime               `toml:"runtime"`
}

// Load reads a Kata configuration.toml. path "" tries SearchPath in order
// and reads the first that exists (Config.Path says which). Errors name the
// file: none found (with the paths tried), unreadable, not TOML or a key of
// the wrong type (with its line), no [hypervisor.*] table, or several and
// no runtime.hypervisor_name to pick one.
func Load(path string) (*Config, error) {
	return load(path, SearchPath())
}

func load(path string, search []string) (*Config, error) {
	if path == "" {
		for _, p := range search {
			if _, err := os.Stat(p); err == nil {
				path = p
				break
			}
		}
		if path == "" {
			return nil, fmt.Errorf("no Kata configuration: none of %s exists (install Kata Containers, or set kata.configuration in microvm.toml)", strings.Join(search, ", "))
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read Kata configuration: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes data, the content of the Kata configuration file path (for
// messages), as Load does.
func Parse(path string, data []byte) (*Config, error) {
	var f file
	if _, err := toml.Decode(string(data), &f); err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s:%d: %s (Kata reads this file as TOML)", path, pe.Position.Line, pe.Message)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c := &Config{Path: path, Runtime: f.Runtime, lines: keyLines(data)}
	names := make([]string, 0, len(f.Hypervisor))
	for n := range f.Hypervisor {
		names = append(names, n)
	}
	sort.Strings(names)
	switch {
	case f.Runtime.HypervisorName != "":
		h, ok := f.Hypervisor[f.Runtime.HypervisorName]
		if !ok {
			return nil, fmt.Errorf("%s: runtime.hypervisor_name = %q names no [hypervisor.%s] table (tables: %s)", c.where("runtime.hypervisor_name"), f.Runtime.HypervisorName, f.Runtime.HypervisorName, strings.Join(names, ", "))
		}
		c.HypervisorName, c.Hypervisor = f.Runtime.HypervisorName, h
	case len(names) == 1:
		c.HypervisorName, c.Hypervisor = names[0], f.Hypervisor[names[0]]
	case len(names) == 0:
		return nil, fmt.Errorf("%s: no [hypervisor.<name>] table: this is not a Kata runtime configuration (Kata ships one per hypervisor, e.g. configuration-qemu.toml)", path)
	default:
		return nil, fmt.Errorf("%s: %d hypervisor tables (%s): Kata's Go runtime would use any one of them; keep one, or set runtime.hypervisor_name", path, len(names), strings.Join(names, ", "))
	}
	return c, nil
}

// key is the dotted name of a key of the hypervisor table in use.
func (c *Config) key(k string) string { return "hypervisor." + c.HypervisorName + "." + k }

// line is the line of a dotted key, else of its table, else 0.
func (c *Config) line(key string) int {
	if n, ok := c.lines[key]; ok {
		return n
	}
	if i := strings.LastIndex(key, "."); i > 0 {
		return c.lines[key[:i]]
	}
	return 0
}

func (c *Config) where(key string) string {
	if n := c.line(key); n > 0 {
		return fmt.Sprintf("%s:%d", c.Path, n)
	}
	return c.Path
}

// keyLines finds the line of every table header and every key = value of
// a TOML file (the decoder keeps positions to itself). Comment lines and
// keys inside multi-line values are not keys; dotted keys and quoted keys
// are taken as written.
func keyLines(data []byte) map[string]int {
	lines := map[string]int{}
	table := ""
	inMulti := ""
	for i, raw := range strings.Split(string(data), "\n") {
		s := strings.TrimSpace(raw)
		if inMulti != "" {
			if strings.Contains(s, inMulti) {
				inMulti = ""
			}
			continue
		}
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		if strings.HasPrefix(s, "[") {
			name := strings.TrimSpace(strings.Trim(strings.SplitN(s, "#", 2)[0], " []"))
			table = unquoteKey(name)
			if _, ok := lines[table]; !ok {
				lines[table] = i + 1
			}
			continue
		}
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			continue
		}
		k = unquoteKey(strings.TrimSpace(k))
		if table != "" {
			k = table + "." + k
		}
		if _, ok := lines[k]; !ok {
			lines[k] = i + 1
		}
		v = strings.TrimSpace(v)
		for _, q := range []string{`"""`, `'''`} {
			if strings.HasPrefix(v, q) && !strings.Contains(v[3:], q) {
				inMulti = q
			}
		}
		if strings.HasPrefix(v, "[") && !strings.Contains(strings.SplitN(v, "#", 2)[0], "]") {
			inMulti = "]"
		}
	}
	return lines
}

// unquoteKey turns a.b."c.d" into a.b.c.d (good enough for positions).
func unquoteKey(k string) string {
	parts := strings.Split(k, ".")
	for i, p := range parts {
		parts[i] = strings.Trim(strings.TrimSpace(p), `"'`)
	}
	return strings.Join(parts, ".")
}
