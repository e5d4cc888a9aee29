// Package guestpath resolves mount destinations inside the guest's root
// filesystem for the agent (pure Go, no cgo: it is linked into the static
// PID 1).
//
// A destination such as /var/run/x is a path inside the image, and the
// image is untrusted: /var/run is often a symlink to /run, and a crafted
// image may hold /data -> /../../run/microvm or -> /proc/self/root. Resolve
// follows the image's symlinks the way a chroot would (an absolute target
// starts again at the image root, ".." stops at it), so a mount lands where
// the image says, but never outside the root directory the agent gives it.
// Missing directories are created one by one with mkdirat below the
// directory already resolved, and every step works on descriptors
// (openat with O_NOFOLLOW), so nothing is resolved by name twice.
//
// The agent should mount onto the returned descriptor
// (mount(src, "/proc/self/fd/N", ...) or move_mount), not onto a path
// string: that is the directory that was checked.
//
// Design decision: a userspace walk, not openat2(RESOLVE_IN_ROOT). The
// kernel's RESOLVE_IN_ROOT has the same chroot semantics but cannot create
// the missing components, and creating them by name afterwards would
// re-resolve the path; the walk also works on guest kernels before 5.6.
package guestpath

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxSymlinks bounds symlink expansion, as the kernel's MAXSYMLINKS does.
const MaxSymlinks = 40

// Options of Resolve.
type Options struct {
	// Create makes missing directories (mode Mode, default 0755).
	Create bool
	Mode   uint32
	// Refuse lists in-root paths that the resolved destination may not be
	// or lie below ("/" refuses only itself). Checked after symlinks, so
	// /data -> /proc is caught.
	Refuse []string
}

// Error is a destination that cannot be resolved.
type Error struct {
	Dest string // as asked
	At   string // the in-root path resolved so far
	Err  error
}

func (e *Error) Error() string {
	if e.At != "" && e.At != e.Dest {
		return fmt.Sprintf("mount point %s (at %s inside the image): %v", e.Dest, e.At, e.Err)
	}
	return fmt.Sprintf("mount point %s: %v", e.Dest, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrRefused is returned (wrapped in *Error) for a destination that
// resolves to a refused path.
var ErrRefused = errors.New("destination is reserved")

// Resolve resolves dest (an absolute path as seen inside root) below the
// directory root and returns it opened O_PATH|O_DIRECTORY, with its in-root
// path (absolute, every symlink resolved). The final component must be a
// directory (or be created as one). The caller closes the file.
func Resolve(root, dest string, o Options) (*os.File, string, error) {
	if !strings.HasPrefix(dest, "/") {
		return nil, "", &Error{Dest: dest, Err: errors.New("not an absolute path")}
	}
	mode := o.Mode
	if mode == 0 {
		mode = 0o755
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", &Error{Dest: dest, Err: fmt.Errorf("open root %s: %w", root, err)}
	}
	// stack[i] is the descriptor of the directory at depth i; names[i-1]
	// its name. stack[0] is the root.
	stack := []int{rootFD}
	var names []string
	closeAll := func() {
		for _, fd := range stack {
			unix.Close(fd)
		}
	}
	cur := func() string { return "/" + strings.Join(names, "/") }
	fail := func(err error) (*os.File, string, error) {
		at := cur()
		closeAll()
		return nil, "", &Error{Dest: dest, At: at, Err: err}
	}
	rest := strings.Split(dest, "/")
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) > 1 {
				unix.Close(stack[len(stack)-1])
				stack = stack[:len(stack)-1]
				names = names[:len(names)-1]
			}
			continue
		}
		dir := stack[len(stack)-1]
		var st unix.Stat_t
		err := unix.Fstatat(dir, c, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) && o.Create {
			err = unix.Mkdirat(dir, c, mode)
			if err != nil && !errors.Is(err, unix.EEXIST) {
				return fail(fmt.Errorf("create %s: %w", path.Join(cur(), c), err))
			}
			rest = append([]string{c}, rest...) // look again: made, or raced
			continue
		}
		if err != nil {
			return fail(fmt.Errorf("%s: %w", path.Join(cur(), c), err))
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			links++
			if links > MaxSymlinks {
				return fail(unix.ELOOP)
			}
			target, err := readlinkat(dir, c)
			if err != nil {
				return fail(fmt.Errorf("read link %s: %w", path.Join(cur(), c), err))
			}
			if strings.HasPrefix(target, "/") {
				for _, fd := range stack[1:] {
					unix.Close(fd)
				}
				stack, names = stack[:1], nil
			}
			rest = append(strings.Split(target, "/"), rest...)
		case unix.S_IFDIR:
			fd, err := unix.Openat(dir, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fail(fmt.Errorf("open %s: %w", path.Join(cur(), c), err))
			}
			stack = append(stack, fd)
			names = append(names, c)
		default:
			return fail(fmt.Errorf("%s: %w", path.Join(cur(), c), unix.ENOTDIR))
		}
	}
	in := cur()
	for _, r := range o.Refuse {
		r = path.Clean(r)
		if in == r || r != "/" && strings.HasPrefix(in, r+"/") {
			return fail(fmt.Errorf("%w: resolves to %s", ErrRefused, in))
		}
	}
	fd := stack[len(stack)-1]
	stack = stack[:len(stack)-1]
	closeAll()
	if fd == rootFD {
		return os.NewFile(uintptr(fd), root), in, nil
	}
	return os.NewFile(uintptr(fd), path.Join(root, in)), in, nil
}

func readlinkat(dir int, name string) (string, error) {
	for n := 256; ; n *= 2 {
		b := make([]byte, n)
		k, err := unix.Readlinkat(dir, name, b)
		if err != nil {
			return "", err
		}
		if k < n {
			return string(b[:k]), nil
		}
		if n > 1<<16 {
			return "", unix.ENAMETOOLONG
		}
	}
}

// NinePOptions is the mount data of a writable host share (the user's rw
// mounts and the step's scratch) exported by fs.NineP: mount -t 9p TAG DIR
// -o NinePOptions, flags MS_NOSUID|MS_NODEV. msize=512000 is the largest
// message the 6.1 kernel's virtio transport takes ((VIRTQUEUE_NUM-3)
// pages; a larger msize is cut to it, measured). cache=mmap is cache=none
// (every read and write goes to the host: coherent with other writers of
// the same Lustre/GPFS files, measured as fast) except that a shared
// writable mapping works (SQLite's WAL index, LMDB, numpy.memmap), which
// cache=none refuses with EINVAL. Not cache=loose: its writes went back
// page by page, 6-21x slower in test/bench's BenchmarkShares (fs/doc.go).
const NinePOptions = "trans=virtio,version=9p2000.L,msize=512000,cache=mmap"

// NinePOptionsReadOnly is the mount data of a read-only host share and of
// the GPU driver's share (flags MS_RDONLY|MS_NOSUID|MS_NODEV; the host
// enforces read-only with fsdev readonly=on whatever the guest mounts).
// cache=loose keeps data, attributes and names in the guest's caches
// without asking the host again: 1.4-4.5x the small-file rate of
// cache=none cold, 2.7-7.5x warm, 14-50x for a second stat walk, in
// BenchmarkShares (fs/doc.go); it streams 2.6-7.6x slower under TCG,
// which emulates the guest's copy out of its page cache. The
// guest may therefore see a file changed on the host after it read it as
// it was (until the step ends): the kernel's "intended for exclusive,
// read-only mounts" (Documentation/filesystems/9p.rst), right for datasets
// read during a step, wrong for a tree another node writes meanwhile (mount
// that rw, which is coherent). No cache mode lets a write through: QEMU
// refuses every modifying request of a readonly=on share.
const NinePOptionsReadOnly = "trans=virtio,version=9p2000.L,msize=512000,cache=loose"
