package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigCheckKataNode (review): `config check` under runtime = "kata"
// passes only a node where a step can start: the shim it would run exists
// (mode shim), containerd's socket exists (mode containerd), and the
// directory that holds the guest's RAM (file_mem_backend) exists, whatever
// --kata-mem-mib says. Each of these today prints ok and exits 0, and every
// step then fails at start (Driver.Prepare, or QEMU at boot).
func TestConfigCheckKataNode(t *testing.T) {
	dir := t.TempDir()
	agent := write(t, dir, "agent", "not a real agent: config check only looks for the file")
	good := write(t, dir, "good-configuration.toml", `[hypervisor.qemu]
enable_annotations = ["default_vcpus", "default_memory"]
shared_fs = "virtio-fs"
[runtime]
sandbox_cgroup_only = true
`)
	noBackend := write(t, dir, "nobackend-configuration.toml", `[hypervisor.qemu]
enable_annotations = ["default_vcpus", "default_memory"]
file_mem_backend = "/nonexistent/kata-ram"
[runtime]
sandbox_cgroup_only = true
`)
	microvm := func(name, kata string) string {
		return write(t, dir, name, fmt.Sprintf(`runtime = "kata"
runtime_dir = %q
cache_dir = %q
[qemu]
agent = %q
[kata]
allow_root_virtiofsd = true
%s
`, filepath.Join(dir, "run"), filepath.Join(dir, "cache"), agent, kata))
	}
	tests := []struct {
		name string
		conf string
		says []string
	}{
		{"shim not installed", microvm("noshim.toml", fmt.Sprintf("shim = \"/nonexistent/containerd-shim-kata-v2\"\nconfiguration = %q", good)),
			[]string{"kata.shim", "/nonexistent/containerd-shim-kata-v2"}},
		{"containerd socket missing", microvm("noctrd.toml", fmt.Sprintf("mode = \"containerd\"\ncontainerd_address = \"/nonexistent/containerd.sock\"\nconfiguration = %q", good)),
			[]string{"kata.containerd_address", "/nonexistent/containerd.sock"}},
		{"file_mem_backend missing", microvm("nobackend.toml", fmt.Sprintf("shim = \"/usr/bin/containerd-shim-runc-v2\"\nconfiguration = %q", noBackend)),
			[]string{"file_mem_backend", "/nonexistent/kata-ram"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := runApp(t, "--config", tt.conf, "config", "check")
			if code != 1 {
				t.Errorf("config check: exit %d, want 1\n%s", code, out)
			}
			for _, s := range tt.says {
				if !strings.Contains(out, s) {
					t.Errorf("output does not name %q:\n%s", s, out)
				}
			}
		})
	}
}
