package state

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// StoppedDir is the directory under the runtime root that holds one stop
// record per stopped step (an empty file named like the step's directory).
// It outlives the step's directory, which stop removes, so that a prepare
// or a supervisor that comes late still finds that the step was stopped.
const StoppedDir = "stopped"

// LockFile is the step's lock (flock(2), exclusive): the supervisor records
// itself under it, and stop marks the step under it.
const LockFile = "lock"

// StopRecordTTL is how long stop records are kept; stop and gc remove
// older ones. A prepare or supervisor start of a step comes seconds after
// the step began, never a day later.
const StopRecordTTL = 24 * time.Hour

// ErrStopped is returned when a step was stopped before what was asked
// (record the supervisor, prepare, a start phase) could begin.
var ErrStopped = errors.New("the step was stopped")

func (d Dir) stopRecord() string { return filepath.Join(d.Root, StoppedDir, d.ID.String()) }

// lock takes the step's lock; unlock releases it. A missing step
// directory is ErrStopped (stop removes it; prepare creates it first).
func (d Dir) lock() (unlock func(), err error) {
	f, err := OpenFile(d.File(LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("step %s: %w (its state is gone)", d.ID, ErrStopped)
	}
	if err != nil {
		return nil, fmt.Errorf("lock step %s: %w", d.ID, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock step %s: %w", d.ID, err)
	}
	return func() { f.Close() }, nil
}

// Stopped reports whether a stop of the step has begun: its stop record or
// stop marker exists, or its state directory is gone.
func (d Dir) Stopped() bool {
	if _, err := os.Lstat(d.stopRecord()); err == nil {
		return true
	}
	if _, err := os.Lstat(d.File(StopFile)); err == nil {
		return true
	}
	_, err := os.Lstat(d.Path())
	return errors.Is(err, fs.ErrNotExist)
}

// MarkStopped is the first thing a stop does: it writes the step's stop
// record, then, if the step directory exists, the stop marker under the
// step's lock. Every later RecordSupervisor and CheckNotStopped of the
// step fails with ErrStopped, and a supervisor that recorded itself before
// is in the record by the time MarkStopped returns (it records under the
// same lock), so the caller reads it afterwards and signals it. Only root
// (the runtime root's owner) writes here.
func (d Dir) MarkStopped() error {
	if err := MakeDir(filepath.Join(d.Root, StoppedDir), 0o700); err != nil {
		return fmt.Errorf("record stop of step %s: %w", d.ID, err)
	}
	f, err := OpenFile(d.stopRecord(), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("record stop of step %s: %w", d.ID, err)
	}
	f.Close()
	unlock, err := d.lock()
	if errors.Is(err, ErrStopped) {
		return nil // no state: nothing can be recorded there any more
	}
	if err != nil {
		return err
	}
	defer unlock()
	if err := WriteFileAtomic(d.File(StopFile), nil, 0o644); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("mark stop of step %s: %w", d.ID, err)
	}
	return nil
}

// RecordSupervisor records the live process pid as the step's supervisor
// (SupervisorFile) under the step's lock, unless the step was stopped
// (ErrStopped): the record and a stop's mark are ordered, so stop either
// finds the record or the supervisor finds the mark.
func (d Dir) RecordSupervisor(pid int) error {
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if d.Stopped() {
		return fmt.Errorf("step %s: %w before its supervisor started", d.ID, ErrStopped)
	}
	return WriteProc(d.File(SupervisorFile), pid)
}

// CheckNotStopped returns ErrStopped (wrapped, naming what) once a stop of
// the step has begun. The supervisor calls it before each phase that
// leaves something on the host (scratch, image conversion, GPU binding,
// the VMM), under the step's lock so that it never overlaps a stop's mark.
func (d Dir) CheckNotStopped(what string) error {
	unlock, err := d.lock()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer unlock()
	if d.Stopped() {
		return fmt.Errorf("%s: step %s: %w", what, d.ID, ErrStopped)
	}
	return nil
}

// CheckPrepare fails with ErrStopped when the step was already stopped: a
// prepare must not recreate the state of a stopped step.
func (d Dir) CheckPrepare() error {
	if _, err := os.Lstat(d.stopRecord()); err == nil {
		return fmt.Errorf("prepare step %s: %w already", d.ID, ErrStopped)
	}
	return nil
}

// PruneStopRecords removes the stop records of job on node (all of them;
// job 0: none) and every record older than StopRecordTTL. Another node's
// records (multiple-slurmd) are left to that node's epilog.
func PruneStopRecords(root string, job uint32, node string, now time.Time) error {
	dir := filepath.Join(root, StoppedDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("prune stop records: %w", err)
	}
	var errs []error
	for _, e := range ents {
		old := false
		if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > StopRecordTTL {
			old = true
		}
		if old || (job != 0 && OfJobOnNode(e.Name(), job, node)) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
