package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Cred is the identity a path is opened with: the job user's uid, primary
// gid and supplementary groups (as Slurm gives them).
type Cred struct {
	UID    uint32
	GID    uint32
	Groups []uint32
}

// asUser runs fn on a locked OS thread whose filesystem credentials are c:
// setgroups(c.Groups), setfsgid(c.GID), setfsuid(c.UID) as raw syscalls,
// which change only the calling thread (Linux keeps credentials per task;
// Go's syscall.Setgroups/Setuid apply to every thread of the process and
// must not be used). The kernel then checks every path lookup and open of
// fn as it would for the user: mode bits, ACLs, groups, on every component.
// Setting fsuid to non-zero also clears the file capabilities
// (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, ...) of the thread,
// so root's overrides do not apply (capabilities(7)).
//
// The credentials are restored before the thread is unlocked; if restoring
// fails the goroutine exits still locked, which makes the Go runtime
// terminate the thread instead of reusing it. Threads the runtime starts
// while the thread is locked come from its template thread, never from this
// one, so the user's credentials cannot spread.
//
// When the process is not root, fn runs directly if c is the process's
// own uid (a user running `slurm-microvm validate`) and it is an error
// otherwise.
//
// ctx bounds the wait (a hard NFS mount can block an open forever): on
// expiry asUser returns ctx.Err() and abandon runs after fn returns, to
// release what fn acquired.
func asUser(ctx context.Context, c Cred, fn func() error, abandon func()) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	euid := uint32(os.Geteuid())
	if euid != 0 || c.UID == 0 {
		if euid != c.UID {
			return fmt.Errorf("open files as uid %d: this process (uid %d) is not root", c.UID, euid)
		}
		return fn()
	}
	var mu sync.Mutex
	gaveUp := false
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err, restored := withThreadCred(c, fn)
		mu.Lock()
		if gaveUp {
			if abandon != nil {
				abandon()
			}
		} else {
			done <- err
		}
		mu.Unlock()
		if restored {
			runtime.UnlockOSThread()
		}
		// Not restored: the goroutine ends locked; the runtime kills the thread.
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		select {
		case err := <-done:
			return err
		default:
			gaveUp = true
			return ctx.Err()
		}
	}
}

// withThreadCred switches the calling (locked) thread to c, runs fn and
// switches back. restored is false when the thread's credentials could not
// be restored (the caller must not unlock the thread then).
func withThreadCred(c Cred, fn func() error) (err error, restored bool) {
	origGroups, err := getgroups()
	if err != nil {
		return fmt.Errorf("getgroups: %w", err), true
	}
	origFSUID, origFSGID := setfsuid(^uint32(0)), setfsgid(^uint32(0)) // -1: query only
	restore := func() bool {
		setfsuid(origFSUID)
		setfsgid(origFSGID)
		gerr := setgroups(origGroups)
		return gerr == nil && setfsuid(^uint32(0)) == origFSUID && setfsgid(^uint32(0)) == origFSGID
	}
	if err := setgroups(c.Groups); err != nil {
		return fmt.Errorf("setgroups %v: %w", c.Groups, err), restore()
	}
	setfsgid(c.GID)
	if got := setfsgid(^uint32(0)); got != c.GID {
		return fmt.Errorf("setfsgid %d: still %d", c.GID, got), restore()
	}
	setfsuid(c.UID)
	if got := setfsuid(^uint32(0)); got != c.UID {
		return fmt.Errorf("setfsuid %d: still %d", c.UID, got), restore()
	}
	err = fn()
	return err, restore()
}

// setfsuid sets the thread's fsuid and returns the previous one; an invalid
// id (^0) changes nothing and so queries it (setfsuid(2)).
func setfsuid(uid uint32) uint32 {
	r, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(uid), 0, 0)
	return uint32(r)
}

func setfsgid(gid uint32) uint32 {
	r, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(gid), 0, 0)
	return uint32(r)
}

// setgroups sets the calling thread's supplementary groups only (the raw
// system call; glibc and Go broadcast it to every thread).
func setgroups(gids []uint32) error {
	var p unsafe.Pointer
	if len(gids) > 0 {
		p = unsafe.Pointer(&gids[0])
	}
	_, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gids)), uintptr(p), 0)
	if e != 0 {
		return e
	}
	return nil
}

func getgroups() ([]uint32, error) {
	n, _, e := unix.RawSyscall(unix.SYS_GETGROUPS, 0, 0, 0)
	if e != 0 {
		return nil, e
	}
	if n == 0 {
		return nil, nil
	}
	g := make([]uint32, n)
	n, _, e = unix.RawSyscall(unix.SYS_GETGROUPS, n, uintptr(unsafe.Pointer(&g[0])), 0)
	if e != 0 {
		return nil, e
	}
	return g[:n], nil
}

// threadCred returns the calling thread's fsuid, fsgid and groups (for
// tests).
func threadCred() (uint32, uint32, []uint32) {
	g, _ := getgroups()
	return setfsuid(^uint32(0)), setfsgid(^uint32(0)), g
}

// openFollow opens p (absolute) as O_PATH, following symlinks and ".." the
// way the kernel does but refusing magic links (/proc/PID/fd/N,
// /proc/PID/root), with openat2(RESOLVE_NO_MAGICLINKS); on kernels before
// 5.6 with open(O_PATH) (the object is checked afterwards anyway).
func openFollow(p string) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOSYS) {
		fd, err = unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
	}
	return fd, err
}

// openBeneath opens rel below the directory dirfd, refusing any symlink,
// magic link or ".." that would leave it: openat2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS, or, before
// Linux 5.6, one openat(O_NOFOLLOW) per component. rel is a clean relative
// path without ".." ("." for dirfd itself). Mount points below dirfd are
// crossed (a Lustre tree may hold submounts).
func openBeneath(dirfd int, rel string, flags int) (int, error) {
	fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if !errors.Is(err, unix.ENOSYS) {
		return fd, err
	}
	parts := strings.Split(rel, "/")
	cur, err := unix.Openat(dirfd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for i, c := range parts {
		if c == ".." || c == "" {
			unix.Close(cur)
			return -1, unix.EXDEV
		}
		fl := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i == len(parts)-1 {
			fl = flags | unix.O_NOFOLLOW | unix.O_CLOEXEC
		}
		next, err := unix.Openat(cur, c, fl, 0)
		unix.Close(cur)
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return -1, unix.ELOOP // a symlink where a directory was expected
			}
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// fdPath returns the path the kernel reports for fd (readlink of
// /proc/self/fd/N): where the opened object is, with every symlink and ".."
// resolved.
func fdPath(fd int) (string, error) {
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(p, "/") || strings.HasSuffix(p, " (deleted)") {
		return "", fmt.Errorf("opened object has no path (%q): deleted, or outside this mount namespace", p)
	}
	return p, nil
}

func sameObject(a, b int) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Fstat(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Fstat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

// OpenAs opens path with c's credentials (see asUser), following symlinks
// and ".." as the kernel does but no magic links, and returns an O_PATH
// descriptor of the object and its resolved path (no symlinks, no "..").
// Permission to search every directory on the way is the user's; the object
// itself is not read (O_PATH): use OpenDirAs to share a directory.
func OpenAs(ctx context.Context, c Cred, path string) (*os.File, string, error) {
	if !strings.HasPrefix(path, "/") {
		return nil, "", fmt.Errorf("open %q as uid %d: not an absolute path", path, c.UID)
	}
	fd := -1
	err := asUser(ctx, c, func() (err error) {
		fd, err = openFollow(path)
		return err
	}, func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	})
	if err != nil {
		return nil, "", &os.PathError{Op: fmt.Sprintf("open as uid %d", c.UID), Path: path, Err: err}
	}
	real, err := fdPath(fd)
	if err != nil {
		unix.Close(fd)
		return nil, "", &os.PathError{Op: "resolve", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), real), real, nil
}

// OpenDirAs opens the directory path for sharing with c's credentials and
// returns it open O_RDONLY|O_DIRECTORY, with its resolved path.
//
// When trees is not nil, the resolved path must lie inside one of them
// (compared by path components, trees given as resolved paths, e.g. from
// OpenAs) and the returned descriptor is re-opened below that tree
// (openBeneath: no symlink, magic link or ".."), and must be the object the
// first, symlink-following open found (same device and inode): a symlink
// pointing out of the trees, or one swapped while opening, is refused with
// ErrNotAllowed. The tree it was found in is returned.
//
// The final open, as the user, needs read and search permission on the
// directory itself, which O_PATH would not: a directory only root can read
// is refused with ErrPermission even though root (QEMU at start-up) could
// open it.
func OpenDirAs(ctx context.Context, c Cred, path string, trees []string) (f *os.File, real, tree string, err error) {
	first, real, err := OpenAs(ctx, c, path)
	if err != nil {
		return nil, "", "", classify(err)
	}
	defer first.Close()
	if trees != nil {
		for _, t := range trees {
			if underOrAt(real, t) && len(t) > len(tree) {
				tree = t
			}
		}
		if tree == "" {
			return nil, real, "", fmt.Errorf("%s resolves to %s: %w", path, real, ErrNotAllowed)
		}
	} else {
		tree = "/"
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(real, tree), "/")
	if rel == "" {
		rel = "."
	}
	fd := -1
	err = asUser(ctx, c, func() error {
		root, err := unix.Open(tree, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			return fmt.Errorf("open tree %s: %w", tree, err)
		}
		defer unix.Close(root)
		p, err := openBeneath(root, rel, unix.O_PATH)
		if err != nil {
			return fmt.Errorf("open %s below %s: %w", rel, tree, err)
		}
		defer unix.Close(p)
		if same, err := sameObject(p, int(first.Fd())); err != nil || !same {
			return fmt.Errorf("%s changed while it was opened (a symlink was swapped?): %w", path, ErrNotAllowed)
		}
		// "." is looked up in p: search permission, then read permission
		// for the open.
		fd, err = unix.Openat(p, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	}, func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	})
	if err != nil {
		return nil, real, tree, classify(err)
	}
	return os.NewFile(uintptr(fd), real), real, tree, nil
}

// CheckWritableAs reports whether c may create entries in the directory f
// (faccessat2 W_OK|X_OK with the thread's fs credentials, AT_EACCESS). A
// kernel without faccessat2 (before 5.8) gives nil: the file server
// enforces write permission anyway.
func CheckWritableAs(ctx context.Context, c Cred, f *os.File) error {
	return asUser(ctx, c, func() error {
		err := unix.Faccessat2(int(f.Fd()), "", unix.W_OK|unix.X_OK, unix.AT_EACCESS|unix.AT_EMPTY_PATH)
		if errors.Is(err, unix.ENOSYS) {
			return nil
		}
		return err
	}, nil)
}

// classify maps system errors onto the package's error classes, keeping
// the original for errors.Is.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENOENT):
		return errors.Join(ErrNotFound, err)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return errors.Join(ErrPermission, err)
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ELOOP):
		return errors.Join(ErrNotAllowed, err)
	}
	return err
}
