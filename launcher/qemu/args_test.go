package qemu

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

func TestArgs(t *testing.T) {
	mac := [6]byte{0x52, 0x54, 0, 10, 99, 2}
	base := VMConfig{
		Name: "slurm-microvm-1.0.0", Accel: "tcg", CPUs: 2, MemoryMiB: 512,
		Kernel: "/c/vmlinux", Initrd: "/c/initrd.img", Cmdline: []string{"console=ttyS0", "quiet"},
		RootDisk: "/var/cache/a,readonly=off/img.erofs", ConsoleLog: "/run/s/console.log", AgentFD: 3,
	}
	tests := []struct {
		name    string
		mod     func(*VMConfig)
		want    []string // substrings of the joined command line
		notWant []string
		wantErr string
	}{
		{name: "microvm under TCG", want: []string{
			"-M microvm,x-option-roms=off,isa-serial=on,rtc=on", "-accel tcg", "-cpu max", "-smp 2", "-m 512M",
			"-append console=ttyS0 quiet", "-device virtio-blk-device,drive=root", "-device virtio-serial-device,max_ports=2",
			"-chardev socket,id=agent,fd=3", "-no-reboot",
		}, notWant: []string{"-runas", "-sandbox"}},
		{name: "a comma in a path cannot add an option", want: []string{"file=/var/cache/a,,readonly=off/img.erofs"}},
		{name: "seccomp, and never -runas", mod: func(c *VMConfig) { c.Seccomp = true },
			want: []string{"-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"}, notWant: []string{"-runas"}},
		{name: "fd sets", mod: func(c *VMConfig) { c.FDSets = []FDSet{{FD: 6, Set: 1}}; c.RootDisk = FDSetPath(1) },
			want: []string{"-add-fd fd=6,set=1", "file=/dev/fdset/1"}},
		{name: "KVM", mod: func(c *VMConfig) { c.Accel = "kvm" }, want: []string{"-accel kvm", "-cpu host"}},
		{name: "PCI machine for VFIO", mod: func(c *VMConfig) {
			c.Accel, c.PCI, c.MachineArgs = "kvm", true, []string{"-M", "q35,memory-backend=gpu-ram"}
		}, want: []string{"-M q35,memory-backend=gpu-ram", "-cpu host,host-phys-bits=on", "virtio-blk-pci,drive=root", "virtio-serial-pci"},
			notWant: []string{"-M microvm"}},
		{name: "vCPU threads named", want: []string{"-name guest=slurm-microvm-1.0.0,debug-threads=on"}},
		{name: "a comma in the name", mod: func(c *VMConfig) { c.Name = "a,debug-threads=off" }, want: []string{"-name guest=a,,debug-threads=off,debug-threads=on"}},
		{name: "memory on a NUMA node", mod: func(c *VMConfig) { c.MemoryNodes = []int{1} }, want: []string{
			"-M microvm,x-option-roms=off,isa-serial=on,rtc=on,memory-backend=ram -object memory-backend-ram,id=ram,size=512M,host-nodes=1,policy=bind", "-m 512M",
		}},
		{name: "memory on two NUMA nodes", mod: func(c *VMConfig) { c.MemoryNodes = []int{0, 2} }, want: []string{"host-nodes=0,host-nodes=2,policy=bind"}},
		{name: "no NUMA binding by default", notWant: []string{"memory-backend", "host-nodes"}},
		{name: "PCI needs KVM", mod: func(c *VMConfig) { c.PCI = true }, wantErr: "needs KVM"},
		{name: "newline in a path", mod: func(c *VMConfig) { c.RootDisk = "/a\nb" }, wantErr: "newline"},
		{name: "space in a kernel word", mod: func(c *VMConfig) { c.Cmdline = []string{"a b"} }, wantErr: "whitespace"},
		{name: "no memory", mod: func(c *VMConfig) { c.MemoryMiB = 32 }, wantErr: "64"},
		{name: "no vCPU", mod: func(c *VMConfig) { c.CPUs = 0 }, wantErr: "vCPUs"},
		{name: "tap on microvm", mod: func(c *VMConfig) { c.Net = &NetDevice{TapFD: 8, MAC: mac} },
			want:    []string{"-netdev tap,id=net0,fd=8,vhost=off", "-device virtio-net-device,netdev=net0,mac=52:54:00:0a:63:02"},
			notWant: []string{"vhostfd", "script", "virtio-net-pci"}},
		{name: "tap with vhost-net", mod: func(c *VMConfig) { c.Accel = "kvm"; c.Net = &NetDevice{TapFD: 8, VhostFD: 9, MAC: mac} },
			want: []string{"-netdev tap,id=net0,fd=8,vhost=on,vhostfd=9"}},
		{name: "tap on q35", mod: func(c *VMConfig) {
			c.Accel, c.PCI, c.MachineArgs = "kvm", true, []string{"-M", "q35"}
			c.Net = &NetDevice{TapFD: 8, MAC: mac}
		}, want: []string{"-device virtio-net-pci,netdev=net0,mac=52:54:00:0a:63:02,romfile="}, notWant: []string{"virtio-net-device"}},
		{name: "user mode", mod: func(c *VMConfig) { c.Net = &NetDevice{User: true, MAC: mac} },
			want:    []string{"-netdev user,id=net0,ipv6=off,restrict=off", "-device virtio-net-device,netdev=net0,mac=52:54:00:0a:63:02"},
			notWant: []string{"hostfwd", "smb", "tftp", "tap,"}},
		{name: "network before the sandbox option", mod: func(c *VMConfig) { c.Seccomp = true; c.Net = &NetDevice{User: true, MAC: mac} },
			want: []string{"mac=52:54:00:0a:63:02 -sandbox on"}},
		{name: "no tap and no user", mod: func(c *VMConfig) { c.Net = &NetDevice{MAC: mac} }, wantErr: "neither a tap fd"},
		{name: "tap and user", mod: func(c *VMConfig) { c.Net = &NetDevice{TapFD: 8, User: true, MAC: mac} }, wantErr: "both a tap and user mode"},
		{name: "multicast MAC", mod: func(c *VMConfig) { c.Net = &NetDevice{User: true, MAC: [6]byte{1, 2, 3, 4, 5, 6}} }, wantErr: "01:02:03:04:05:06 is not a unicast"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			if tt.mod != nil {
				tt.mod(&c)
			}
			args, err := Args(c)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			line := strings.Join(args, " ")
			for _, w := range tt.want {
				if !strings.Contains(line, w) {
					t.Errorf("command line lacks %q:\n%s", w, line)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(line, w) {
					t.Errorf("command line has %q:\n%s", w, line)
				}
			}
		})
	}
}

// TestMachineArgsHostNodes: the q35 machine's own backend carries the
// NUMA binding (GPU steps).
func TestMachineArgsHostNodes(t *testing.T) {
	got, err := MachineArgs(Memory{MiB: 1024, PreallocThreads: 2, HostNodes: []int{1}}, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	want := "memory-backend-ram,id=gpu-ram,size=1024M,prealloc=on,prealloc-threads=2,host-nodes=1,policy=bind"
	if got[3] != want {
		t.Errorf("memory backend %q, want %q", got[3], want)
	}
	got, _ = MachineArgs(Memory{MiB: 1024}, 1<<30)
	if strings.Contains(strings.Join(got, " "), "host-nodes") {
		t.Errorf("no HostNodes, yet bound: %v", got)
	}
}

// TestMachineArgsHugePages: huge pages come from a memfd of the VMM's own
// (no shared hugetlbfs mount), in whole pages; QEMU 7.2 takes the backend.
func TestMachineArgsHugePages(t *testing.T) {
	got, err := MachineArgs(Memory{MiB: 4096, PreallocThreads: 4, HugePageMiB: 1024}, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	want := "memory-backend-memfd,id=gpu-ram,size=4096M,hugetlb=on,hugetlbsize=1024M,prealloc=on,prealloc-threads=4"
	if got[3] != want {
		t.Errorf("memory backend %q, want %q", got[3], want)
	}
	if strings.Contains(strings.Join(got, " "), "mem-path") {
		t.Errorf("a path-backed backend: %v", got)
	}
	if _, err := MachineArgs(Memory{MiB: 1536, HugePageMiB: 1024}, 1<<30); err == nil {
		t.Error("1536 MiB in 1 GiB pages accepted")
	}
	// This QEMU's backend has the properties (their help; a real start
	// would need pages in the host's pool).
	out, err := exec.Command("qemu-system-x86_64", "-object", "memory-backend-memfd,help").CombinedOutput()
	if err != nil {
		prereq.Missing(t, "qemu-system-x86_64: %v (apt-get install qemu-system-x86)", err)
	}
	for _, p := range []string{"hugetlb", "hugetlbsize", "prealloc-threads"} {
		if !strings.Contains(string(out), p) {
			t.Errorf("this QEMU's memory-backend-memfd has no %q:\n%s", p, out)
		}
	}
}

func TestWholePages(t *testing.T) {
	for _, c := range []struct {
		mib, page, want uint64
		ok              bool
	}{{1536, 1024, 1024, true}, {4096, 1024, 4096, true}, {1001, 2, 1000, true}, {700, 0, 700, true}, {512, 1024, 0, false}} {
		got, err := WholePages(c.mib, c.page)
		if got != c.want || (err == nil) != c.ok {
			t.Errorf("WholePages(%d, %d) = %d, %v", c.mib, c.page, got, err)
		}
	}
}
