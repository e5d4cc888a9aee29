package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// CheckDir verifies that path is a directory this process may keep private
// state in: a real directory (not a symlink), owned by the effective uid
// and writable by nobody else (no group or other write bit). Every ancestor
// (after resolving symlinks) must be owned by root or the effective uid and,
// when group- or world-writable, sticky (as /tmp is): in such a parent
// nobody else can rename or replace an entry this uid owns.
//
// A directory that fails is refused, never repaired: another user may have
// created it in advance (a predictable name in /tmp) to read what the
// launcher writes there or to plant a socket or symlink in it.
func CheckDir(path string) error {
	path = filepath.Clean(path)
	if !filepath.IsAbs(path) {
		return fmt.Errorf("state directory %q: must be an absolute path", path)
	}
	if err := checkAncestors(filepath.Dir(path)); err != nil {
		return fmt.Errorf("state directory %s: %w", path, err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("state directory %s: %w (it must be a directory, not a symlink)", path, err)
	}
	defer unix.Close(fd)
	return checkOwnedFd(fd, path)
}

func checkOwnedFd(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("state directory %s: %w", path, err)
	}
	euid := uint32(os.Geteuid())
	if st.Uid != euid || st.Mode&0o022 != 0 {
		return fmt.Errorf("state directory %s is owned by uid %d with mode %#o: it must be owned by uid %d and writable by nobody else, so refused (another user may have created it to intercept the step; remove it or choose another directory)",
			path, st.Uid, st.Mode&0o7777, euid)
	}
	return nil
}

// checkAncestors applies CheckDir's rule for ancestors to dir and each of
// its parents.
func checkAncestors(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", dir, err)
	}
	euid := uint32(os.Geteuid())
	for p := real; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("check %s: %w", p, err)
		}
		if st.Uid != 0 && st.Uid != euid {
			return fmt.Errorf("parent %s is owned by uid %d: every parent must be owned by root or uid %d", p, st.Uid, euid)
		}
		if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
			return fmt.Errorf("parent %s has mode %#o: a parent writable by others must be sticky (as /tmp is)", p, st.Mode&0o7777)
		}
		if p == "/" {
			return nil
		}
	}
}

// MakeDir creates the directory path with mode perm (missing parents 0755)
// unless it exists, then verifies it with CheckDir and sets perm exactly.
// An existing directory that fails CheckDir is an error, never reused.
func MakeDir(path string, perm os.FileMode) error {
	path = filepath.Clean(path)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	if err := os.Mkdir(path, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create state directory %s: %w", path, err)
	}
	if err := checkAncestors(filepath.Dir(path)); err != nil {
		return fmt.Errorf("state directory %s: %w", path, err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("state directory %s: %w (it must be a directory, not a symlink)", path, err)
	}
	defer unix.Close(fd)
	if err := checkOwnedFd(fd, path); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, uint32(perm.Perm())); err != nil {
		return fmt.Errorf("chmod state directory %s: %w", path, err)
	}
	return nil
}

// PrivateTempDir creates a new directory, mode 0700, with a random name
// starting with prefix under base (os.TempDir() when base is ""), after
// checking base's own ownership rule (CheckDir's rule for ancestors). No
// other user can have created or entered it: it is for state that only
// this process needs to find (`slurm-microvm run`).
func PrivateTempDir(base, prefix string) (string, error) {
	if base == "" {
		base = os.TempDir()
	}
	if err := checkAncestors(base); err != nil {
		return "", fmt.Errorf("private directory in %s: %w", base, err)
	}
	dir, err := os.MkdirTemp(base, prefix)
	if err != nil {
		return "", fmt.Errorf("private directory in %s: %w", base, err)
	}
	if err := CheckDir(dir); err != nil {
		os.Remove(dir)
		return "", err
	}
	return dir, nil
}

// OpenFile opens the file path like os.OpenFile, but never through a
// symlink (O_NOFOLLOW) and never anything but a regular file owned by the
// effective uid (a FIFO planted for a log would block a writer; a file of
// another user is not ours to truncate or append to).
func OpenFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	// O_TRUNC only once the file passed the checks.
	trunc := flag&os.O_TRUNC != 0
	f, err := os.OpenFile(path, flag&^os.O_TRUNC|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, perm)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("open %s: it is a symlink, refused: %w", path, err)
		}
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, fmt.Errorf("open %s: not a regular file (mode %#o), refused", path, st.Mode)
	}
	if st.Uid != uint32(os.Geteuid()) {
		f.Close()
		return nil, fmt.Errorf("open %s: owned by uid %d, not %d, refused", path, st.Uid, os.Geteuid())
	}
	if trunc {
		if err := f.Truncate(0); err != nil {
			f.Close()
			return nil, fmt.Errorf("truncate %s: %w", path, err)
		}
	}
	// Back to blocking mode (O_NONBLOCK only guarded the open).
	if fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); err == nil {
		_, _ = unix.FcntlInt(f.Fd(), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	}
	return f, nil
}

// WriteFileAtomic writes data to path through a new temporary file in the
// same directory (created with O_EXCL, so nothing planted is followed or
// reused) and a rename, so readers see either nothing or the whole content
// with mode applied.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	dir, base := filepath.Split(path)
	f, err := os.CreateTemp(dir, "."+base+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	err = f.Chmod(mode)
	if err == nil {
		_, err = f.Write(data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// POSIX ACL xattr encoding (linux/posix_acl_xattr.h).
const (
	aclXattr    = "system.posix_acl_access"
	aclVersion  = 2
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclMask     = 0x10
	aclOther    = 0x20
	aclUndefID  = 0xffffffff
)

// GrantSearch sets the access ACL of the directory path to: its owner rwx,
// uid search only (--x), nobody else anything (group and other ---, mask
// --x). uid can then open the entries it knows the names of, by the entries'
// own modes, but cannot list the directory; every other user (the owner's
// group included) cannot enter it at all. The filesystem must support POSIX
// ACLs (tmpfs, ext4, xfs do); the error says so otherwise.
func GrantSearch(path string, uid uint32) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("grant uid %d access to %s: %w", uid, path, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return fmt.Errorf("grant uid %d access to %s: %w", uid, path, err)
	}
	entries := []struct {
		tag, perm uint16
		id        uint32
	}{
		{aclUserObj, 7, aclUndefID},
		{aclUser, 1, uid},
		{aclGroupObj, 0, aclUndefID},
		{aclMask, 1, aclUndefID},
		{aclOther, 0, aclUndefID},
	}
	b := binary.LittleEndian.AppendUint32(nil, aclVersion)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	if err := unix.Fsetxattr(fd, aclXattr, b, 0); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("grant uid %d access to %s: the filesystem does not support POSIX ACLs, which keep a step's state to root and the job's user: put runtime_dir on tmpfs (/run) or a filesystem mounted with ACLs: %w", uid, path, err)
		}
		return fmt.Errorf("grant uid %d access to %s: %w", uid, path, err)
	}
	return nil
}

// CheckACLSupport reports whether directories in dir can carry the ACL
// GrantSearch sets, by trying it on a temporary directory (`config check`).
func CheckACLSupport(dir string) error {
	probe, err := os.MkdirTemp(dir, ".acl-probe-*")
	if err != nil {
		return fmt.Errorf("probe %s for ACL support: %w", dir, err)
	}
	defer os.Remove(probe)
	if err := GrantSearch(probe, 65534); err != nil {
		return err
	}
	return nil
}
