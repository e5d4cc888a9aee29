package guest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// MountCgroup mounts the cgroup2 hierarchy at dir (created) and enables the
// memory controller for its children, so that each process the Service
// starts gets a cgroup of its own that counts its OOM kills
// (Options.Cgroup). The guest kernel needs CONFIG_MEMCG.
func MountCgroup(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if err := unix.Mount("cgroup2", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil && err != unix.EBUSY {
		return fmt.Errorf("mount cgroup2 on %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
		return fmt.Errorf("enable the memory controller in %s: %w", dir, err)
	}
	return nil
}

// oomProbe finds out whether the guest's OOM killer killed a process, or
// one it started, while it ran: by the oom_kill count of the process's own
// cgroup (memory.events, which counts every kill of a member, global OOM
// included, before the victim is signalled), or, without a cgroup, by
// /proc/vmstat's oom_kill counter rising while the process ran and the
// process dying by SIGKILL.
type oomProbe struct {
	dir    string   // the process's cgroup; "" without
	f      *os.File // dir, open for CLONE_INTO_CGROUP until the start
	vmstat uint64   // oom_kill of /proc/vmstat at the start
}

// cgroupSeq names the processes' cgroups.
var cgroupSeq atomic.Uint64

// newOOMProbe makes the cgroup of a process about to start under base
// ("" : the /proc/vmstat fallback). The Service makes it ahead of the
// start (spare), so the vmstat baseline of the fallback may be older than
// the start: kills in between count too, as kills of other processes
// while it runs do.
func newOOMProbe(base string) (*oomProbe, error) {
	p := &oomProbe{vmstat: vmstatOOMKills()}
	if base == "" {
		return p, nil
	}
	dir := filepath.Join(base, "task-"+strconv.FormatUint(cgroupSeq.Add(1), 10))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return p, fmt.Errorf("create the process's cgroup: %w", err)
	}
	f, err := os.Open(dir)
	if err != nil {
		_ = os.Remove(dir)
		return p, fmt.Errorf("open the process's cgroup: %w", err)
	}
	p.dir, p.f = dir, f
	return p, nil
}

// started closes the cgroup's descriptor once the process is in it.
func (p *oomProbe) started() {
	if p.f != nil {
		p.f.Close()
		p.f = nil
	}
}

// drop gives up the cgroup (the process did not start in it).
func (p *oomProbe) drop() {
	p.started()
	if p.dir != "" {
		_ = os.Remove(p.dir)
		p.dir = ""
	}
}

// killed reports, once the process ended with ws, whether the OOM killer
// killed it or one of its processes.
func (p *oomProbe) killed(ws unix.WaitStatus) bool {
	if p.dir != "" {
		if n, err := cgroupOOMKills(p.dir); err == nil {
			return n > 0
		}
	}
	return ws.Signaled() && ws.Signal() == unix.SIGKILL && vmstatOOMKills() > p.vmstat
}

// remove removes the process's cgroup once killed has read it, when it is
// empty (a background child may keep it; the guest is discarded anyway).
func (p *oomProbe) remove() {
	if p.dir != "" {
		_ = os.Remove(p.dir)
	}
}

// cgroupOOMKills is the oom_kill count of dir's memory.events.
func cgroupOOMKills(dir string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(dir, "memory.events"))
	if err != nil {
		return 0, err
	}
	if n, ok := counter(b, "oom_kill"); ok {
		return n, nil
	}
	return 0, errors.New("no oom_kill in memory.events")
}

// vmstatOOMKills is /proc/vmstat's oom_kill (0 when unreadable).
func vmstatOOMKills() uint64 {
	b, _ := os.ReadFile("/proc/vmstat")
	n, _ := counter(b, "oom_kill")
	return n
}

// counter finds "name N" among b's lines.
func counter(b []byte, name string) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte(" "))
		if ok && string(k) == name {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// makeSpare makes the next process's cgroup in the background, unless one
// is ready or being made: creating a memory cgroup is the costliest part
// of a start in a small guest (about 3 ms of 10 under TCG), and nothing of
// it depends on the request.
func (s *Service) makeSpare() {
	if s.opts.Cgroup == "" {
		return
	}
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if s.spare != nil || s.making || s.closed {
		return
	}
	s.making = true
	go func() {
		p, err := newOOMProbe(s.opts.Cgroup)
		s.spareMu.Lock()
		defer s.spareMu.Unlock()
		s.making = false
		if err != nil || s.closed {
			// A start that finds no spare makes its own and
			// reports what fails.
			p.drop()
			return
		}
		s.spare = p
	}()
}

// takeCgroup returns the spare cgroup (makeSpare), else makes one now.
func (s *Service) takeCgroup() (*oomProbe, error) {
	s.spareMu.Lock()
	p := s.spare
	s.spare = nil
	s.spareMu.Unlock()
	if p != nil {
		return p, nil
	}
	return newOOMProbe(s.opts.Cgroup)
}
