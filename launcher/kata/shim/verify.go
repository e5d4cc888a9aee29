package shim

import (
	"context"
	"fmt"
	"os"
)

// verify checks that the shim behind the socket is the one Start just
// started, records its pid and start time, and starts reaping it.
//
// A shim whose socket name (a hash of address, namespace and id) is taken
// by a live shim prints that shim's address and exits: a reused triple
// silently connects to the first sandbox. Three checks refuse it: the
// serving shim must be this process's child (a daemonized shim is
// reparented to its starter's subreaper, which another launcher's is not),
// its working directory must be Bundle (the start helper runs there and
// its daemon inherits it), and it must have started after since (clock
// ticks after boot, taken before the start helper ran). State of the id
// then must answer NotFound: a fresh shim has no container yet.
func (s *Shim) verify(ctx context.Context, since uint64) error {
	r, err := s.client.connect(ctx)
	if err != nil {
		return err
	}
	pid := int(r.GetShimPid())
	st, err := readProcStat(pid)
	if err != nil {
		return fmt.Errorf("shim %s answers with pid %d: %w", s.rec.ID, pid, err)
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return fmt.Errorf("read the working directory of shim pid %d: %w", pid, err)
	}
	other := ""
	switch {
	case st.PPid != os.Getpid():
		other = fmt.Sprintf("its parent is %d, not this process (%d)", st.PPid, os.Getpid())
	case cwd != s.rec.Bundle:
		other = fmt.Sprintf("it runs in %s, not in the bundle %s", cwd, s.rec.Bundle)
	case st.StartTime < since:
		other = fmt.Sprintf("it started at tick %d, before this Start (tick %d)", st.StartTime, since)
	}
	if other != "" {
		return fmt.Errorf("shim %s at %s is pid %d, and %s: it is a shim started before, for another sandbox (the address %s must be unique per sandbox: give each step its own state directory)",
			s.rec.ID, s.rec.Socket, pid, other, s.rec.Address)
	}
	// The shim is this process's child: its pid cannot be reused before
	// this process reaps it, so the pidfd names it.
	proc, err := os.FindProcess(pid)
	if err != nil {
		return fmt.Errorf("find shim pid %d: %w", pid, err)
	}
	s.rec.Pid, s.rec.StartTime = pid, st.StartTime
	go func() {
		ps, err := proc.Wait()
		if err != nil {
			s.log.Warn("reap the shim", "pid", pid, "err", err)
		} else {
			s.log.Debug("shim exited", "pid", pid, "status", ps.String())
		}
		close(s.exited)
	}()
	if _, err := s.client.state(ctx, ""); err == nil {
		return fmt.Errorf("shim %s at %s already has a container %s before Create: it is another sandbox's shim (the address %s must be unique per sandbox)", s.rec.ID, s.rec.Socket, s.rec.ID, s.rec.Address)
	} else if !notFound(err) {
		return err
	}
	return nil
}
