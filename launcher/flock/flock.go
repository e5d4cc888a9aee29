// Package flock takes the exclusive flock(2) locks that guard the
// launcher's caches (guest assets, GPU driver sets) while one process
// builds an entry. A lock dies with its process, so a crashed builder
// never leaves it held; lock files are never removed (removing one while
// another process waits on it would let two builders in).
package flock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Exclusive takes an exclusive flock on p (created 0600 if missing, made
// 0600 if not),
// polling from 1 ms up to every 100 ms until ctx is done; release
// closes the file, which drops the lock. Errors name p; a wait cut short
// wraps ctx's error and says what was waited for.
func Exclusive(ctx context.Context, p, waitingFor string) (release func(), err error) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", p, err)
	}
	// Only the owner may open it: flock needs no more than an open file,
	// so a lock file others can read lets them hold it and stall every
	// build (files of older versions were 0644).
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", p, err)
	}
	if err := Wait(ctx, f, unix.LOCK_EX); err != nil {
		f.Close()
		if errors.Is(err, ctx.Err()) {
			return nil, fmt.Errorf("lock %s: waiting for %s: %w", p, waitingFor, err)
		}
		return nil, fmt.Errorf("lock %s: %w", p, err)
	}
	return func() { f.Close() }, nil
}

// Wait takes the flock(2) lock how (unix.LOCK_EX or unix.LOCK_SH) on the
// open file f, polling from 1 ms up to every 100 ms until ctx is done (a
// blocking flock could not be cut short). Errors: ctx's error as it is
// (errors.Is(err, ctx.Err())), or flock's; the file stays open either way.
func Wait(ctx context.Context, f *os.File, how int) error {
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}
