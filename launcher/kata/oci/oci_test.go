package oci

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/kata/katacfg"
)

var update = flag.Bool("update", false, "rewrite the golden files testdata/*.json")

func plain() Input {
	return Input{
		RootfsPath:     "/run/slurm-microvm/12.0/rootfs",
		Hostname:       "node1",
		UID:            1000,
		GID:            1000,
		AdditionalGids: []uint32{100, 27},
		Init: Process{
			Args: []string{"/.smv/init", "--step", "12.0"},
			Env:  []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SLURM_JOB_ID=12"},
			Cwd:  "/home/alice",
		},
		CgroupsPath: "/slurm/uid_1000/job_12/step_0/smv-kata",
	}
}

func TestSpecGolden(t *testing.T) {
	shares := plain()
	shares.Mounts = []Mount{
		{Source: "/run/slurm-microvm/12.0/shares/2", Destination: "/home/alice/data/sub", ReadOnly: false},
		{Source: "/run/slurm-microvm/12.0/shares/0", Destination: "/home/alice", ReadOnly: false},
		{Source: "/run/slurm-microvm/12.0/shares/1", Destination: "/datasets", ReadOnly: true},
	}
	shares.NetNS = "/proc/4242/ns/net"

	gpu := plain()
	gpu.Devices = []Device{
		{Path: "/dev/vfio/vfio", Major: 10, Minor: 196},
		{Path: "/dev/vfio/17", Major: 243, Minor: 0},
		{Path: "/dev/vfio/42", Major: 243, Minor: 1},
	}
	kata, err := katacfg.Parse("configuration.toml", []byte("[hypervisor.qemu]\nenable_annotations = [\"default_vcpus\", \"default_memory\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	gpu.Annotations, err = katacfg.Annotations(kata, 16, 120000)
	if err != nil {
		t.Fatal(err)
	}
	gpu.Annotations["io.katacontainers.config.hypervisor.cold_plug_vfio"] = "root-port"

	for name, in := range map[string]Input{"plain": plain(), "shares": shares, "gpu": gpu} {
		t.Run(name, func(t *testing.T) {
			s, err := Spec(in)
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(s, "", "\t")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", name+".json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test -update writes it)", err)
			}
			if string(got) != string(want) {
				t.Errorf("spec differs from %s (go test -update rewrites it):\n%s", path, got)
			}
		})
	}
}

// TestSpecInvariants: what the goldens must keep, whatever else changes.
func TestSpecInvariants(t *testing.T) {
	in := plain()
	in.Mounts = []Mount{{Source: "/srv/share/3", Destination: "/ro", ReadOnly: true}, {Source: "/srv/share/4", Destination: "/rw"}}
	s, err := Spec(in)
	if err != nil {
		t.Fatal(err)
	}
	p := s.Process
	if p.User.UID != 1000 || p.User.GID != 1000 || !p.NoNewPrivileges || p.Rlimits != nil || p.Terminal {
		t.Errorf("process %+v: want the job's uid/gid, NoNewPrivileges, no rlimits, no terminal", p)
	}
	c := p.Capabilities
	if c == nil || len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable)+len(c.Ambient) != 0 {
		t.Errorf("capabilities %+v: want present and empty", c)
	}
	if s.Root.Readonly || s.Linux.Seccomp != nil || s.Linux.Resources == nil {
		t.Errorf("root %+v seccomp %v resources %v: want writable root, no seccomp, resources present", s.Root, s.Linux.Seccomp, s.Linux.Resources)
	}
	var netns int
	for _, n := range s.Linux.Namespaces {
		if n.Type == "network" {
			netns++
			if n.Path != "" {
				t.Errorf("network namespace path %q without NetNS", n.Path)
			}
		}
		if n.Type == "user" {
			t.Error("a user namespace")
		}
	}
	if netns != 1 {
		t.Errorf("%d network namespaces", netns)
	}
	opts := map[string]string{}
	for _, m := range s.Mounts {
		opts[m.Destination] = strings.Join(m.Options, ",")
	}
	if o := opts["/ro"]; !strings.Contains(o, "rbind") || !strings.Contains(o, "ro,") || !strings.Contains(o, "nosuid") || !strings.Contains(o, "nodev") {
		t.Errorf("read-only share options %q", o)
	}
	if o := opts["/rw"]; !strings.Contains(o, "rbind") || strings.Contains(o, "ro,") {
		t.Errorf("read-write share options %q", o)
	}
}

func TestSpecErrors(t *testing.T) {
	with := func(f func(*Input)) Input { in := plain(); f(&in); return in }
	share := func(dst string) func(*Input) {
		return func(in *Input) { in.Mounts = []Mount{{Source: "/srv/share/3", Destination: dst}} }
	}
	tests := []struct {
		name string
		in   Input
		says string
	}{
		{"relative rootfs", with(func(in *Input) { in.RootfsPath = "rootfs" }), `RootfsPath "rootfs"`},
		{"no rootfs", with(func(in *Input) { in.RootfsPath = "" }), "RootfsPath"},
		{"unclean rootfs", with(func(in *Input) { in.RootfsPath = "/run/x/../rootfs" }), "clean"},
		{"bad hostname", with(func(in *Input) { in.Hostname = "a b" }), `Hostname "a b"`},
		{"no program", with(func(in *Input) { in.Init.Args = nil }), "Init.Args"},
		{"relative cwd", with(func(in *Input) { in.Init.Cwd = "home" }), `Init.Cwd "home"`},
		{"env without =", with(func(in *Input) { in.Init.Env = []string{"PATH=/bin", "JUNK"} }), `Init.Env[1] "JUNK"`},
		{"env empty key", with(func(in *Input) { in.Init.Env = []string{"=x"} }), `Init.Env[0] "=x"`},
		{"share relative destination", with(share("data")), `Mounts[0].Destination "data"`},
		{"share unclean destination", with(share("/data/../etc")), `"/data/../etc"`},
		{"share at /", with(share("/")), "hide the root filesystem"},
		{"share in /proc", with(share("/proc/sys")), "inside /proc"},
		{"share on /sys", with(share("/sys")), "inside /sys"},
		{"share in /dev", with(share("/dev/shm")), "inside /dev"},
		{"share relative source", with(func(in *Input) { in.Mounts = []Mount{{Source: "fd/3", Destination: "/d"}} }), `Mounts[0].Source "fd/3"`},
		{"share source in /proc", with(func(in *Input) { in.Mounts = []Mount{{Source: "/proc/4242/fd/7", Destination: "/d"}} }), "caller's mount namespace"},
		{"share twice", with(func(in *Input) {
			in.Mounts = []Mount{{Source: "/srv/share/3", Destination: "/d"}, {Source: "/srv/share/4", Destination: "/d"}}
		}), `Mounts[1].Destination "/d" is also Mounts[0]'s`},
		{"relative cgroup", with(func(in *Input) { in.CgroupsPath = "slurm/step" }), `CgroupsPath "slurm/step"`},
		{"no cgroup", with(func(in *Input) { in.CgroupsPath = "" }), "CgroupsPath"},
		{"root cgroup", with(func(in *Input) { in.CgroupsPath = "/" }), "below the step's"},
		{"systemd cgroup", with(func(in *Input) { in.CgroupsPath = "/system.slice:smv:12" }), "systemd"},
		{"relative netns", with(func(in *Input) { in.NetNS = "ns/net" }), `NetNS "ns/net"`},
		{"not a VFIO device", with(func(in *Input) { in.Devices = []Device{{Path: "/dev/nvidia0", Major: 195}} }), `Devices[0].Path "/dev/nvidia0"`},
		{"VFIO group not a number", with(func(in *Input) { in.Devices = []Device{{Path: "/dev/vfio/x1", Major: 243}} }), "/dev/vfio/x1"},
		{"no device number", with(func(in *Input) { in.Devices = []Device{{Path: "/dev/vfio/3"}} }), "0:0 is not a device number"},
		{"device twice", with(func(in *Input) {
			in.Devices = []Device{{Path: "/dev/vfio/3", Major: 243}, {Path: "/dev/vfio/3", Major: 243}}
		}), "Devices[1] /dev/vfio/3 is given twice"},
		{"empty annotation key", with(func(in *Input) { in.Annotations = map[string]string{"": "x"} }), "empty key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Spec(tt.in)
			if err == nil {
				t.Fatalf("Spec = %+v, want an error saying %q", s, tt.says)
			}
			if !strings.Contains(err.Error(), tt.says) {
				t.Errorf("error %q does not say %q", err, tt.says)
			}
		})
	}
}
