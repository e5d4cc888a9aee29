package fs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// validStepName reports whether name is usable as the scratch directory's
// name: one path component of letters, digits, '.', '_' and '-', not "."
// or "..". The launcher uses "<job>.<step>.<restart>".
func validStepName(name string) bool {
	if name == "" || name == "." || name == ".." || len(name) > 200 {
		return false
	}
	for _, c := range name {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ScratchDir returns the step's scratch directory, <scratch_base>/<step>,
// or "" when scratch is off.
func (p Policy) ScratchDir(step string) (string, error) {
	if p.ScratchBase == "" {
		return "", nil
	}
	if !validStepName(step) {
		return "", fmt.Errorf("scratch directory: step name %q is not one plain path component", step)
	}
	return filepath.Join(p.ScratchBase, step), nil
}

// CheckScratchBase checks the rule CreateScratch enforces on base: the
// base, if it exists, is a real directory owned by root and writable by
// nobody else, and so is every existing parent (after resolving symlinks),
// sticky or not. In a base users can write (say /tmp itself) a user could
// plant a symlink for another step's name; under a parent users can write
// (/var/tmp, sticky or not) a user could create the base first and make
// every step of the node fail. `config check` and every step start run it.
//
// A launcher not running as root (a user's `slurm-microvm run`) can only
// make scratch for itself, so its base is its own: the base, if it exists,
// is a real directory owned by the effective uid and writable by nobody
// else, and its parent is a private directory of that uid (mode 0700 or
// narrower, not a symlink), such as the run's own state root; nothing
// above a private directory can be created or swapped in by another user.
func CheckScratchBase(base string) error {
	base = filepath.Clean(base)
	if euid := os.Geteuid(); euid != 0 {
		return checkOwnScratchBase(base, uint32(euid))
	}
	var st unix.Stat_t
	switch err := unix.Lstat(base, &st); {
	case err == nil:
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("scratch base %s is not a directory (mode %#o; a symlink is refused): use a directory of its own", base, st.Mode)
		}
		if st.Uid != 0 || st.Mode&0o022 != 0 {
			return fmt.Errorf("scratch base %s is owned by uid %d with mode %#o: it must be owned by root and writable only by root (chown root %s; chmod go-w %s)",
				base, st.Uid, st.Mode&0o7777, base, base)
		}
	case !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("scratch base %s: %w", base, err)
	}
	// The nearest existing parent and everything above it.
	p := filepath.Dir(base)
	for {
		if _, err := os.Lstat(p); err == nil || p == "/" {
			break
		}
		p = filepath.Dir(p)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return fmt.Errorf("scratch base %s: resolve %s: %w", base, p, err)
	}
	for q := real; ; q = filepath.Dir(q) {
		if err := unix.Stat(q, &st); err != nil {
			return fmt.Errorf("scratch base %s: %w", base, err)
		}
		if st.Uid != 0 || st.Mode&0o022 != 0 {
			return fmt.Errorf("scratch base %s: its parent %s is owned by uid %d with mode %#o, so another user could create or replace the base before the launcher does; put the base where only root can write every parent (default /var/lib/slurm-microvm/scratch)",
				base, q, st.Uid, st.Mode&0o7777)
		}
		if q == "/" {
			return nil
		}
	}
}

// checkOwnScratchBase is CheckScratchBase for a launcher running as uid
// (not root).
func checkOwnScratchBase(base string, uid uint32) error {
	var st unix.Stat_t
	switch err := unix.Lstat(base, &st); {
	case err == nil:
		if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != uid || st.Mode&0o022 != 0 {
			return fmt.Errorf("scratch base %s (uid %d, mode %#o): a launcher run as uid %d needs a directory of its own there, writable only by it", base, st.Uid, st.Mode&0o7777, uid)
		}
	case !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("scratch base %s: %w", base, err)
	}
	parent := filepath.Dir(base)
	if err := unix.Lstat(parent, &st); err != nil {
		return fmt.Errorf("scratch base %s: its parent: %w", base, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != uid || st.Mode&0o077 != 0 {
		return fmt.Errorf("scratch base %s: its parent %s (uid %d, mode %#o) is not a private directory of uid %d: a launcher not run as root keeps scratch only below its own 0700 directory (slurm-microvm run does so itself)", base, parent, st.Uid, st.Mode&0o7777, uid)
	}
	return nil
}

// CreateScratch creates the step's scratch directory (mode 0700, owned by
// u's uid and gid) and returns its path; "" when scratch is off. The base
// directory is created root-owned 0755 when missing and must pass
// CheckScratchBase. The step's directory is made with mkdirat and chowned
// with fchownat(AT_SYMLINK_NOFOLLOW) relative to the opened base, so no name
// is resolved twice.
//
// An existing entry of the step's name is never reused: job ids repeat
// (a reset controller, a wrapped counter) and, with keep_scratch, the
// directory there is an earlier job's, maybe another user's. It is renamed
// aside to "<step>.old-<unix nanoseconds>" (kept for its owner and the
// admin with keep_scratch, removed otherwise: it is a crashed stop's
// leftover) and a new directory is made.
//
// Root must be able to create and chown in the base: on a root-squashed
// NFS export it cannot (use a local disk or a Lustre/GPFS tree without root
// squash).
func (p Policy) CreateScratch(u User, step string) (string, error) {
	dir, err := p.ScratchDir(step)
	if dir == "" || err != nil {
		return "", err
	}
	base := filepath.Clean(p.ScratchBase)
	if err := CheckScratchBase(base); err != nil {
		return "", err
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", fmt.Errorf("scratch base %s: %w", base, err)
	}
	bfd, err := unix.Open(base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("scratch base %s: %w (must be a directory, not a symlink)", base, err)
	}
	defer unix.Close(bfd)
	var st unix.Stat_t
	if err := unix.Fstat(bfd, &st); err != nil {
		return "", fmt.Errorf("scratch base %s: %w", base, err)
	}
	if st.Uid != uint32(os.Geteuid()) || st.Mode&0o022 != 0 {
		return "", fmt.Errorf("scratch base %s is owned by uid %d with mode %#o: it must be owned by root and writable only by root (chown root %s; chmod go-w %s)",
			base, st.Uid, st.Mode&0o7777, base, base)
	}
	err = unix.Mkdirat(bfd, step, 0o700)
	if errors.Is(err, unix.EEXIST) {
		old := fmt.Sprintf("%s.old-%d", step, time.Now().UnixNano())
		if err := unix.Renameat2(bfd, step, bfd, old, unix.RENAME_NOREPLACE); err != nil {
			return "", fmt.Errorf("scratch directory %s exists and cannot be moved aside: %w", dir, err)
		}
		if !p.KeepScratch {
			if err := os.RemoveAll(filepath.Join(base, old)); err != nil {
				return "", fmt.Errorf("remove the earlier scratch directory %s: %w", filepath.Join(base, old), err)
			}
		}
		err = unix.Mkdirat(bfd, step, 0o700)
	}
	if err != nil {
		return "", fmt.Errorf("create scratch directory %s: %w", dir, err)
	}
	if err := unix.Fchownat(bfd, step, int(u.UID), int(u.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return "", fmt.Errorf("chown scratch directory %s to %d:%d: %w", dir, u.UID, u.GID, err)
	}
	// fchmodat has no AT_SYMLINK_NOFOLLOW on Linux; open the directory
	// itself without following and chmod the descriptor.
	dfd, err := unix.Openat(bfd, step, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open scratch directory %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	if err := unix.Fchmod(dfd, 0o700); err != nil {
		return "", fmt.Errorf("chmod scratch directory %s: %w", dir, err)
	}
	return dir, nil
}

// RemoveScratch removes the step's scratch directory and everything in it,
// unless keep_scratch is set or scratch is off. Idempotent. os.RemoveAll
// walks with openat/unlinkat and never follows a symlink, so a link the
// guest left in the scratch tree removes the link, not its target.
func (p Policy) RemoveScratch(step string) error {
	dir, err := p.ScratchDir(step)
	if dir == "" || err != nil || p.KeepScratch {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove scratch directory: %w", err)
	}
	return nil
}

// RemoveJobScratch removes the scratch directories of every step of job
// on node (names as state.StepID writes them; other nodes sharing the
// scratch base under multiple-slurmd keep theirs), unless keep_scratch
// is set: for `slurm-microvm gc`.
func (p Policy) RemoveJobScratch(job uint32, node string) error {
	if p.ScratchBase == "" || p.KeepScratch {
		return nil
	}
	ents, err := os.ReadDir(p.ScratchBase)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove scratch of job %d: %w", job, err)
	}
	var errs []error
	for _, e := range ents {
		if state.OfJobOnNode(e.Name(), job, node) {
			if err := os.RemoveAll(filepath.Join(p.ScratchBase, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove scratch of job %d: %w", job, err)
	}
	return nil
}
