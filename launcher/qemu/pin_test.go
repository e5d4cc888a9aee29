package qemu

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

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

// TestAsUID: affinity calls made as the VMM's uid reach that uid's threads
// only (a reused thread id of another user's is refused by the kernel),
// and the supervisor is root again afterwards.
func TestAsUID(t *testing.T) {
	prereq.Root(t, "start processes as another uid")
	start := func(uid uint32) *exec.Cmd {
		cmd := exec.Command("sleep", "30")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	mine, other := start(65534), start(0)
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(mine.Process.Pid, &set); err != nil {
		t.Fatal(err)
	}
	pin := func(pid int) error {
		return asUID(65534, func() error { return unix.SchedSetaffinity(pid, &set) })
	}
	if err := pin(mine.Process.Pid); err != nil {
		t.Errorf("the VMM uid's own thread: %v", err)
	}
	if err := pin(other.Process.Pid); !errors.Is(err, unix.EPERM) {
		t.Errorf("another uid's thread: %v, want EPERM", err)
	}
	// Root again, on every thread: a root-only call from many goroutines.
	for range 8 {
		if err := unix.SchedSetaffinity(other.Process.Pid, &set); err != nil {
			t.Fatalf("after asUID, as root: %v", err)
		}
	}
	if os.Geteuid() != 0 {
		t.Fatal("the process is no longer root")
	}
}
