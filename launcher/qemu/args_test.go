package qemu

import (
	"strings"
	"testing"
)

func TestArgs(t *testing.T) {
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
		{name: "PCI needs KVM", mod: func(c *VMConfig) { c.PCI = true }, wantErr: "needs KVM"},
		{name: "newline in a path", mod: func(c *VMConfig) { c.RootDisk = "/a\nb" }, wantErr: "newline"},
		{name: "space in a kernel word", mod: func(c *VMConfig) { c.Cmdline = []string{"a b"} }, wantErr: "whitespace"},
		{name: "no memory", mod: func(c *VMConfig) { c.MemoryMiB = 32 }, wantErr: "64"},
		{name: "no vCPU", mod: func(c *VMConfig) { c.CPUs = 0 }, wantErr: "vCPUs"},
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
