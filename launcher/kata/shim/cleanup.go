package shim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/emptypb"
)

// cleanupStepWait bounds each step of Cleanup that waits on the shim (an
// RPC, the shim's delete, the shim's exit).
const cleanupStepWait = 10 * time.Second

// Cleanup removes the shim r records and its sandbox container, from any
// process (stop, gc, or Start's own failure path), whether the shim is
// alive, hung or gone:
//
//  1. When r.Socket answers and is served by the recorded shim (same pid
//     and start time): Kill all processes (SIGKILL), Wait, Delete the
//     container, Shutdown the shim.
//  2. In any case, `<binary> -namespace NS -address A -id ID -bundle B
//     delete` in the bundle (when it still exists): the shim's own cleanup
//     of a container whose shim died (for the runc shim: runc delete
//     --force under /run/containerd/runc/<namespace>, unmount the rootfs).
//  3. SIGKILL the recorded shim pid if it is still that process (start
//     time; through a pidfd, so a reused pid is never signalled) and wait
//     for it to end.
//  4. Remove the shim's socket (and its debug socket), the events socket
//     and <bundle>/log.
//
// It is idempotent: on a removed shim it does nothing and returns nil. It
// returns the errors of steps 2 to 4, joined: step 2's only when step 1
// did not delete the container and the shim's delete did not fail for
// lack of state ("no such file or directory": no container was created,
// e.g. a crash between Start and Create). log (nil: discarded) gets what
// was done.
func Cleanup(ctx context.Context, r Record, log *slog.Logger) error {
	log = orDiscard(log).With("shim", r.ID, "pid", r.Pid)
	var errs []error
	begin, err := bootTicks()
	if err != nil {
		return err
	}
	live := cleanupLive(ctx, r, log)

	// While the shim's delete runs, reap the sandbox's processes that a
	// dead shim left to this process (see reapAdopted).
	stopReap := make(chan struct{})
	reaped := make(chan int)
	go func() {
		n := 0
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			n += reapAdopted(r.StartTime, begin)
			select {
			case <-stopReap:
				reaped <- n + reapAdopted(r.StartTime, begin)
				return
			case <-t.C:
			}
		}
	}()
	defer func() {
		close(stopReap)
		if n := <-reaped; n > 0 {
			log.Info("reaped processes the dead shim left", "count", n)
		}
	}()

	if fi, err := os.Stat(r.Bundle); err == nil && fi.IsDir() && r.Binary != "" {
		dctx, cancel := context.WithTimeout(ctx, cleanupStepWait)
		_, err := runShim(dctx, r, "delete", false, nil, nil)
		cancel()
		switch {
		case err == nil:
			log.Debug("shim delete done")
		case live:
			log.Debug("shim delete after the container was deleted", "err", err)
		case strings.Contains(err.Error(), "no such file or directory"):
			// The shim keeps no state of a container of the id (never
			// created, or already cleaned up): nothing to delete.
			log.Debug("shim delete: no container state", "err", err)
		default:
			errs = append(errs, fmt.Errorf("clean up the container %s of a shim that is gone: %w", r.ID, err))
		}
	}

	fd, err := sameProcess(r.Pid, r.StartTime)
	if err != nil {
		errs = append(errs, err)
	} else if fd >= 0 {
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("kill shim pid %d: %w", r.Pid, err))
		} else if !waitPidfd(fd, cleanupStepWait) {
			errs = append(errs, fmt.Errorf("shim pid %d still runs %v after SIGKILL", r.Pid, cleanupStepWait))
		} else {
			log.Info("killed the shim")
		}
		unix.Close(fd)
	}

	for _, p := range []string{r.Socket, r.DebugSocket, r.Events, filepath.Join(r.Bundle, "log")} {
		if p == "" || p == "log" {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s of shim %s: %w", p, r.ID, err))
		}
	}
	return errors.Join(errs...)
}

// cleanupLive is step 1 of Cleanup. It reports whether the recorded shim
// answered and deleted the container (or had none).
func cleanupLive(ctx context.Context, r Record, log *slog.Logger) bool {
	if r.Socket == "" || r.Pid == 0 {
		return false
	}
	fd, err := sameProcess(r.Pid, r.StartTime)
	if err != nil || fd < 0 {
		return false
	}
	unix.Close(fd)
	conn, err := net.DialTimeout("unix", r.Socket, 2*time.Second)
	if err != nil {
		log.Debug("the shim does not answer", "socket", r.Socket, "err", err)
		return false
	}
	tc := ttrpc.NewClient(conn)
	defer tc.Close()
	version := r.Version
	if version == 0 {
		version = 2
	}
	c := newClient(tc, version, r.ID)
	rpc := func(f func(ctx context.Context) error) error {
		cctx, cancel := context.WithTimeout(ctx, cleanupStepWait)
		defer cancel()
		return f(cctx)
	}
	var cr *task.ConnectResponse
	if err := rpc(func(ctx context.Context) (err error) { cr, err = c.connect(ctx); return err }); err != nil {
		log.Debug("the shim does not answer", "socket", r.Socket, "err", err)
		return false
	}
	if int(cr.GetShimPid()) != r.Pid {
		log.Warn("the shim socket is served by another process: not touching it", "socket", r.Socket, "served_by", cr.GetShimPid())
		return false
	}
	deleted := true
	err = rpc(func(ctx context.Context) error {
		return c.call(ctx, "Kill", &task.KillRequest{ID: r.ID, Signal: uint32(syscall.SIGKILL), All: true}, &emptypb.Empty{})
	})
	if err != nil && !notFound(err) {
		log.Debug("kill the container", "err", err)
	}
	if err == nil {
		_ = rpc(func(ctx context.Context) error {
			return c.call(ctx, "Wait", &task.WaitRequest{ID: r.ID}, &task.WaitResponse{})
		})
	}
	err = rpc(func(ctx context.Context) error {
		return c.call(ctx, "Delete", &task.DeleteRequest{ID: r.ID}, &task.DeleteResponse{})
	})
	if err != nil && !notFound(err) {
		log.Warn("delete the container through the shim", "err", err)
		deleted = false
	}
	err = rpc(func(ctx context.Context) error {
		return c.call(ctx, "Shutdown", &task.ShutdownRequest{ID: r.ID, Now: true}, &emptypb.Empty{})
	})
	if err != nil && !closedErr(err) {
		log.Debug("shut down the shim", "err", err)
	}
	if fd, err := sameProcess(r.Pid, r.StartTime); err == nil && fd >= 0 {
		waitPidfd(fd, 5*time.Second) // it exits after Shutdown; else step 3 kills it
		unix.Close(fd)
	}
	return deleted
}
