package mpi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/image"
)

// DiskAccess says how an erofs disk is read.
type DiskAccess int

// Ways to read a disk.
const (
	// DiskAuto mounts when running as root, extracts otherwise.
	DiskAuto DiskAccess = iota
	// DiskMount loop-mounts the disk read-only (root only): instant, reads
	// only what the check touches.
	DiskMount
	// DiskExtract unpacks the whole disk with fsck.erofs --extract
	// (erofs-utils >= 1.5): any user, costs a copy of the image.
	DiskExtract
)

// OpenDisk makes the erofs disk readable as a directory and returns it with
// a function that undoes it (unmount and remove, or remove the copy). The
// mount is read-only, nosuid, nodev and noexec; the disk was built by
// launcher/image from a tree it unpacked itself, so the host kernel parses
// a filesystem made by mkfs.erofs, not one supplied by the user.
func OpenDisk(ctx context.Context, disk string, how DiskAccess) (string, func() error, error) {
	if how == DiskAuto {
		how = DiskExtract
		if os.Geteuid() == 0 {
			how = DiskMount
		}
	}
	dir, err := os.MkdirTemp("", "slurm-microvm-mpi-")
	if err != nil {
		return "", nil, fmt.Errorf("open disk %s: %w", disk, err)
	}
	switch how {
	case DiskMount:
		out, err := exec.CommandContext(ctx, "mount", "-t", "erofs", "-o", "ro,loop,nosuid,nodev,noexec", disk, dir).CombinedOutput()
		if err != nil {
			os.Remove(dir)
			return "", nil, fmt.Errorf("mount %s on %s: %v: %s", disk, dir, err, strings.TrimSpace(string(out)))
		}
		return dir, func() error { return unmount(dir) }, nil
	case DiskExtract:
		root := filepath.Join(dir, "root")
		out, err := exec.CommandContext(ctx, "fsck.erofs", "--extract="+root, disk).CombinedOutput()
		if err != nil {
			os.RemoveAll(dir)
			return "", nil, fmt.Errorf("fsck.erofs --extract=%s %s: %v: %s", root, disk, err, strings.TrimSpace(string(out)))
		}
		return root, func() error { return removeAllWritable(dir) }, nil
	}
	os.Remove(dir)
	return "", nil, fmt.Errorf("open disk %s: unknown access mode %d", disk, how)
}

// unmount detaches the mount at dir (retrying briefly while busy, then
// lazily) and removes the directory.
func unmount(dir string) error {
	var err error
	for i := 0; i < 10; i++ {
		if err = unix.Unmount(dir, 0); err == nil || errors.Is(err, unix.EINVAL) {
			break
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) {
		if derr := unix.Unmount(dir, unix.MNT_DETACH); derr != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
	}
	if err := os.Remove(dir); err != nil {
		return fmt.Errorf("remove mount point %s: %w", dir, err)
	}
	return nil
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
	return os.RemoveAll(dir)
}

// ImageCheckOptions tune CheckImage.
type ImageCheckOptions struct {
	CheckOptions
	// HostRoot is the host's root ("/" when empty).
	HostRoot string
	// Image says whose image it is and where it is cached (image.Prepare).
	Image image.Options
	// Access says how the prepared disk is read (DiskAuto).
	Access DiskAccess
}

// CheckImage prepares image reference ref with launcher/image (converting it
// on first use, as a step would), opens its disk and runs Check against
// the host. Report.Image is set to ref.
func CheckImage(ctx context.Context, ref string, o ImageCheckOptions) (*Report, error) {
	img, err := image.Prepare(ctx, ref, o.Image)
	if err != nil {
		return nil, err
	}
	root, done, err := OpenDisk(ctx, img.Disk, o.Access)
	if err != nil {
		return nil, err
	}
	defer func() { _ = done() }()
	host := o.HostRoot
	if host == "" {
		host = "/"
	}
	rep, err := Check(ctx, host, root, o.CheckOptions)
	if err != nil {
		return nil, err
	}
	rep.Image = ref
	return rep, nil
}
