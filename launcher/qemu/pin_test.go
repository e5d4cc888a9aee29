package qemu

import "testing"

func TestThreadNamed(t *testing.T) {
	for _, tt := range []struct {
		name string
		vcpu int
		all  bool
	}{
		{"CPU 0/TCG", 0, false},
		{"CPU 12/KVM", 12, false},
		{"ALL CPUs/TCG", -1, true},
		{"qemu-system-x86", -1, false},
		{"worker", -1, false},
		{"CPU x/KVM", -1, false},
		{"CPU 3", -1, false},
		{"CPU 3/", -1, false},
	} {
		got := threadNamed(7, tt.name)
		if got.VCPU != tt.vcpu || got.AllVCPUs != tt.all || got.TID != 7 {
			t.Errorf("threadNamed(%q) = %+v, want vCPU %d, all %v", tt.name, got, tt.vcpu, tt.all)
		}
	}
	threads := []Thread{threadNamed(1, "qemu-system-x86"), threadNamed(2, "CPU 0/TCG"), threadNamed(3, "CPU 1/TCG")}
	if !found(threads, 2) || found(threads, 3) || found(threads[:2], 2) {
		t.Errorf("found: wrong count of vCPU threads in %+v", threads)
	}
	if !found([]Thread{threadNamed(1, "ALL CPUs/TCG")}, 4) {
		t.Error("found: single-threaded TCG's one thread runs every vCPU")
	}
}
