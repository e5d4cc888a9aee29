package guest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/fs"
	"github.com/slurm-microvm/slurm-microvm/fs/guestpath"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
)

// Guest paths of the root filesystem layers.
const (
	lowerDir = "/run/microvm/lower" // the image, erofs, read-only
	rwDir    = "/run/microvm/rw"    // tmpfs holding upper/ and work/
	rootDir  = "/run/microvm/root"  // overlay: what processes see as /
)

// MountRoot mounts the image named by req read-only with a writable tmpfs
// overlay of req.OverlayMib MiB, plus /proc, /sys, /dev, /dev/pts and
// /dev/shm inside it, sets the hostname, and returns the root directory. The
// overlay is discarded with the guest. With req.Network it then configures
// the guest's interface and writes /etc/hosts (and /etc/resolv.conf when
// name servers are given) in the overlay; every field of it is checked
// before anything is mounted. It is the Options.Setup of the real agent.
func MountRoot(ctx context.Context, req *api.SetupRequest) (string, error) {
	var netc *netConfig
	if req.Network != nil {
		var err error
		if netc, err = parseNetwork(req.Network); err != nil {
			return "", fmt.Errorf("network set-up refused: %w", err)
		}
	}
	fstype := req.RootFstype
	if fstype == "" {
		fstype = "erofs"
	}
	if req.RootDevice == "" {
		return "", fmt.Errorf("no root device given")
	}
	for _, d := range []string{lowerDir, rwDir, rootDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	if err := unix.Mount(req.RootDevice, lowerDir, fstype, unix.MS_RDONLY|unix.MS_NODEV, ""); err != nil {
		return "", fmt.Errorf("mount image %s (%s) on %s: %w", req.RootDevice, fstype, lowerDir, err)
	}
	size := req.OverlayMib
	if size == 0 {
		size = 1024
	}
	if err := unix.Mount("tmpfs", rwDir, "tmpfs", 0, fmt.Sprintf("size=%dm,mode=0755", size)); err != nil {
		return "", fmt.Errorf("mount overlay tmpfs (%d MiB): %w", size, err)
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(rwDir, d), 0o755); err != nil {
			return "", err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lowerDir, rwDir, rwDir)
	if err := unix.Mount("overlay", rootDir, "overlay", 0, opts); err != nil {
		return "", fmt.Errorf("mount overlay root: %w", err)
	}
	type m struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}
	mounts := []m{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RDONLY, ""},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		// The agent's own devpts (mounted at boot), so a pty it allocates
		// is the one the process sees under /dev/pts.
		{"/dev/pts", "/dev/pts", "", unix.MS_BIND, ""},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	}
	for _, mt := range mounts {
		dst := filepath.Join(rootDir, mt.dst)
		if err := ownMountPoint(rootDir, mt.dst); err != nil {
			return "", err
		}
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return "", fmt.Errorf("create mount point %s: %w", mt.dst, err)
		}
		if err := unix.Mount(mt.src, dst, mt.fstype, mt.flags, mt.data); err != nil {
			return "", fmt.Errorf("mount %s on %s: %w", mt.fstype, mt.dst, err)
		}
	}
	// /dev/ptmx must be the one of that devpts instance.
	ptmx := filepath.Join(rootDir, "dev/ptmx")
	_ = os.Remove(ptmx)
	if err := os.Symlink("pts/ptmx", ptmx); err != nil {
		return "", fmt.Errorf("link /dev/ptmx: %w", err)
	}
	// Go's os.Chmod takes os.ModeSticky, not the numeric 01000.
	tmp := filepath.Join(rootDir, "tmp")
	if err := ownMountPoint(rootDir, "/tmp"); err != nil {
		return "", err
	}
	if err := os.Mkdir(tmp, 0o755); err != nil && !os.IsExist(err) {
		return "", fmt.Errorf("create /tmp: %w", err)
	}
	if err := os.Chmod(tmp, os.ModeSticky|0o777); err != nil {
		return "", fmt.Errorf("chmod /tmp: %w", err)
	}
	// The driver first: a user's share over a parent of its directories
	// then hides them rather than receiving a mount point.
	if req.GpuDriver != nil {
		if err := SetupGPUDriver(ctx, rootDir, req.GpuDriver); err != nil {
			return "", err
		}
	}
	if len(req.Mounts) > 0 {
		if err := mountShares(ctx, req.Mounts); err != nil {
			return "", err
		}
	}
	if req.Hostname != "" {
		if err := unix.Sethostname([]byte(req.Hostname)); err != nil {
			return "", fmt.Errorf("set hostname %q: %w", req.Hostname, err)
		}
	}
	if err := allowPingSockets(pingGroupRange); err != nil {
		return "", err
	}
	if netc != nil {
		// The step's /etc/hosts replaces the image's: it maps the step's
		// node names, which the image's file must not redirect.
		if err := setupNetwork(ctx, rootDir, req.Hostname, netc); err != nil {
			return "", err
		}
	} else if req.Hostname != "" {
		// MPI stacks resolve their own host name; an image's /etc/hosts
		// does not know the node's. The write lands in the overlay.
		if err := addHost(filepath.Join(rootDir, "etc/hosts"), req.Hostname); err != nil {
			return "", err
		}
	}
	return rootDir, nil
}

// mountShares mounts the host's 9p shares, parents first. The 9p modules
// are not in the boot set: they load now. Each destination is resolved
// inside the root without following the image's symlinks out of it, and
// the mount goes onto the opened directory (/proc/self/fd/N), not onto a
// path the image could redirect.
func mountShares(ctx context.Context, mounts []*api.Mount) error {
	if _, err := guestmod.Load(ctx, guestmod.Config{ShareOnly: true}); err != nil {
		return fmt.Errorf("load modules for host shares: %w", err)
	}
	for _, m := range mounts {
		dst := string(m.Destination)
		f, in, err := guestpath.Resolve(rootDir, dst, guestpath.Options{Create: true, Refuse: shareRefused})
		if err != nil {
			return fmt.Errorf("mount point %s: %w", dst, err)
		}
		flags, opts := uintptr(unix.MS_NOSUID|unix.MS_NODEV), guestpath.NinePOptions
		if m.ReadOnly {
			flags, opts = flags|unix.MS_RDONLY, guestpath.NinePOptionsReadOnly
		}
		err = unix.Mount(m.Tag, fmt.Sprintf("/proc/self/fd/%d", f.Fd()), "9p", flags, opts)
		f.Close()
		if err != nil {
			return fmt.Errorf("mount host share %s on %s (%s): %w", m.Tag, dst, in, err)
		}
	}
	return nil
}

// shareRefused are the in-root paths no host share may land on, after the
// image's symlinks: the agent's own and the GPU driver's directory (an
// image link /data -> /usr/local/nvidia/lib64 must not put a share there).
var shareRefused = append(append([]string(nil), fs.GuestReserved...), fs.GuestGPUDriver)

// ownMountPoint makes the top-level directory p (/proc, /sys, /dev, /run,
// /tmp) of root a real directory before the agent mounts on it: an image
// that ships it as a symlink (/dev -> ../../run/microvm/...) would
// otherwise send the mount, and the device nodes made in it, wherever the
// link points in the agent's own tree. The symlink is removed from the
// overlay (a whiteout in the upper layer); the image is untouched.
func ownMountPoint(root, p string) error {
	full := filepath.Join(root, p)
	fi, err := os.Lstat(full)
	switch {
	case os.IsNotExist(err):
		return nil
	case err != nil:
		return fmt.Errorf("mount point %s: %w", p, err)
	case fi.IsDir():
		return nil
	}
	if err := os.Remove(full); err != nil {
		return fmt.Errorf("mount point %s: the image has a %s there: remove it: %w", p, fi.Mode().Type(), err)
	}
	return nil
}

// addHost makes hosts (an /etc/hosts) resolve localhost and name to the
// loopback, keeping what the image has.
func addHost(hosts, name string) error {
	b, err := os.ReadFile(hosts)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read /etc/hosts: %w", err)
	}
	known := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		for i := 1; i < len(f) && !strings.HasPrefix(f[0], "#"); i++ {
			known[f[i]] = true
		}
	}
	add := ""
	if !known["localhost"] {
		add += "127.0.0.1\tlocalhost\n"
	}
	if !known[name] {
		add += "127.0.1.1\t" + name + "\n"
	}
	if add == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(hosts), 0o755); err != nil {
		return err
	}
	if len(b) > 0 && !strings.HasSuffix(string(b), "\n") {
		add = "\n" + add
	}
	if st, err := os.Lstat(hosts); err == nil && st.Mode()&os.ModeSymlink != 0 {
		// An image symlink must not redirect the write out of the root.
		if err := os.Remove(hosts); err != nil {
			return err
		}
	}
	return os.WriteFile(hosts, append(b, add...), 0o644)
}
