package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigCheckKata: with runtime = "kata", config check reads Kata's
// configuration.toml (kata.configuration) and exits non-zero naming each
// problem's file, line and key, or prints one ok line; the QEMU binary is
// not required then.
func TestConfigCheckKata(t *testing.T) {
	dir := t.TempDir()
	shippedBytes, err := os.ReadFile("../../launcher/kata/katacfg/testdata/configuration-qemu.toml")
	if err != nil {
		t.Fatal(err)
	}
	shipped := string(shippedBytes)
	site := strings.NewReplacer(
		"sandbox_cgroup_only=false", "sandbox_cgroup_only=true",
		`"kernel_params"]`, `"kernel_params", "default_vcpus", "default_memory"]`,
		`#cold_plug_vfio = "root-port"`, `cold_plug_vfio = "root-port"`,
		`#pcie_root_port = 2`, `pcie_root_port = 8`,
	).Replace(shipped)
	agent := write(t, dir, "agent", "not a real agent: config check only looks for the file")
	if err := os.MkdirAll(filepath.Join(dir, "cache"), 0o755); err != nil {
		t.Fatal(err)
	}
	microvm := func(name, kataConf string) string {
		return write(t, dir, name, fmt.Sprintf(`runtime = "kata"
runtime_dir = %q
cache_dir = %q
[qemu]
binary = "/nonexistent/qemu-system-x86_64"
agent = %q
[kata]
configuration = %q
shim = "/bin/true"
allow_root_virtiofsd = true
`, filepath.Join(dir, "run"), filepath.Join(dir, "cache"), agent, kataConf))
	}
	siteConf := write(t, dir, "site-configuration.toml", site)
	shippedConf := write(t, dir, "shipped-configuration.toml", shipped)
	noColdPlug := write(t, dir, "nocold-configuration.toml", strings.Replace(site, `cold_plug_vfio = "root-port"`, `cold_plug_vfio = "no-port"`, 1))

	tests := []struct {
		name string
		args []string
		want int
		says []string
	}{
		{"site configuration", []string{"--config", microvm("site.toml", siteConf), "config", "check"}, 0,
			[]string{"kata: " + siteConf + ": ok (hypervisor qemu, sandbox_cgroup_only = true, sizing annotations allowed", "guest RAM in /dev/shm (", "MiB free"}},
		{"site configuration, 2-GPU step", []string{"--config", microvm("site2.toml", siteConf), "config", "check", "--kata-gpus", "2", "--kata-cpus", "4", "--kata-mem-mib", "1024"}, 0,
			[]string{": ok ("}},
		{"shipped configuration", []string{"--config", microvm("shipped.toml", shippedConf), "config", "check"}, 1,
			[]string{shippedConf + ":", "runtime.sandbox_cgroup_only", "hypervisor.qemu.enable_annotations", "2 problem(s)"}},
		{"no cold-plug for a GPU step", []string{"--config", microvm("nocold.toml", noColdPlug), "config", "check", "--kata-gpus", "2"}, 1,
			[]string{noColdPlug + ":", "hypervisor.qemu.cold_plug_vfio", `set cold_plug_vfio = "root-port"`}},
		{"guest larger than /dev/shm", []string{"--config", microvm("big.toml", siteConf), "config", "check", "--kata-mem-mib", "1099511627776"}, 1,
			[]string{"hypervisor.qemu.shared_fs", "/dev/shm", "remount"}},
		{"configuration missing", []string{"--config", microvm("gone.toml", filepath.Join(dir, "no-configuration.toml")), "config", "check"}, 1,
			[]string{"kata: read Kata configuration", "no-configuration.toml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := runApp(t, tt.args...)
			if code != tt.want {
				t.Fatalf("slurm-microvm %s: exit %d, want %d\n%s", strings.Join(tt.args, " "), code, tt.want, out)
			}
			for _, s := range tt.says {
				if !strings.Contains(out, s) {
					t.Errorf("output does not say %q:\n%s", s, out)
				}
			}
			if strings.Contains(out, "qemu.binary") {
				t.Errorf("runtime = kata, yet the QEMU binary was required:\n%s", out)
			}
		})
	}
}
