package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// extractor writes the members of an untrusted tar stream below one
// directory, as root, without ever touching anything outside it:
//
//   - the parent of every member is opened with openat2(RESOLVE_IN_ROOT), so
//     "..", absolute symlinks and symlinks in the path resolve as they would
//     in the guest, inside the directory (a member "etc/x" below a symlink
//     etc -> /etc lands in DIR/etc/x, never in the host's /etc);
//   - the last component is created or changed with *at calls relative to
//     that parent fd with O_NOFOLLOW / AT_SYMLINK_NOFOLLOW;
//   - names that climb above the root ("../x") are refused as corrupt.
//
// Owners, permission bits (setuid included), mtimes and hard links are kept;
// device nodes are skipped (the guest's /dev is devtmpfs); xattrs are not
// restored. Directories get their final mode, owner and mtime in finish,
// after everything below them was written.
type extractor struct {
	root     int    // O_PATH fd of the target directory
	rootPath string // its path, trusted (created by this package)
	log      *slog.Logger
	chown    bool // preserve owners (only root can)
	dirs     map[string]dirAttr
	order    []string
	devices  int
}

type dirAttr struct {
	mode       uint32
	uid, gid   int
	atime, mod time.Time
}

func newExtractor(dir string, log *slog.Logger) (*extractor, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open extraction directory %s: %w", dir, err)
	}
	return &extractor{root: fd, rootPath: dir, log: log, chown: os.Geteuid() == 0, dirs: map[string]dirAttr{}}, nil
}

func (x *extractor) Close() error { return unix.Close(x.root) }

// extractStream applies every member of the tar read from r, then finish.
// hook, when set, sees every header first (the tree digest on the root side).
func (x *extractor) extractStream(ctx context.Context, r io.Reader, hook func(*tar.Header) error) error {
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				return err
			}
			return newErr("", ErrCorrupt, "truncated or malformed layer tar", "", err)
		}
		if hook != nil {
			if err := hook(hdr); err != nil {
				return err
			}
		}
		if err := x.apply(hdr, tr); err != nil {
			return err
		}
	}
	return x.finish()
}

// safeName cleans a member name to a path relative to the root ("." for the
// root itself). Names that climb out ("../x", "a/../../x") are refused.
func safeName(name string) (string, error) {
	c := path.Clean(name)
	c = strings.TrimLeft(c, "/")
	if c == "" {
		c = "."
	}
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", newErr("", ErrCorrupt, fmt.Sprintf("tar member %q leaves the image root", name), "the image is malformed or malicious; it was not unpacked", nil)
	}
	return c, nil
}

var resolveInRoot = unix.OpenHow{
	Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
}

func (x *extractor) openat2(rel string, how unix.OpenHow) (int, error) {
	for range 16 {
		fd, err := unix.Openat2(x.root, rel, &how)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		return fd, err
	}
	return -1, unix.EAGAIN
}

// openDir returns an O_PATH fd of the directory rel, resolved inside the
// root; with create, missing directories are made (0755, root-owned, like
// tar does for parents a stream does not list).
func (x *extractor) openDir(rel string, create bool) (int, error) {
	fd, err := x.openat2(rel, resolveInRoot)
	if err == nil || !create || err != unix.ENOENT || rel == "." {
		return fd, err
	}
	pfd, err := x.openDir(path.Dir(rel), true)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, path.Base(rel), 0o755); err != nil && err != unix.EEXIST {
		return -1, err
	}
	return x.openat2(rel, resolveInRoot)
}

func (x *extractor) apply(hdr *tar.Header, r io.Reader) error {
	rel, err := safeName(hdr.Name)
	if err != nil {
		return err
	}
	fail := func(what string, err error) error {
		return newErr("", ErrCorrupt, fmt.Sprintf("cannot %s %q", what, hdr.Name), "", err)
	}
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader, tar.TypeXHeader:
		return nil
	case tar.TypeChar, tar.TypeBlock:
		x.devices++
		x.log.Debug("skip device node", "name", hdr.Name)
		return nil
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fail("replace the image root with", errors.New("not a directory"))
		}
		x.recordDir(rel, hdr)
		return nil
	}
	pfd, err := x.openDir(path.Dir(rel), true)
	if err != nil {
		return fail("create the parent directory of", err)
	}
	defer unix.Close(pfd)
	base := path.Base(rel)

	var st unix.Stat_t
	exists := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	if exists {
		if hdr.Typeflag == tar.TypeDir && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			x.recordDir(rel, hdr)
			return nil
		}
		flags := 0
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			flags = unix.AT_REMOVEDIR
		}
		if err := unix.Unlinkat(pfd, base, flags); err != nil {
			return fail("replace", err)
		}
	}

	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return fail("create directory", err)
		}
		x.recordDir(rel, hdr)
		return nil
	case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // old writers
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fail("create file", err)
		}
		f := os.NewFile(uintptr(fd), rel)
		_, err = io.CopyN(f, r, hdr.Size)
		if err == nil && x.chown {
			err = f.Chown(hdr.Uid, hdr.Gid)
		}
		if err == nil {
			err = f.Chmod(tarMode(hdr))
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				return err
			}
			return fail("write file", err)
		}
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fail("create symlink", err)
		}
		if x.chown {
			if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fail("chown symlink", err)
			}
		}
	case tar.TypeLink:
		trel, err := safeName(hdr.Linkname)
		if err != nil {
			return err
		}
		tfd, err := x.openDir(path.Dir(trel), false)
		if err != nil {
			return fail("find the target of hard link", err)
		}
		err = unix.Linkat(tfd, path.Base(trel), pfd, base, 0)
		unix.Close(tfd)
		if err != nil {
			return fail("create hard link", err)
		}
		return nil // shares the target's inode: nothing more to set
	case tar.TypeFifo:
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return fail("create fifo", err)
		}
		if x.chown {
			if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fail("chown fifo", err)
			}
		}
		// The name was just created by mknodat, inside a directory only
		// root can write: it is the fifo, not a symlink.
		if err := unix.Fchmodat(pfd, base, rawMode(hdr), 0); err != nil {
			return fail("chmod fifo", err)
		}
	default:
		x.log.Debug("skip unsupported tar member", "name", hdr.Name, "type", string(hdr.Typeflag))
		return nil
	}
	return setTimes(pfd, base, hdr.AccessTime, hdr.ModTime)
}

func (x *extractor) recordDir(rel string, hdr *tar.Header) {
	if _, ok := x.dirs[rel]; !ok {
		x.order = append(x.order, rel)
	}
	x.dirs[rel] = dirAttr{mode: rawMode(hdr), uid: hdr.Uid, gid: hdr.Gid, atime: hdr.AccessTime, mod: hdr.ModTime}
}

// finish gives every directory listed in the stream its owner, mode and
// mtime, now that nothing more is written below it.
func (x *extractor) finish() error {
	for i := len(x.order) - 1; i >= 0; i-- {
		rel := x.order[i]
		a := x.dirs[rel]
		if err := x.finishDir(rel, a); err != nil {
			return newErr("", ErrCorrupt, fmt.Sprintf("cannot set the attributes of directory %q", rel), "", err)
		}
	}
	if x.devices > 0 {
		x.log.Debug("skipped device nodes", "count", x.devices)
	}
	return nil
}

func (x *extractor) finishDir(rel string, a dirAttr) error {
	var fd, pfd int
	var err error
	base := path.Base(rel)
	if rel == "." {
		fd, err = unix.Open(x.rootPath, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	} else {
		pfd, err = x.openDir(path.Dir(rel), false)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		fd, err = unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		if err == unix.ELOOP || err == unix.ENOTDIR || err == unix.ENOENT {
			return nil // replaced by a later member
		}
		return err
	}
	defer unix.Close(fd)
	if x.chown {
		if err := unix.Fchown(fd, a.uid, a.gid); err != nil {
			return err
		}
	}
	if err := unix.Fchmod(fd, a.mode); err != nil {
		return err
	}
	if rel == "." {
		return os.Chtimes(x.rootPath, orTime(a.atime, a.mod), a.mod)
	}
	return setTimes(pfd, base, a.atime, a.mod)
}

func setTimes(dirfd int, base string, atime, mtime time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(orTime(atime, mtime).UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(dirfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", base, err)
	}
	return nil
}

func orTime(t, def time.Time) time.Time {
	if t.IsZero() {
		return def
	}
	return t
}

// tarMode is the permission part of a tar header's mode, with setuid,
// setgid and sticky, as os.FileMode bits for os.File.Chmod.
func tarMode(hdr *tar.Header) os.FileMode {
	m := os.FileMode(hdr.Mode & 0o777)
	if hdr.Mode&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if hdr.Mode&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if hdr.Mode&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
}

// rawMode is the permission part of a tar header's mode as unix bits
// (07777), for the *at system calls.
func rawMode(hdr *tar.Header) uint32 { return uint32(hdr.Mode) & 0o7777 }
