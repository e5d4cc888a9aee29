package mpi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	erofs "github.com/erofs/go-erofs"

	"github.com/slurm-microvm/slurm-microvm/launcher/image"
)

// DiskAccess says how an erofs disk is read.
type DiskAccess int

// Ways to read a disk. None mounts it: a mounted image is reachable by
// every local user through the mount point while it is mounted (its own
// root directory, usually 0755, decides access) and by any descriptor
// opened meanwhile, and a process killed mid-check leaves the mount and
// its loop device behind.
const (
	// DiskAuto reads the disk in this process, and extracts it when the
	// reader cannot (a disk compressed with mkfs.erofs -z).
	DiskAuto DiskAccess = iota
	// DiskRead reads the disk's blocks in this process (package
	// github.com/erofs/go-erofs): no mount, no loop device, no copy,
	// nothing left if the process dies. Uncompressed disks only (what
	// launcher/image builds unless told to compress).
	DiskRead
	// DiskExtract unpacks the whole disk with fsck.erofs --extract
	// (erofs-utils >= 1.5) into a private directory (0700) under
	// DiskOptions.WorkDir: any disk, costs a copy of the image.
	DiskExtract
)

// DiskOptions tune OpenDisk.
type DiskOptions struct {
	// Access says how the disk is read (DiskAuto).
	Access DiskAccess
	// WorkDir is where an extraction goes (os.TempDir() when empty): a
	// fresh 0700 directory "mpi-image-*" in it, removed by Root.Close. A
	// caller that may be killed mid-check passes a directory that its own
	// cleanup removes (the launcher: the step's state directory).
	WorkDir string
}

// OpenDisk opens the erofs disk at path disk as a Root, without mounting
// it. Close releases it and removes anything made for it. Errors name the
// disk; a disk the reader cannot read with DiskRead wraps
// erofs.ErrNotImplemented (compressed) or fs.ErrInvalid (corrupt).
func OpenDisk(ctx context.Context, disk string, o DiskOptions) (*Root, error) {
	abs, err := filepath.Abs(disk)
	if err != nil {
		return nil, fmt.Errorf("open disk %s: %w", disk, err)
	}
	if o.Access != DiskExtract {
		r, err := readDisk(abs)
		if err == nil || o.Access == DiskRead || !errors.Is(err, erofs.ErrNotImplemented) {
			return r, err
		}
	}
	return extractDisk(ctx, abs, o.WorkDir)
}

// readDisk opens disk with the in-process erofs reader.
func readDisk(disk string) (_ *Root, err error) {
	f, err := os.Open(disk)
	if err != nil {
		return nil, fmt.Errorf("open disk %s: %w", disk, err)
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("read erofs disk %s: malformed: %v", disk, p)
		}
		if err != nil {
			f.Close()
		}
	}()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("open disk %s: %w", disk, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("open disk %s: not a regular file", disk)
	}
	fsys, err := erofs.Open(f)
	if err != nil {
		return nil, fmt.Errorf("read erofs disk %s: %w", disk, err)
	}
	ef, ok := fsys.(erofsFS)
	if !ok {
		return nil, fmt.Errorf("read erofs disk %s: the reader lacks Lstat/ReadLink/ReadDir", disk)
	}
	t := &diskTree{name: disk, f: f, size: fi.Size(), fsys: ef}
	// The loader configuration is read now: a disk whose very root
	// cannot be read fails here, not as an empty image.
	if _, err := t.lstat("/"); err != nil {
		return nil, fmt.Errorf("read erofs disk %s: %w", disk, err)
	}
	return rootOf(disk, t), nil
}

// extractDisk unpacks disk into a private directory under work.
func extractDisk(ctx context.Context, disk, work string) (*Root, error) {
	dir, err := os.MkdirTemp(work, "mpi-image-")
	if err != nil {
		return nil, fmt.Errorf("extract disk %s: %w", disk, err)
	}
	remove := func() error { return removeAllWritable(dir) }
	root := filepath.Join(dir, "root")
	out, err := exec.CommandContext(ctx, "fsck.erofs", "--extract="+root, disk).CombinedOutput()
	if err != nil {
		_ = remove()
		return nil, fmt.Errorf("fsck.erofs --extract=%s %s: %v: %s", root, disk, err, strings.TrimSpace(string(out)))
	}
	r, err := OpenRoot(root)
	if err != nil {
		_ = remove()
		return nil, err
	}
	r.done = remove
	return r, nil
}

// removeAllWritable removes an extracted tree, first making its
// directories writable (images hold 0555 directories).
func removeAllWritable(dir string) error {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove extracted image %s: %w", dir, err)
	}
	return nil
}

// erofsFS is what the go-erofs reader offers beyond fs.FS.
type erofsFS interface {
	fs.ReadLinkFS
	fs.ReadDirFS
}

// diskTree is an erofs disk read by go-erofs. Paths are handed to the
// reader relative to the image's root; the reader resolves links against
// that root itself (absolute targets from the root, ".." stopping there).
type diskTree struct {
	name string // the disk's path
	f    *os.File
	size int64
	fsys erofsFS
}

// maxInMemory bounds a file that has no direct block mapping and is read
// whole instead.
const maxInMemory = 64 << 20

func rel(p string) string {
	p = strings.TrimLeft(path.Clean("/"+p), "/")
	if p == "" {
		return "."
	}
	return p
}

// guard turns a panic of the reader on a malformed disk into an error.
func (t *diskTree) guard(op, p string, err *error) {
	if v := recover(); v != nil {
		*err = &fs.PathError{Op: op, Path: t.name + ":" + p, Err: fmt.Errorf("malformed erofs disk: %v", v)}
	}
}

func (t *diskTree) lstat(p string) (_ fs.FileInfo, err error) {
	defer t.guard("lstat", p, &err)
	return t.fsys.Lstat(rel(p))
}

func (t *diskTree) readlink(p string) (_ string, err error) {
	defer t.guard("readlink", p, &err)
	return t.fsys.ReadLink(rel(p))
}

func (t *diskTree) readDir(p string) (_ []fs.DirEntry, err error) {
	defer t.guard("readdir", p, &err)
	return t.fsys.ReadDir(rel(p))
}

func (t *diskTree) close() error { return t.f.Close() }

// open returns a view of the file's bytes on the disk (its data ranges),
// or, for a file without a direct mapping, its contents read whole.
func (t *diskTree) open(p string) (_ File, err error) {
	defer t.guard("open", p, &err)
	name := filepath.Join(t.name, filepath.FromSlash(p))
	f, err := t.fsys.Open(rel(p))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	df := &diskFile{name: name, fi: fi, disk: t.f, diskSize: t.size}
	if !fi.Mode().IsRegular() || fi.Size() == 0 {
		return df, nil
	}
	if dr, ok := fi.(interface{ DataRange() []erofs.DataRange }); ok {
		if rs := dr.DataRange(); validRanges(rs, fi.Size(), t.size) {
			df.ranges = rs
			return df, nil
		}
	}
	if fi.Size() > maxInMemory {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fmt.Errorf("%d bytes without a direct block mapping, more than the %d read whole", fi.Size(), maxInMemory)}
	}
	b := make([]byte, fi.Size())
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	df.data = b
	return df, nil
}

// validRanges reports whether rs covers a file of size bytes exactly, each
// range on the disk itself (device 0) and inside it, or a hole.
func validRanges(rs []erofs.DataRange, size, diskSize int64) bool {
	var sum int64
	for _, r := range rs {
		if r.Size < 0 || (r.Offset >= 0 && (r.Device != 0 || r.Offset+r.Size > diskSize)) {
			return false
		}
		sum += r.Size
	}
	return len(rs) > 0 && sum == size
}

// diskFile is an open file of a diskTree.
type diskFile struct {
	name     string
	fi       fs.FileInfo
	disk     io.ReaderAt
	diskSize int64
	ranges   []erofs.DataRange // the file's bytes in order (Offset -1: a hole)
	data     []byte            // or its contents, when it has no ranges
}

func (f *diskFile) Name() string               { return f.name }
func (f *diskFile) Stat() (fs.FileInfo, error) { return f.fi, nil }
func (f *diskFile) Close() error               { return nil }

// ReadAt reads len(p) bytes of the file at off, as io.ReaderAt says.
func (f *diskFile) ReadAt(p []byte, off int64) (int, error) {
	if !f.fi.Mode().IsRegular() {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: errors.New("not a regular file")}
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: fs.ErrInvalid}
	}
	if f.data != nil || len(f.ranges) == 0 {
		if off >= int64(len(f.data)) {
			return 0, io.EOF
		}
		n := copy(p, f.data[off:])
		if n < len(p) {
			return n, io.EOF
		}
		return n, nil
	}
	n := 0
	var pos int64
	for _, r := range f.ranges {
		if len(p) == 0 {
			break
		}
		end := pos + r.Size
		if off < end {
			skip := off - pos
			m := min(int64(len(p)), r.Size-skip)
			if r.Offset < 0 {
				clear(p[:m])
			} else if k, err := f.disk.ReadAt(p[:m], r.Offset+skip); int64(k) != m {
				if err == nil || err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return n + k, &fs.PathError{Op: "read", Path: f.name, Err: err}
			}
			p = p[m:]
			n += int(m)
			off += m
		}
		pos = end
	}
	if len(p) > 0 {
		return n, io.EOF
	}
	return n, nil
}

// ImageCheckOptions tune CheckImage.
type ImageCheckOptions struct {
	CheckOptions
	// HostRoot is the host's root ("/" when empty).
	HostRoot string
	// Image says whose image it is and where it is cached (image.Prepare).
	Image image.Options
	// Disk says how the prepared disk is read.
	Disk DiskOptions
}

// CheckImage prepares image reference ref with launcher/image (converting it
// on first use, as a step would), opens its disk (OpenDisk) and runs Check
// against the host. Report.Image is set to ref; Report.ImageRoot is the
// disk, or the extraction that was removed.
func CheckImage(ctx context.Context, ref string, o ImageCheckOptions) (*Report, error) {
	img, err := image.Prepare(ctx, ref, o.Image)
	if err != nil {
		return nil, err
	}
	r, err := OpenDisk(ctx, img.Disk, o.Disk)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	host := o.HostRoot
	if host == "" {
		host = "/"
	}
	h, err := OpenRoot(host)
	if err != nil {
		return nil, fmt.Errorf("mpi check: host %w", err)
	}
	defer h.Close()
	rep, err := CheckRoots(ctx, h, r, o.CheckOptions)
	if err != nil {
		return nil, err
	}
	rep.Image = ref
	return rep, nil
}
