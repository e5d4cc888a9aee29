package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/placement"
)

// Thread is one thread of the VMM, as /proc/<pid>/task/<tid>/comm names it.
type Thread struct {
	TID  int
	Name string
	// VCPU is the index of the vCPU the thread runs, -1 for the VMM's
	// other threads; AllVCPUs: the one thread of single-threaded TCG,
	// which runs every vCPU.
	VCPU     int
	AllVCPUs bool
}

// Threads lists the threads of VMM pid, vCPUs by the names QEMU gives them
// under -name debug-threads=on: "CPU <n>/KVM", "CPU <n>/TCG", and
// "ALL CPUs/TCG" for single-threaded TCG (QEMU's cpus accelerators,
// accel/*/ *-accel-ops.c). Ordered by thread id. Errors: the VMM is gone.
func Threads(pid int) ([]Thread, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list the VMM's threads: %w", err)
	}
	var out []Thread
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("%s/%d/comm", dir, tid))
		if err != nil {
			continue // the thread ended since the listing
		}
		out = append(out, threadNamed(tid, strings.TrimSpace(string(b))))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TID < out[j].TID })
	return out, nil
}

func threadNamed(tid int, name string) Thread {
	t := Thread{TID: tid, Name: name, VCPU: -1}
	if strings.HasPrefix(name, "ALL CPUs/") {
		t.AllVCPUs = true
		return t
	}
	rest, ok := strings.CutPrefix(name, "CPU ")
	if !ok {
		return t
	}
	n, accel, ok := strings.Cut(rest, "/")
	if i, err := strconv.Atoi(n); ok && err == nil && i >= 0 && accel != "" {
		t.VCPU = i
	}
	return t
}

// Pinning is what pinVCPUs did.
type Pinning struct {
	// VCPUs maps each vCPU index to the thread id and the host CPU it
	// was pinned to.
	VCPUs []PinnedVCPU
	// Others are the VMM's other threads, pinned to all host CPUs.
	Others []int
	// Found is how long the vCPU threads took to appear, from the call
	// (right after the VMM started); Took, to the last pin.
	Found, Took time.Duration
}

// PinnedVCPU is one vCPU thread and the host CPU it runs on.
type PinnedVCPU struct{ VCPU, TID, CPU int }

// String is "vcpu0=cpu0 vcpu1=cpu1", for the log.
func (p Pinning) String() string {
	var parts []string
	for _, v := range p.VCPUs {
		parts = append(parts, fmt.Sprintf("vcpu%d=cpu%d", v.VCPU, v.CPU))
	}
	return strings.Join(parts, " ")
}

// pinPoll is how often pinVCPUs looks for the vCPU threads: QEMU creates
// them all during machine set-up, before it loads the kernel.
const pinPoll = time.Millisecond

// pinVCPUs waits for the vcpus vCPU threads of VMM pid (Threads) and pins
// vCPU i to host CPU placement.VCPUs(vcpus, hostCPUs)[i], and every other
// thread of the VMM to all of hostCPUs (threads QEMU starts later inherit
// it from its main loop; QEMU's thread pool spawns its workers from there
// so that they do not take a vCPU's affinity, util/thread-pool.c). The
// one thread of single-threaded TCG gets all of hostCPUs. It returns when
// all are pinned, or with an error once ctx ends, exited closes (the VMM
// is gone) or a thread cannot be pinned; what was pinned by then stays.
// The affinity calls are made as uid, the VMM's (asUID), so a thread id
// that is no longer the VMM's is refused by the kernel.
func pinVCPUs(ctx context.Context, pid, vcpus int, hostCPUs []int, uid uint32, exited <-chan struct{}) (Pinning, error) {
	t0 := time.Now()
	cpus := placement.CPUSet(hostCPUs)
	want := placement.VCPUs(vcpus, cpus)
	if len(want) == 0 {
		return Pinning{}, errors.New("no host CPUs to pin to")
	}
	for {
		threads, err := Threads(pid)
		if err != nil {
			return Pinning{}, err
		}
		if found(threads, vcpus) {
			break
		}
		select {
		case <-ctx.Done():
			return Pinning{}, fmt.Errorf("find the VMM's %d vCPU threads: %w (threads: %s)", vcpus, context.Cause(ctx), names(threads))
		case <-exited:
			return Pinning{}, errors.New("the VMM exited before its vCPU threads were pinned")
		case <-time.After(pinPoll):
		}
	}
	found := time.Since(t0)
	var all unix.CPUSet
	for _, c := range cpus {
		all.Set(c)
	}
	p := Pinning{Found: found}
	err := asUID(uid, func() error {
		// The main thread first: a thread it starts meanwhile inherits
		// the allocation; then every thread there is by now.
		if err := unix.SchedSetaffinity(pid, &all); err != nil {
			return fmt.Errorf("pin the VMM's main thread %d to CPUs %s: %w", pid, cpus, err)
		}
		threads, err := Threads(pid)
		if err != nil {
			return err
		}
		for _, t := range threads {
			set := all
			if t.VCPU >= 0 && t.VCPU < vcpus {
				set.Zero()
				set.Set(want[t.VCPU])
			}
			if err := unix.SchedSetaffinity(t.TID, &set); err != nil {
				return fmt.Errorf("pin VMM thread %d (%q) to CPUs %s: %w", t.TID, t.Name, affinityList(&set), err)
			}
			if t.VCPU >= 0 && t.VCPU < vcpus {
				p.VCPUs = append(p.VCPUs, PinnedVCPU{VCPU: t.VCPU, TID: t.TID, CPU: want[t.VCPU]})
			} else {
				p.Others = append(p.Others, t.TID)
			}
		}
		return nil
	})
	if err != nil {
		return p, err
	}
	sort.Slice(p.VCPUs, func(i, j int) bool { return p.VCPUs[i].VCPU < p.VCPUs[j].VCPU })
	p.Took = time.Since(t0)
	return p, nil
}

// asUID runs f on a locked OS thread whose effective uid alone is uid
// (setresuid(2) as a raw system call changes the calling thread only; Go's
// syscall.Setresuid would change every thread). A non-zero effective uid
// drops the thread's effective capabilities, CAP_SYS_NICE among them, so
// sched_setaffinity(2) then acts only on the threads of uid's processes
// (the kernel's check, sched_setaffinity(2)): a VMM thread that exited and
// whose id the kernel gave to another user's thread, between the listing
// and the call, is refused rather than pinned. uid 0 (a VMM run as root),
// or a caller that is not root, runs f as it is. The thread becomes root
// again before it is unlocked; if that fails it stays locked and ends with
// its goroutine.
func asUID(uid uint32, f func() error) error {
	if uid == 0 || os.Geteuid() != 0 {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		const keep = ^uintptr(0) // -1: leave that id as it is
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(uid), keep); e != 0 {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("act as uid %d: %w", uid, e)
			return
		}
		err := f()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, 0, keep); e != 0 {
			errc <- errors.Join(err, fmt.Errorf("act as root again: %w", e))
			return // locked: the thread ends with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// found says whether threads hold every vCPU of vcpus (or the one
// single-threaded TCG thread).
func found(threads []Thread, vcpus int) bool {
	seen := map[int]bool{}
	for _, t := range threads {
		if t.AllVCPUs {
			return true
		}
		if t.VCPU >= 0 && t.VCPU < vcpus {
			seen[t.VCPU] = true
		}
	}
	return len(seen) == vcpus
}

func names(threads []Thread) string {
	var n []string
	for _, t := range threads {
		n = append(n, strconv.Quote(t.Name))
	}
	return strings.Join(n, " ")
}

func affinityList(s *unix.CPUSet) string {
	var c placement.CPUSet
	for i := 0; i < len(s)*64; i++ {
		if s.IsSet(i) {
			c = append(c, i)
		}
	}
	return c.String()
}

// pinTimeout bounds the wait for the vCPU threads (they appear within
// milliseconds of the VMM's start).
const pinTimeout = 10 * time.Second

// pin applies the sandbox's placement (SandboxConfig.HostCPUs) to its VMM
// with pinVCPUs and logs the mapping. A failure is logged, not returned:
// pinning is performance, and the VMM stays within the step's cpuset,
// which is the boundary, whether or not its threads were pinned.
func (s *sandbox) pin(ctx context.Context) {
	if len(s.cfg.HostCPUs) == 0 {
		return
	}
	if s.d.o.Accel != "kvm" && !s.d.o.PinTCG {
		s.log.Info("vCPUs not pinned: under TCG they run anywhere in the step's CPUs", "accel", s.d.o.Accel)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, pinTimeout)
	defer cancel()
	host := placement.CPUSet(s.cfg.HostCPUs).String()
	p, err := pinVCPUs(ctx, s.Pid(), s.cfg.CPUs, s.cfg.HostCPUs, s.vmmUID, s.done)
	if err != nil {
		s.log.Warn("vCPUs not pinned: the VMM runs anywhere in the step's CPUs", "host_cpus", host, "err", err)
		return
	}
	s.log.Info("vCPUs pinned", "mapping", p.String(), "host_cpus", host, "other_threads", len(p.Others), "found_us", p.Found.Microseconds(), "us", p.Took.Microseconds())
}
