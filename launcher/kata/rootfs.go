package kata

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata/oci"
)

// guestInitDir is where the container sees the init binary's directory.
const guestInitDir = "/.slurm-microvm"

// tree is the host side of one sandbox's filesystem, under dir:
// lower (the erofs image, read-only), rw (tmpfs: upper and work of the
// overlay), rootfs (the overlay: the bundle's rootfs), shares/<i> (the
// shares' binds) and init (the init binary's bind).
type tree struct {
	dir, rootfs string
	// mounts are the mount points made, in order (unmount in reverse).
	mounts []string
}

// mountTree mounts the step's filesystem under dir and returns the
// spec's mounts for the shares and the init binary. It runs in the mount
// namespace the shim will inherit (shim mode) or on the host (containerd
// mode, where Cleanup unmounts t.mounts). On error what was mounted stays
// listed in t.mounts.
func mountTree(t *tree, rootfs string, fs driver.RootFS, shares []shareTree, initBin string) ([]oci.Mount, error) {
	t.rootfs = rootfs
	for _, d := range []string{"lower", "rw", "shares", "init", rootfs} {
		p := d
		if !filepath.IsAbs(p) {
			p = filepath.Join(t.dir, d)
		}
		if err := os.MkdirAll(p, 0o700); err != nil {
			return nil, err
		}
	}
	lower, rw := filepath.Join(t.dir, "lower"), filepath.Join(t.dir, "rw")
	// The loop device goes with the unmount (util-linux sets autoclear).
	if out, err := exec.Command("mount", "-t", "erofs", "-o", "ro,loop,nodev,nosuid", fs.Image, lower).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mount the image %s read-only: %v: %s", fs.Image, err, out)
	}
	t.mounts = append(t.mounts, lower)
	size := fs.OverlayMiB
	if size == 0 {
		size = 1024
	}
	if err := unix.Mount("tmpfs", rw, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID, "mode=0755,size="+strconv.FormatUint(size, 10)+"m"); err != nil {
		return nil, fmt.Errorf("mount the writable layer (tmpfs of %d MiB): %w", size, err)
	}
	t.mounts = append(t.mounts, rw)
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(rw, d), 0o755); err != nil {
			return nil, err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, filepath.Join(rw, "upper"), filepath.Join(rw, "work"))
	if err := unix.Mount("overlay", rootfs, "overlay", unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return nil, fmt.Errorf("mount the root filesystem overlay: %w", err)
	}
	t.mounts = append(t.mounts, rootfs)
	var out []oci.Mount
	for i, sh := range shares {
		target := filepath.Join(t.dir, "shares", strconv.Itoa(i))
		if err := os.Mkdir(target, 0o700); err != nil {
			return nil, err
		}
		if err := unix.MoveMount(sh.fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return nil, fmt.Errorf("attach the share for %s: %w", sh.Destination, err)
		}
		t.mounts = append(t.mounts, target)
		out = append(out, oci.Mount{Source: target, Destination: sh.Destination, ReadOnly: sh.ReadOnly})
	}
	initDir := filepath.Join(t.dir, "init")
	// The container's init runs as the job's user: it must search it.
	if err := os.Chmod(initDir, 0o755); err != nil {
		return nil, err
	}
	initFile := filepath.Join(initDir, "init")
	if err := os.WriteFile(initFile, nil, 0o755); err != nil {
		return nil, err
	}
	if err := unix.Mount(initBin, initFile, "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("bind the init binary %s: %w", initBin, err)
	}
	t.mounts = append(t.mounts, initFile)
	if err := unix.Mount("", initFile, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return nil, fmt.Errorf("make the init binary read-only: %w", err)
	}
	out = append(out, oci.Mount{Source: initDir, Destination: guestInitDir, ReadOnly: true})
	return out, nil
}

// shareTree is one share as a detached mount (open_tree(2) clone of the
// directory the launcher opened with the user's credentials, never its
// name again), read-only, nosuid and nodev as its flags say, to be
// attached (move_mount(2)) in the shim's mount namespace, where a bind of
// the descriptor would fail: its mount is the host namespace's.
type shareTree struct {
	fd          int
	Destination string
	ReadOnly    bool
}

// cloneShares makes the detached mounts of shares in this thread's (the
// host's) mount namespace. Close the result with closeShares.
func cloneShares(shares []driver.Share) ([]shareTree, error) {
	var out []shareTree
	for _, sh := range shares {
		fd, err := unix.OpenTree(int(sh.Dir.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
		if err != nil {
			closeShares(out)
			return nil, fmt.Errorf("clone the share for %s: %w", sh.Destination, err)
		}
		attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
		if sh.ReadOnly {
			attr |= unix.MOUNT_ATTR_RDONLY
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: attr}); err != nil {
			unix.Close(fd)
			closeShares(out)
			return nil, fmt.Errorf("make the share for %s read-only on the host: %w", sh.Destination, err)
		}
		out = append(out, shareTree{fd: fd, Destination: sh.Destination, ReadOnly: sh.ReadOnly})
	}
	return out, nil
}

func closeShares(s []shareTree) {
	for _, sh := range s {
		unix.Close(sh.fd)
	}
}

// unmountAll unmounts mounts in reverse order (detached: a mount still
// busy goes once its last user does). Not mounted is not an error.
func unmountAll(mounts []string) error {
	var errs []error
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mounts[i], err))
		}
	}
	return errors.Join(errs...)
}

// inPrivateMountNS runs fn on an OS thread of its own in a new mount
// namespace (unshare(CLONE_NEWNS), every mount made private): mounts fn
// makes are seen only by that thread and by the processes it starts (the
// shim, which inherits the namespace; the namespace ends with the last of
// them). The thread is never given back to the Go scheduler: it ends with
// the goroutine.
func inPrivateMountNS(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread's namespace is not the process's.
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("new mount namespace: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			errc <- fmt.Errorf("make the mount namespace private: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
