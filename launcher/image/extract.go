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

// extractor writes the members of untrusted tar streams below one
// directory, as root, without ever touching anything outside it:
//
//   - the parent of every member is opened with openat2(RESOLVE_IN_ROOT), so
//     "..", absolute symlinks and symlinks in the path resolve as they would
//     in the guest, inside the directory (a member "etc/x" below a symlink
//     etc -> /etc lands in DIR/etc/x, never in the host's /etc); missing
//     parents are made where that resolution leads (resolve);
//   - the last component is created or changed with *at calls relative to
//     that parent fd with O_NOFOLLOW / AT_SYMLINK_NOFOLLOW;
//   - names that climb above the root ("../x") are refused as corrupt.
//
// Image layers are applied one after the other, oldest first, as
// containerd's applier does (archive.Apply): a later layer writes through
// the symlinks of earlier ones (bin/x lands in usr/bin/x below bin ->
// usr/bin), an existing entry is replaced unless both are directories (a
// directory entry over a symlink to a directory merges into it), and
// whiteouts (.wh.NAME, .wh..wh..opq) remove what earlier layers made.
//
// Owners, permission bits (setuid included), mtimes and hard links are kept;
// device nodes are skipped (the guest's /dev is devtmpfs); xattrs are not
// restored. Directories get their final mode, owner and mtime in finish,
// after everything below them was written. Every entry and every byte of
// file data counts against the bounds (Limits); file data is copied in
// chunks, checking ctx between them.
type extractor struct {
	root     int    // O_PATH fd of the target directory
	rootPath string // its path, trusted (created by this package)
	log      *slog.Logger
	chown    bool // preserve owners (only root can)
	// layered: the streams are image layers (whiteouts apply); a root
	// filesystem directory's stream is not (a file named .wh.x is data).
	layered bool
	dirs    map[string]dirAttr
	order   []string
	// removed maps a member name to the sequence number of the entry that
	// last removed it (a replaced entry, a whiteout), so that finish does
	// not apply a removed directory's attributes to its successor.
	removed map[string]int64
	seq     int64
	// written holds the entries the current layer made, which an opaque
	// whiteout of their directory keeps (by parent inode and name, so that
	// aliases through symlinks agree).
	written map[entryKey]struct{}
	bytes   []*bound // bytes of regular file data
	entries []*bound // members
	buf     []byte
	devices int
}

type entryKey struct {
	dev, ino uint64
	name     string
}

type dirAttr struct {
	mode       uint32
	uid, gid   int
	atime, mod time.Time
	seq        int64
}

// Whiteout names of the OCI image spec (layer.md, "Whiteouts").
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

func newExtractor(dir string, log *slog.Logger) (*extractor, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open extraction directory %s: %w", dir, err)
	}
	return &extractor{root: fd, rootPath: dir, log: log, chown: os.Geteuid() == 0,
		dirs: map[string]dirAttr{}, removed: map[string]int64{}, written: map[entryKey]struct{}{}}, nil
}

func (x *extractor) Close() error { return unix.Close(x.root) }

// extractStream applies every member of the tar read from r, then finish.
// hook, when set, sees every header first (the tree digest on the root side).
func (x *extractor) extractStream(ctx context.Context, r io.Reader, hook func(*tar.Header) error) error {
	if err := x.applyTar(ctx, r, hook); err != nil {
		return err
	}
	return x.finish()
}

// applyLayer applies one image layer's tar over what earlier layers made;
// finish is called once after the last layer.
func (x *extractor) applyLayer(ctx context.Context, r io.Reader) error {
	clear(x.written)
	return x.applyTar(ctx, r, nil)
}

func (x *extractor) applyTar(ctx context.Context, r io.Reader, hook func(*tar.Header) error) error {
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if keepErr(err) {
				return err
			}
			return newErr("", ErrCorrupt, "truncated or malformed layer tar", "", err)
		}
		if hook != nil {
			if err := hook(hdr); err != nil {
				return err
			}
		}
		if err := x.apply(ctx, hdr, tr); err != nil {
			return err
		}
	}
}

// keepErr reports errors passed up unchanged: the package's own (a limit,
// a digest mismatch) and cancellation.
func keepErr(err error) bool {
	var e *Error
	return errors.As(err, &e) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
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

// splitRel splits a cleaned relative name into its directory ("." at the
// top) and last component.
func splitRel(rel string) (string, string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return ".", rel
	}
	return rel[:i], rel[i+1:]
}

func joinRel(dir, base string) string {
	if dir == "." {
		return base
	}
	return dir + "/" + base
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
// tar does for parents a stream does not list) where the resolution of rel
// leads, through symlinks (a dangling bin -> usr/bin makes usr/bin).
func (x *extractor) openDir(rel string, create bool) (int, error) {
	fd, err := x.openat2(rel, resolveInRoot)
	if err == nil || !create || err != unix.ENOENT {
		return fd, err
	}
	res, err := x.resolve(rel)
	if err != nil {
		return -1, err
	}
	fd, err = x.openat2(".", resolveInRoot)
	if err != nil {
		return -1, err
	}
	for _, c := range strings.Split(res, "/") {
		if c == "." || c == "" {
			continue
		}
		made := false
		if err := unix.Mkdirat(fd, c, 0o755); err == nil {
			made = true
		} else if err != unix.EEXIST {
			unix.Close(fd)
			return -1, err
		}
		if made {
			x.mark(fd, c)
		}
		nfd, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = nfd
	}
	return fd, nil
}

// resolve returns rel with every symlink in it replaced by its target,
// resolved inside the root the way openat2(RESOLVE_IN_ROOT) does (absolute
// targets start at the root, ".." stops there): containerd's fs.RootPath.
// Components that do not exist are kept as they are: the result names the
// directories to create. Nothing but this extractor writes below the root,
// so the path cannot change between resolve and its use.
func (x *extractor) resolve(rel string) (string, error) {
	var out []string
	rest := strings.Split(rel, "/")
	for links := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			continue
		}
		target, ok := x.readlink(out, c)
		if !ok {
			out = append(out, c)
			continue
		}
		if links++; links > 40 {
			return "", unix.ELOOP
		}
		if strings.HasPrefix(target, "/") {
			out = out[:0]
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	if len(out) == 0 {
		return ".", nil
	}
	return strings.Join(out, "/"), nil
}

// readlink reads the symlink name in the symlink-free directory dir; ok is
// false when it is not a symlink (or does not exist).
func (x *extractor) readlink(dir []string, name string) (string, bool) {
	d := "."
	if len(dir) > 0 {
		d = strings.Join(dir, "/")
	}
	fd, err := x.openat2(d, resolveInRoot)
	if err != nil {
		return "", false
	}
	defer unix.Close(fd)
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, name, buf)
	if err != nil {
		return "", false
	}
	return string(buf[:n]), true
}

// mark records that the current layer made name in the directory dirfd.
func (x *extractor) mark(dirfd int, name string) {
	if !x.layered {
		return
	}
	var st unix.Stat_t
	if unix.Fstat(dirfd, &st) == nil {
		x.written[entryKey{dev: st.Dev, ino: st.Ino, name: name}] = struct{}{}
	}
}

func countAll(bs []*bound, n int64) error {
	for _, b := range bs {
		if err := b.add(n); err != nil {
			return err
		}
	}
	return nil
}

func (x *extractor) apply(ctx context.Context, hdr *tar.Header, r io.Reader) error {
	rel, err := safeName(hdr.Name)
	if err != nil {
		return err
	}
	fail := func(what string, err error) error {
		if keepErr(err) {
			return err
		}
		return newErr("", ErrCorrupt, fmt.Sprintf("cannot %s %q", what, hdr.Name), "", err)
	}
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader, tar.TypeXHeader:
		return nil
	}
	if err := countAll(x.entries, 1); err != nil {
		return err
	}
	x.seq++
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		x.devices++
		x.log.Debug("skip device node", "name", hdr.Name)
		return nil
	}
	dir, base := splitRel(rel)
	if x.layered && strings.HasPrefix(base, whiteoutPrefix) {
		return x.whiteout(hdr.Name, dir, base)
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fail("replace the image root with", errors.New("not a directory"))
		}
		x.recordDir(rel, hdr)
		return nil
	}
	pfd, err := x.openDir(dir, true)
	if err != nil {
		return fail("create the parent directory of", err)
	}
	defer unix.Close(pfd)

	var st unix.Stat_t
	if unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		typ := st.Mode & unix.S_IFMT
		if hdr.Typeflag == tar.TypeDir && typ == unix.S_IFDIR {
			x.recordDir(rel, hdr)
			x.mark(pfd, base)
			return nil
		}
		if hdr.Typeflag == tar.TypeDir && typ == unix.S_IFLNK && x.layered {
			// A directory over a symlink to a directory (bin/ over bin ->
			// usr/bin) merges into it, as containerd resolves "bin/".
			if fd, err := x.openat2(rel, resolveInRoot); err == nil {
				unix.Close(fd)
				x.mark(pfd, base)
				return nil
			}
		}
		if err := removeAt(pfd, base); err != nil {
			return fail("replace", err)
		}
		x.removed[rel] = x.seq
	}
	x.mark(pfd, base)

	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return fail("create directory", err)
		}
		x.recordDir(rel, hdr)
		return nil
	case tar.TypeReg: // archive/tar reads the old TypeRegA as TypeReg
		if err := countAll(x.bytes, hdr.Size); err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fail("create file", err)
		}
		f := os.NewFile(uintptr(fd), rel)
		err = x.copyData(ctx, f, r, hdr.Size)
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
		tdir, tbase := splitRel(trel)
		tfd, err := x.openDir(tdir, false)
		if err != nil {
			return fail("find the target of hard link", err)
		}
		err = unix.Linkat(tfd, tbase, pfd, base, 0)
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

// copyData copies n bytes of a member's data in chunks of 1 MiB, checking
// ctx between chunks: one multi-gigabyte member stops promptly when the
// conversion is cancelled.
func (x *extractor) copyData(ctx context.Context, w io.Writer, r io.Reader, n int64) error {
	if x.buf == nil {
		x.buf = make([]byte, 1<<20)
	}
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := min(n, int64(len(x.buf)))
		m, err := io.ReadFull(r, x.buf[:k])
		if m > 0 {
			if _, werr := w.Write(x.buf[:m]); werr != nil {
				return werr
			}
		}
		n -= int64(m)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// whiteout applies the whiteout member name (directory dir, last component
// base) of a layer: .wh.NAME removes NAME, .wh..wh..opq removes everything
// earlier layers made in dir. The directory is resolved inside the root,
// as for any member; a whiteout of something missing does nothing.
func (x *extractor) whiteout(name, dir, base string) error {
	fail := func(err error) error {
		return newErr("", ErrCorrupt, fmt.Sprintf("cannot apply whiteout %q", name), "", err)
	}
	pfd, err := x.openat2(dir, resolveInRoot)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return nil
	}
	if err != nil {
		return fail(err)
	}
	defer unix.Close(pfd)
	if base == whiteoutOpaque {
		if err := x.opaque(pfd, dir); err != nil {
			return fail(err)
		}
		return nil
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil // other AUFS metadata: not content
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "." || target == ".." {
		return newErr("", ErrCorrupt, fmt.Sprintf("whiteout %q names no file", name), "the image is malformed", nil)
	}
	if err := removeAt(pfd, target); err != nil {
		return fail(err)
	}
	x.removed[joinRel(dir, target)] = x.seq
	return nil
}

// opaque empties the directory dirfd (named dir) of everything the current
// layer did not make.
func (x *extractor) opaque(dirfd int, dir string) error {
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), dir)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(dirfd, &st); err != nil {
		return err
	}
	for _, n := range names {
		if _, keep := x.written[entryKey{dev: st.Dev, ino: st.Ino, name: n}]; keep {
			continue
		}
		if err := removeAt(dirfd, n); err != nil {
			return err
		}
		x.removed[joinRel(dir, n)] = x.seq
	}
	return nil
}

// removeAt removes name in dirfd and, for a directory, everything below
// it, never following a symlink.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	switch err {
	case nil, unix.ENOENT:
		return nil
	case unix.EISDIR:
	default:
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

func (x *extractor) recordDir(rel string, hdr *tar.Header) {
	if _, ok := x.dirs[rel]; !ok {
		x.order = append(x.order, rel)
	}
	x.dirs[rel] = dirAttr{mode: rawMode(hdr), uid: hdr.Uid, gid: hdr.Gid, atime: hdr.AccessTime, mod: hdr.ModTime, seq: x.seq}
}

// stale reports whether the directory recorded as rel was removed (itself
// or a directory above it) after it was recorded.
func (x *extractor) stale(rel string, a dirAttr) bool {
	for p := rel; ; {
		if s, ok := x.removed[p]; ok && s > a.seq {
			return true
		}
		if p == "." {
			return false
		}
		p, _ = splitRel(p)
	}
}

// finish gives every directory listed in the stream its owner, mode and
// mtime, now that nothing more is written below it.
func (x *extractor) finish() error {
	for i := len(x.order) - 1; i >= 0; i-- {
		rel := x.order[i]
		a := x.dirs[rel]
		if x.stale(rel, a) {
			continue
		}
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
		if err == unix.ENOENT || err == unix.ENOTDIR {
			return nil // removed with a directory above it
		}
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
