package katacfg

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/check")

// shippedName is the name the test files are parsed under, so that the
// golden files do not depend on the test's temporary directory.
const shippedName = "/etc/kata-containers/configuration.toml"

func shipped(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/configuration-qemu.toml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// edit replaces each old (which must occur exactly once) with new.
func edit(t *testing.T, s string, pairs ...string) string {
	t.Helper()
	for i := 0; i+1 < len(pairs); i += 2 {
		if n := strings.Count(s, pairs[i]); n != 1 {
			t.Fatalf("edit: %q occurs %d times in the test configuration", pairs[i], n)
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	return s
}

// site is what a site running slurm-microvm changes in Kata's shipped
// file: every rule passes for a two-GPU step.
var site = []string{
	"sandbox_cgroup_only=false", "sandbox_cgroup_only=true",
	`enable_annotations = ["enable_iommu", "virtio_fs_extra_args", "kernel_params"]`,
	`enable_annotations = ["enable_iommu", "virtio_fs_extra_args", "kernel_params", "default_vcpus", "default_memory"]`,
	`#cold_plug_vfio = "root-port"`, `cold_plug_vfio = "root-port"`,
	`#pcie_root_port = 2`, `pcie_root_port = 8`,
}

// siteWith is the site's file with further edits.
func siteWith(t *testing.T, pairs ...string) string {
	return edit(t, edit(t, shipped(t), site...), pairs...)
}

func free(m map[string]uint64) func(string) (uint64, error) {
	return func(dir string) (uint64, error) {
		v, ok := m[dir]
		if !ok {
			return 0, fmt.Errorf("statfs %s: no such file or directory", dir)
		}
		return v, nil
	}
}

// TestCheck: each problem appears with its setting and disappears with
// the fix; the messages are the golden files testdata/check/<name>.golden
// (go test -update rewrites them).
func TestCheck(t *testing.T) {
	roomy := free(map[string]uint64{"/dev/shm": 65536, "/dev/hugepages": 65536, "/srv/guestmem": 65536})
	step := Need{CPUs: 4, MemoryMiB: 8192, GPUs: 2, FreeMiB: roomy}
	with := func(f func(*Need)) Need { n := step; f(&n); return n }
	small := free(map[string]uint64{"/dev/shm": 4096, "/dev/hugepages": 4096, "/srv/guestmem": 1024})

	tests := []struct {
		name string
		file string
		need Need
		keys []string // the problems' keys, in order
	}{
		{"shipped", shipped(t), with(func(n *Need) { n.FreeMiB = small }), []string{
			"runtime.sandbox_cgroup_only", "hypervisor.qemu.enable_annotations", "hypervisor.qemu.cold_plug_vfio", "hypervisor.qemu.shared_fs"}},
		{"site", siteWith(t), step, nil},
		{"sandbox_cgroup_only-false", siteWith(t, "sandbox_cgroup_only=true", "sandbox_cgroup_only=false"), step, []string{"runtime.sandbox_cgroup_only"}},
		{"sandbox_cgroup_only-absent", siteWith(t, "sandbox_cgroup_only=true", ""), step, []string{"runtime.sandbox_cgroup_only"}},
		{"annotations-no-memory", siteWith(t, `"default_vcpus", "default_memory"]`, `"default_vcpus"]`), step, []string{"hypervisor.qemu.enable_annotations"}},
		{"annotations-anchored-vcpus-only", siteWith(t, `"default_vcpus", "default_memory"]`, `"^default_vcpus$"]`), step, []string{"hypervisor.qemu.enable_annotations"}},
		{"annotations-regexp-all", siteWith(t, `"default_vcpus", "default_memory"]`, `".*"]`), step, nil},
		{"annotations-regexp-prefix", siteWith(t, `"default_vcpus", "default_memory"]`, `"default_(vcpus|memory)"]`), step, nil},
		{"annotations-unanchored-substring", siteWith(t, `"default_vcpus", "default_memory"]`, `"vcpus", "memory"]`), step, nil},
		{"annotations-bad-regexp", siteWith(t, `"default_vcpus", "default_memory"]`, `"default_vcpus", "default_memory", "default_("]`), step, []string{"hypervisor.qemu.enable_annotations"}},
		{"gpu-cold-plug-off", siteWith(t, `cold_plug_vfio = "root-port"`, `cold_plug_vfio = "no-port"`), step, []string{"hypervisor.qemu.cold_plug_vfio"}},
		{"gpu-cold-plug-off-no-gpus", siteWith(t, `cold_plug_vfio = "root-port"`, `cold_plug_vfio = "no-port"`), with(func(n *Need) { n.GPUs = 0 }), nil},
		{"gpu-bridge-port", siteWith(t, `cold_plug_vfio = "root-port"`, `cold_plug_vfio = "bridge-port"`), step, []string{"hypervisor.qemu.cold_plug_vfio"}},
		{"gpu-too-few-root-ports", siteWith(t, "pcie_root_port = 8", "pcie_root_port = 1"), step, []string{"hypervisor.qemu.pcie_root_port"}},
		{"gpu-enough-root-ports", siteWith(t, "pcie_root_port = 8", "pcie_root_port = 2"), step, nil},
		{"gpu-switch-port-none", siteWith(t, `cold_plug_vfio = "root-port"`, `cold_plug_vfio = "switch-port"`), step, []string{"hypervisor.qemu.pcie_switch_port"}},
		{"gpu-switch-port", siteWith(t, `cold_plug_vfio = "root-port"`, "cold_plug_vfio = \"switch-port\"\npcie_switch_port = 4"), step, nil},
		{"gpu-vfio-mode-vfio", siteWith(t, `vfio_mode="guest-kernel"`, `vfio_mode="vfio"`), step, []string{"runtime.vfio_mode"}},
		{"gpu-vfio-mode-vfio-no-gpus", siteWith(t, `vfio_mode="guest-kernel"`, `vfio_mode="vfio"`), with(func(n *Need) { n.GPUs = 0 }), nil},
		{"gpu-hot-and-cold", siteWith(t, `#hot_plug_vfio = "root-port"`, `hot_plug_vfio = "root-port"`), step, []string{"hypervisor.qemu.hot_plug_vfio"}},
		{"gpu-too-many", siteWith(t, "pcie_root_port = 8", "pcie_root_port = 16"), with(func(n *Need) { n.GPUs = 17 }), []string{"hypervisor.qemu.cold_plug_vfio"}},
		{"shared-fs-none", siteWith(t, `shared_fs = "virtio-fs"`, `shared_fs = "none"`), step, []string{"hypervisor.qemu.shared_fs"}},
		{"shared-fs-none-confidential", siteWith(t, `shared_fs = "virtio-fs"`, `shared_fs = "none"`, "# confidential_guest = true", "confidential_guest = true"), step, []string{"hypervisor.qemu.shared_fs"}},
		{"shared-fs-9p-small-shm", siteWith(t, `shared_fs = "virtio-fs"`, `shared_fs = "virtio-9p"`), with(func(n *Need) { n.FreeMiB = small }), nil},
		{"shm-too-small", siteWith(t), with(func(n *Need) { n.FreeMiB = small }), []string{"hypervisor.qemu.shared_fs"}},
		{"shm-absent-shared-fs-key", siteWith(t, "shared_fs = \"virtio-fs\"\n", ""), with(func(n *Need) { n.FreeMiB = small }), []string{"hypervisor.qemu.shared_fs"}},
		{"shm-not-measured", siteWith(t), with(func(n *Need) { n.FreeMiB = nil }), nil},
		{"shm-hugepages", siteWith(t, "#enable_hugepages = true", "enable_hugepages = true"), with(func(n *Need) { n.FreeMiB = small }), nil},
		{"file-mem-backend-too-small", siteWith(t, `#file_mem_backend = ""`, `file_mem_backend = "/srv/guestmem"`), with(func(n *Need) { n.FreeMiB = small }), []string{"hypervisor.qemu.file_mem_backend"}},
		{"file-mem-backend-roomy", siteWith(t, `#file_mem_backend = ""`, `file_mem_backend = "/srv/guestmem"`), with(func(n *Need) { n.FreeMiB = small; n.MemoryMiB = 1024 }), nil},
		{"file-mem-backend-missing", siteWith(t, `#file_mem_backend = ""`, `file_mem_backend = "/nonexistent"`), step, []string{"hypervisor.qemu.file_mem_backend"}},
		{"maxvcpus", siteWith(t, "default_maxvcpus = 0", "default_maxvcpus = 2"), step, []string{"hypervisor.qemu.default_maxvcpus"}},
		{"maxvcpus-fits", siteWith(t, "default_maxvcpus = 0", "default_maxvcpus = 4"), step, nil},
		{"maxmemory", siteWith(t, "default_maxmemory = 0", "default_maxmemory = 4096"), step, []string{"hypervisor.qemu.default_maxmemory"}},
		{"clh-memfd", strings.Replace(siteWith(t), "[hypervisor.qemu]", "[hypervisor.clh]", 1), with(func(n *Need) { n.FreeMiB = small; n.GPUs = 0 }), nil},
		{"firecracker", strings.Replace(siteWith(t), "[hypervisor.qemu]", "[hypervisor.firecracker]", 1), with(func(n *Need) { n.GPUs = 0 }), []string{"hypervisor.firecracker.shared_fs"}},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if seen[tt.name] {
				t.Fatalf("two cases named %s", tt.name)
			}
			seen[tt.name] = true
			cfg, err := Parse(shippedName, []byte(tt.file))
			if err != nil {
				t.Fatal(err)
			}
			ps := Check(cfg, tt.need)
			var keys []string
			var out strings.Builder
			for _, p := range ps {
				keys = append(keys, p.Key)
				out.WriteString(p.String() + "\n")
				if p.Line == 0 || p.Fix == "" || p.Rule == "" {
					t.Errorf("problem without a line, rule or fix: %#v", p)
				}
			}
			if !reflect.DeepEqual(keys, tt.keys) {
				t.Errorf("problems on keys %q, want %q:\n%s", keys, tt.keys, out.String())
			}
			golden(t, filepath.Join("testdata", "check", tt.name+".golden"), out.String())
		})
	}
}

func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run %s -update writes it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -update rewrites it):\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// TestProblemLines: a problem points at the key's own line in the file.
func TestProblemLines(t *testing.T) {
	file := shipped(t)
	cfg, err := Parse(shippedName, []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	lineOf := func(s string) int {
		for i, l := range strings.Split(file, "\n") {
			if strings.HasPrefix(l, s) {
				return i + 1
			}
		}
		t.Fatalf("%q not in the file", s)
		return 0
	}
	want := map[string]int{
		"runtime.sandbox_cgroup_only":        lineOf("sandbox_cgroup_only="),
		"hypervisor.qemu.enable_annotations": lineOf("enable_annotations ="),
		"hypervisor.qemu.cold_plug_vfio":     lineOf("[hypervisor.qemu]"), // commented out: the table's line
	}
	for _, p := range Check(cfg, Need{GPUs: 1}) {
		if w, ok := want[p.Key]; ok && p.Line != w {
			t.Errorf("%s: line %d, want %d", p.Key, p.Line, w)
		}
		delete(want, p.Key)
	}
	if len(want) > 0 {
		t.Errorf("no problem on %v", want)
	}
	if got := cfg.lines["hypervisor.qemu.virtio_fs_cache"]; got != lineOf("virtio_fs_cache =") {
		t.Errorf("a key after a multi-line array: line %d, want %d", got, lineOf("virtio_fs_cache ="))
	}
}

func TestAnnotations(t *testing.T) {
	ok, err := Parse(shippedName, []byte(siteWith(t)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Annotations(ok, 8, 30000)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"io.katacontainers.config.hypervisor.default_vcpus":  "8",
		"io.katacontainers.config.hypervisor.default_memory": "30000",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Annotations = %v, want %v", got, want)
	}

	refused, err := Parse(shippedName, []byte(shipped(t)))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  *Config
		cpus int
		mem  uint64
		says []string
	}{
		{"not allowed", refused, 8, 30000, []string{shippedName + ":", "hypervisor.qemu.enable_annotations", "default_vcpus and default_memory", `"default_vcpus", "default_memory"]`}},
		{"no vCPU", ok, 0, 30000, []string{"0 vCPUs"}},
		{"below Kata's minimum", ok, 1, 255, []string{"255 MiB", "256"}},
		{"above uint32 MiB", ok, 1, 1 << 32, []string{"4294967296 MiB"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Annotations(tt.cfg, tt.cpus, tt.mem)
			if err == nil {
				t.Fatalf("Annotations = %v, want an error", m)
			}
			for _, s := range tt.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
	_, err = Annotations(refused, 8, 30000)
	var p Problem
	if !errors.As(err, &p) || p.Key != "hypervisor.qemu.enable_annotations" || p.Line == 0 {
		t.Errorf("error %v is not a Problem on enable_annotations with its line", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	second := write("second.toml", shipped(t))
	cfg, err := load("", []string{filepath.Join(dir, "first.toml"), second, write("third.toml", "")})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Path != second || cfg.HypervisorName != "qemu" || cfg.Hypervisor.DefaultMemory != 2048 || cfg.Hypervisor.SharedFS != "virtio-fs" {
		t.Errorf("search read %s hypervisor %s %+v, want %s qemu (2048 MiB, virtio-fs)", cfg.Path, cfg.HypervisorName, cfg.Hypervisor, second)
	}
	if cfg, err := Load(second); err != nil || cfg.Path != second {
		t.Errorf("Load(%s) = %v, %v", second, cfg, err)
	}

	twoTables := shipped(t) + "\n[hypervisor.clh]\npath = \"/opt/kata/bin/cloud-hypervisor\"\n"
	tests := []struct {
		name   string
		search []string
		path   string
		says   []string
	}{
		{"none found", []string{filepath.Join(dir, "a.toml"), filepath.Join(dir, "b.toml")}, "", []string{"a.toml, " + filepath.Join(dir, "b.toml"), "kata.configuration"}},
		{"missing file", nil, filepath.Join(dir, "gone.toml"), []string{"gone.toml"}},
		{"not TOML", nil, write("bad.toml", "[hypervisor.qemu]\npath = \n"), []string{"bad.toml:2:"}},
		{"wrong type", nil, write("type.toml", "[hypervisor.qemu]\ndefault_memory = \"big\"\n"), []string{"type.toml", "default_memory"}},
		{"no hypervisor", nil, write("nohv.toml", "[runtime]\nsandbox_cgroup_only = true\n"), []string{"nohv.toml", "no [hypervisor.<name>] table"}},
		{"two hypervisors", nil, write("two.toml", twoTables), []string{"two.toml", "clh, qemu", "runtime.hypervisor_name"}},
		{"hypervisor_name names none", nil, write("name.toml", "[hypervisor.qemu]\n[runtime]\nhypervisor_name = \"dragonball\"\n"), []string{"name.toml:3", "dragonball"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := load(tt.path, tt.search)
			if err == nil {
				t.Fatalf("load = %+v, want an error", cfg)
			}
			for _, s := range tt.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}

	picked, err := Load(write("picked.toml", strings.Replace(twoTables, "[runtime]\n", "[runtime]\nhypervisor_name = \"clh\"\n", 1)))
	if err != nil || picked.HypervisorName != "clh" {
		t.Errorf("runtime.hypervisor_name = clh: %+v, %v", picked, err)
	}
}

// TestSummary names the settings config check prints.
func TestSummary(t *testing.T) {
	cfg, err := Parse(shippedName, []byte(siteWith(t, "static_sandbox_resource_mgmt=false", "static_sandbox_resource_mgmt=true")))
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Summary()
	want := "hypervisor qemu, sandbox_cgroup_only = true, sizing annotations allowed, shared_fs virtio-fs, cold_plug_vfio root-port x8, static_sandbox_resource_mgmt, guest RAM in /dev/shm"
	if got != want {
		t.Errorf("Summary = %q, want %q", got, want)
	}
}

// TestStatfsFreeMiB measures a real filesystem.
func TestStatfsFreeMiB(t *testing.T) {
	if _, err := StatfsFreeMiB(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if _, err := StatfsFreeMiB(filepath.Join(t.TempDir(), "gone")); err == nil {
		t.Error("StatfsFreeMiB of a missing directory: no error")
	}
}
