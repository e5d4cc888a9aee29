package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr []string // substrings, all must appear
		check   func(*Config) error
	}{
		{name: "empty file gives defaults", in: "", check: func(c *Config) error {
			if c.Resources.VMMOverheadMiB != 256 || c.Timeouts.Boot.Duration != 90*time.Second || c.QEMU.Accel != "auto" {
				return errors.New("defaults not applied")
			}
			return nil
		}},
		{name: "values override", in: "[qemu]\naccel = \"tcg\"\n[timeouts]\nboot = \"2m\"\n", check: func(c *Config) error {
			if c.QEMU.Accel != "tcg" || c.Timeouts.Boot.Duration != 2*time.Minute {
				return errors.New("values not read")
			}
			return nil
		}},
		{name: "unknown key names key and line", in: "driver = \"qemu\"\n\n[resources]\noverlay_mb = 10\n",
			wantErr: []string{"microvm.toml:4: resources.overlay_mb: unknown key"}},
		{name: "unknown table", in: "[qemuu]\nx = 1\n", wantErr: []string{"qemuu", "unknown key"}},
		{name: "bad accel", in: "[qemu]\naccel = \"hvf\"\n", wantErr: []string{"microvm.toml:2: qemu.accel: \"hvf\" must be one of auto, kvm, tcg"}},
		{name: "bad duration", in: "[timeouts]\nboot = \"ninety\"\n", wantErr: []string{"microvm.toml:2", "not a duration"}},
		{name: "wrong type", in: "[resources]\noverlay_mib = \"big\"\n", wantErr: []string{"microvm.toml", "overlay_mib"}},
		{name: "syntax error has line", in: "driver = \n", wantErr: []string{"microvm.toml:1"}},
		{name: "relative runtime dir", in: "runtime_dir = \"run\"\n", wantErr: []string{"microvm.toml:1: runtime_dir: \"run\" must be an absolute path"}},
		{name: "every problem reported", in: "[qemu]\naccel = \"x\"\nbinary = \"\"\n", wantErr: []string{"qemu.accel", "qemu.binary"}},
		{name: "image limit zero", in: "[images]\nmax_entries = 0\n", wantErr: []string{"microvm.toml:2: images.max_entries: 0 must be at least 1"}},
		{name: "cache limit zero", in: "[images]\ncache_mib = 0\n", wantErr: []string{"microvm.toml:2: images.cache_mib: 0 must be at least 1"}},
		{name: "assets cache limit zero", in: "[images]\nassets_cache_mib = 0\n", wantErr: []string{"microvm.toml:2: images.assets_cache_mib: 0 must be at least 1"}},
		{name: "runas off with the default shares", in: "[qemu]\nrunas = false\n",
			wantErr: []string{"microvm.toml:2: qemu.runas: false runs QEMU as root", "mounts.scratch_base", "mounts.allowed", "mpi.default = auto", "set runas = true"}},
		{name: "runas off with one site mount", in: "[qemu]\nrunas = false\n[mounts]\nallowed = []\nscratch_base = \"\"\nsite = [\"/opt/site:/opt/site:ro\"]\n[mpi]\ndefault = \"off\"\n",
			wantErr: []string{"qemu.runas", "host shares are possible (mounts.site)"}},
		{name: "runas off without any share", in: "[qemu]\nrunas = false\n[mounts]\nallowed = []\nscratch_base = \"\"\n[mpi]\ndefault = \"image\"\n",
			check: func(c *Config) error { return nil }},
		{name: "more site mounts than a microVM takes", in: "[mounts]\nsite = [" + siteMounts(20) + "]\n",
			wantErr: []string{"mounts.site: 22 site mounts, scratch and the host MPI share: a microVM takes at most 20 host shares"}},
		{name: "gpu driver defaults", in: "", check: func(c *Config) error {
			if d := c.GPU.Driver; !*d.Inject || d.Root != "/" || len(d.Modules) != 0 || d.Params != nil || c.GPU.NVSwitch != "refuse" {
				return fmt.Errorf("gpu defaults %+v %q", d, c.GPU.NVSwitch)
			}
			return nil
		}},
		{name: "gpu driver modules and params spelled the kernel's way", in: "[gpu.driver]\nmodules = [\"nvidia\", \"nvidia-uvm\", \"nvidia-peermem\"]\n[gpu.driver.params]\nnvidia-uvm = \"uvm_perf_prefetch_enable=0\"\n",
			check: func(c *Config) error {
				if strings.Join(c.GPU.Driver.Modules, " ") != "nvidia nvidia_uvm nvidia_peermem" || c.GPU.Driver.Params["nvidia_uvm"] != "uvm_perf_prefetch_enable=0" {
					return fmt.Errorf("modules %q params %q", c.GPU.Driver.Modules, c.GPU.Driver.Params)
				}
				return nil
			}},
		{name: "gpu driver relative root", in: "[gpu.driver]\nroot = \"run/nvidia/driver\"\n", wantErr: []string{"gpu.driver.root: \"run/nvidia/driver\" must be an absolute path"}},
		{name: "gpu driver bad module name", in: "[gpu.driver]\nmodules = [\"nvidia\", \"nv/idia\", \"-\"]\n", wantErr: []string{"gpu.driver.modules: \"nv/idia\" is not a kernel module name", "\"-\" is not a kernel module name"}},
		{name: "gpu driver modules without nvidia", in: "[gpu.driver]\nmodules = [\"nvidia_uvm\"]\n", wantErr: []string{"gpu.driver.modules", "lacks nvidia"}},
		{name: "gpu driver params for a module not loaded", in: "[gpu.driver.params]\nnvidia_drm = \"modeset=1\"\n", wantErr: []string{"gpu.driver.params: \"nvidia_drm\" is not in gpu.driver.modules (nvidia, nvidia_uvm): add it there"}},
		{name: "gpu driver params newline", in: "[gpu.driver.params]\nnvidia = \"a=1\\nb=2\"\n", wantErr: []string{"gpu.driver.params: nvidia: parameters contain a newline"}},
		{name: "gpu driver params twice", in: "[gpu.driver.params]\nnvidia-uvm = \"a=1\"\nnvidia_uvm = \"a=2\"\n", wantErr: []string{"name the same module"}},
		{name: "bad nvswitch", in: "[gpu]\nnvswitch = \"allow\"\n", wantErr: []string{"gpu.nvswitch: \"allow\" must be refuse or without-nvlink"}},
		{name: "agent watchdog defaults", in: "", check: func(c *Config) error {
			if c.Timeouts.AgentPing.Duration != 5*time.Second || c.Timeouts.AgentHang.Duration != 15*time.Second {
				return fmt.Errorf("agent_ping %s agent_hang %s, want 5s and 15s", c.Timeouts.AgentPing, c.Timeouts.AgentHang)
			}
			return nil
		}},
		{name: "agent watchdog values", in: "[timeouts]\nagent_ping = \"1s\"\nagent_hang = \"4s\"\n", check: func(c *Config) error {
			if c.Timeouts.AgentPing.Duration != time.Second || c.Timeouts.AgentHang.Duration != 4*time.Second {
				return fmt.Errorf("agent_ping %s agent_hang %s, want 1s and 4s", c.Timeouts.AgentPing, c.Timeouts.AgentHang)
			}
			return nil
		}},
		{name: "agent_ping not below agent_hang", in: "[timeouts]\nagent_ping = \"20s\"\n",
			wantErr: []string{"microvm.toml:2: timeouts.agent_ping: 20s is not below timeouts.agent_hang (15s)", "make agent_ping shorter"}},
		{name: "agent_ping equal to agent_hang", in: "[timeouts]\nagent_ping = \"3s\"\nagent_hang = \"3s\"\n",
			wantErr: []string{"timeouts.agent_ping: 3s is not below timeouts.agent_hang (3s)"}},
		{name: "metrics textfile relative", in: "[metrics]\ntextfile = \"m.prom\"\n", wantErr: []string{"microvm.toml:2: metrics.textfile: \"m.prom\" must be an absolute path"}},
		{name: "metrics textfile not .prom", in: "[metrics]\ntextfile = \"/var/lib/x/m.txt\"\n", wantErr: []string{"microvm.toml:2: metrics.textfile", "ends in \".prom\""}},
		{name: "metrics textfile", in: "[metrics]\ntextfile = \"/var/lib/x/m.prom\"\n", check: func(c *Config) error {
			if c.Metrics.Textfile != "/var/lib/x/m.prom" {
				return errors.New("metrics.textfile not read")
			}
			return nil
		}},
		{name: "agent_hang zero", in: "[timeouts]\nagent_hang = \"0s\"\n", wantErr: []string{"microvm.toml:2: timeouts.agent_hang: 0s must be positive"}},
		{name: "agent_ping negative", in: "[timeouts]\nagent_ping = \"-1s\"\n", wantErr: []string{"microvm.toml:2: timeouts.agent_ping: -1s must be positive"}},
		{name: "kata with host shares and virtiofsd as root", in: "runtime = \"kata\"\n",
			wantErr: []string{"microvm.toml:1: runtime: \"kata\": Kata's virtiofsd serves the host shares as root", "mounts.scratch_base", "kata.allow_root_virtiofsd = true"}},
		{name: "kata without shares", in: "runtime = \"kata\"\n[mounts]\nallowed = []\nscratch_base = \"\"\n[mpi]\ndefault = \"image\"\n", check: func(c *Config) error { return nil }},
		{name: "runtime kata", in: "runtime = \"kata\"\n[kata]\nallow_root_virtiofsd = true\n", check: func(c *Config) error {
			if c.Driver != "kata" || c.Kata.Mode != "shim" || c.Kata.Namespace != "slurm-microvm" || c.Kata.RuntimeHandler != "io.containerd.kata.v2" {
				return fmt.Errorf("runtime %q kata %+v", c.Driver, c.Kata)
			}
			return nil
		}},
		{name: "driver is the older name of runtime", in: "driver = \"kata\"\n[kata]\nallow_root_virtiofsd = true\n", check: func(c *Config) error {
			if c.Driver != "kata" {
				return fmt.Errorf("runtime %q, want kata", c.Driver)
			}
			return nil
		}},
		{name: "driver contradicts runtime", in: "runtime = \"kata\"\ndriver = \"qemu\"\n[kata]\nallow_root_virtiofsd = true\n",
			wantErr: []string{"microvm.toml:2: driver: \"qemu\" contradicts runtime = \"kata\""}},
		{name: "unknown runtime", in: "runtime = \"firecracker\"\n", wantErr: []string{"microvm.toml:1: runtime: \"firecracker\" is not a runtime driver (known: qemu, kata)"}},
		{name: "bad kata mode and namespace", in: "[kata]\nmode = \"cri\"\nnamespace = \"a/b\"\n",
			wantErr: []string{"microvm.toml:2: kata.mode: \"cri\" must be one of shim, containerd", "microvm.toml:3: kata.namespace: \"a/b\""}},
		{name: "kata containerd needs an absolute socket", in: "[kata]\nmode = \"containerd\"\ncontainerd_address = \"containerd.sock\"\n",
			wantErr: []string{"kata.containerd_address: \"containerd.sock\" must be an absolute path"}},
		{name: "memory below minimum", in: "[resources]\ndefault_memory_mib = 100\n", wantErr: []string{"default_memory_mib: 100 MiB is below min_memory_mib"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("microvm.toml", []byte(tt.in))
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error, want %q", tt.wantErr)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := tt.check(c); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// siteMounts is n site mount specs, TOML-quoted.
func siteMounts(n int) string {
	var l []string
	for i := 0; i < n; i++ {
		l = append(l, fmt.Sprintf("%q", fmt.Sprintf("/opt/s%d:/opt/s%d:ro", i, i)))
	}
	return strings.Join(l, ", ")
}

func TestLoadMissing(t *testing.T) {
	if _, err := Load("/nonexistent/microvm.toml", true); err != nil {
		t.Fatalf("missing file with missingOK: %v", err)
	}
	if _, err := Load("/nonexistent/microvm.toml", false); err == nil {
		t.Fatal("missing file without missingOK: no error")
	}
}

// The example shipped in etc/ must stay valid and equal to the defaults.
func TestExampleConfig(t *testing.T) {
	c, err := Load("../../etc/microvm.toml", false)
	if err != nil {
		t.Fatal(err)
	}
	d := Defaults()
	if c.RuntimeDir != d.RuntimeDir || c.Resources != d.Resources || c.Timeouts != d.Timeouts || c.QEMU.Agent != d.QEMU.Agent || !reflect.DeepEqual(c.GPU, d.GPU) || c.MPI != d.MPI || c.Images != d.Images {
		t.Fatalf("etc/microvm.toml differs from the defaults it documents:\n%+v\n%+v", c, d)
	}
}

func TestNegativeSize(t *testing.T) {
	_, err := Parse("microvm.toml", []byte("[resources]\nmin_memory_mib = -5\n"))
	if err == nil || !strings.Contains(err.Error(), "microvm.toml:2") || !strings.Contains(err.Error(), "min_memory_mib") || !strings.Contains(err.Error(), "-5 is negative") {
		t.Fatalf("err = %v, want the line, the key and the rule", err)
	}
}

// config check tests the scratch base's ownership always, the (old)
// default under world-writable /var/tmp included, and the runtime root.
func TestCheckHostScratchAndRuntime(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Root(t, "the runtime root is root's")
	}
	rt, err := os.MkdirTemp("/run", "smv-config-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rt) })
	for _, tt := range []struct {
		name, scratch, runtime, wantKey string
	}{
		{"old default under /var/tmp", "/var/tmp/slurm-microvm-scratch", rt + "/ok", "mounts.scratch_base"},
		{"under /tmp", "/tmp/smv-scratch-test", rt + "/ok", "mounts.scratch_base"},
		{"root-owned", rt + "/scratch", rt + "/ok", ""},
		{"runtime root under sticky /tmp", rt + "/scratch", "/tmp", "runtime_dir"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := Defaults()
			c.Mounts.ScratchBase, c.RuntimeDir = tt.scratch, tt.runtime
			err := c.CheckHost("microvm.toml")
			var got []string
			for _, e := range unwrapAll(err) {
				var ce *Error
				if errors.As(e, &ce) && (ce.Key == "mounts.scratch_base" || ce.Key == "runtime_dir") {
					got = append(got, ce.Key)
				}
			}
			if (tt.wantKey == "") != (len(got) == 0) || (tt.wantKey != "" && got[0] != tt.wantKey) {
				t.Fatalf("CheckHost: %v; want an error for %q only", err, tt.wantKey)
			}
		})
	}
}

func unwrapAll(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// TestBoolDefaultsIndependent: setting one boolean key to false leaves the
// other boolean defaults true (the decoder writes through the default's
// pointer; one shared variable turned qemu.runas off with qemu.seccomp).
func TestBoolDefaultsIndependent(t *testing.T) {
	for _, tc := range []struct {
		file string
		want [3]bool // runas, seccomp, inject
	}{
		{"[qemu]\nseccomp = false\n[mounts]\nallowed = []\nscratch_base = \"\"\n[mpi]\ndefault = \"off\"\n", [3]bool{true, false, true}},
		{"[gpu.driver]\ninject = false\n", [3]bool{true, true, false}},
		{"", [3]bool{true, true, true}},
	} {
		p := filepath.Join(t.TempDir(), "microvm.toml")
		if err := os.WriteFile(p, []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p, false)
		if err != nil {
			t.Fatalf("%q: %v", tc.file, err)
		}
		got := [3]bool{*c.QEMU.RunAs, *c.QEMU.Seccomp, *c.GPU.Driver.Inject}
		if got != tc.want {
			t.Errorf("%q: runas, seccomp, inject = %v, want %v", tc.file, got, tc.want)
		}
	}
}

// TestCheckHugePages: qemu.hugepages is a page size of x86-64, and config
// check wants the kernel to have that size and a pool that is not empty
// (fake sysfs trees; and the host's own, whatever its pool holds).
func TestCheckHugePages(t *testing.T) {
	for _, c := range []struct {
		size string
		mib  uint64
		ok   bool
	}{{"", 0, true}, {"2M", 2, true}, {"1G", 1024, true}, {"4M", 0, false}, {"/dev/hugepages", 0, false}, {"2m", 0, false}} {
		mib, err := HugePageMiB(c.size)
		if (err == nil) != c.ok || mib != c.mib {
			t.Errorf("HugePageMiB(%q) = %d, %v", c.size, mib, err)
		}
	}
	if _, err := Parse("t.toml", []byte("[qemu]\nhugepages = \"/dev/hugepages\"\n")); err == nil || !strings.Contains(err.Error(), "qemu.hugepages") {
		t.Errorf("a hugetlbfs path (the old form) accepted: %v", err)
	}
	sysfs := t.TempDir()
	pool := func(kb, nr, over string) {
		d := filepath.Join(sysfs, "hugepages-"+kb+"kB")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile(filepath.Join(d, "nr_hugepages"), []byte(nr+"\n"), 0o644)
		_ = os.WriteFile(filepath.Join(d, "nr_overcommit_hugepages"), []byte(over+"\n"), 0o644)
	}
	pool("2048", "0", "0")
	if err := CheckHugePages(sysfs, "2M"); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("an empty 2M pool: %v", err)
	}
	pool("2048", "0", "16")
	if err := CheckHugePages(sysfs, "2M"); err != nil {
		t.Errorf("a 2M pool that may overcommit: %v", err)
	}
	pool("2048", "512", "0")
	if err := CheckHugePages(sysfs, "2M"); err != nil {
		t.Errorf("a reserved 2M pool: %v", err)
	}
	if err := CheckHugePages(sysfs, "1G"); err == nil || !strings.Contains(err.Error(), "no 1G huge pages") {
		t.Errorf("a kernel without 1G pages: %v", err)
	}
	if err := CheckHugePages("/sys/kernel/mm/hugepages", "2M"); err != nil && !strings.Contains(err.Error(), "empty") {
		t.Errorf("the host's 2M pool: %v", err)
	}
}
