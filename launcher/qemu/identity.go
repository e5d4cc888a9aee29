package qemu

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
)

// ErrSharesNeedJobIdentity: a sandbox with host shares whose VMM would not
// run as the job's user. The 9p server (security_model=none) applies the
// guest's chown, chmod (setuid bits) and mknod with QEMU's own
// credentials, so a root QEMU would turn a guest root into a host root on
// every share, and read past every permission on read-only ones.
var ErrSharesNeedJobIdentity = errors.New("host shares need QEMU to run as the job's user")

// vmmIdentity is who the VMM runs as.
type vmmIdentity struct {
	// cred is what QEMU is executed with; nil keeps the caller's.
	cred *syscall.Credential
	uid  uint32
	gid  uint32
	// groups are the supplementary groups QEMU runs with.
	groups []uint32
	// asJob: QEMU's file access is exactly the job's (the identity the
	// mount check opened the shares with), so shares are safe.
	asJob bool
	// why explains !asJob.
	why string
	// extraGroup is a group added for /dev/kvm alone (-1: none).
	extraGroup int64
}

func (id vmmIdentity) String() string {
	g := make([]string, len(id.groups))
	for i, x := range id.groups {
		g[i] = strconv.FormatUint(uint64(x), 10)
	}
	s := fmt.Sprintf("uid %d gid %d groups [%s]", id.uid, id.gid, strings.Join(g, ","))
	if id.extraGroup >= 0 {
		s += fmt.Sprintf(" (gid %d of /dev/kvm added)", id.extraGroup)
	}
	return s
}

// kvmDevice is the KVM device QEMU 7.2 opens by name (accel/kvm
// kvm_init); it has no option to take a descriptor instead.
const kvmDevice = "/dev/kvm"

// identity decides the VMM's identity for cfg.
//
// A root caller with RunAs executes QEMU with the job's numeric uid, gid
// and supplementary groups (cfg.UID, cfg.GID, cfg.Groups: what Slurm gave
// the step and the mount check used), set by the kernel before QEMU's
// first instruction. Not QEMU's -runas: it takes the passwd entry's
// primary group and initgroups(), which differ from a job's --gid or
// Slurm's group list, and it needs set*id calls under the seccomp filter.
// The one addition: under KVM, when that identity cannot open /dev/kvm
// read-write by its mode, QEMU also gets /dev/kvm's group (as libvirt runs
// QEMU in the kvm group).
//
// A non-root caller (`slurm-microvm run` by a user) runs QEMU as itself;
// that is the job's identity when cfg names the caller. A root caller
// without RunAs runs QEMU as root: the job's identity only for a root job.
func (d *Driver) identity(cfg driver.SandboxConfig) (vmmIdentity, error) {
	groups := slices.Clone(cfg.Groups)
	if len(groups) == 0 {
		groups = []uint32{cfg.GID}
	}
	id := vmmIdentity{extraGroup: -1}
	switch {
	case os.Geteuid() == 0 && d.o.RunAs:
		id.uid, id.gid, id.groups, id.asJob = cfg.UID, cfg.GID, groups, true
		if d.o.Accel == "kvm" {
			if g, need := kvmGroup(kvmDevice, cfg.UID, cfg.GID, groups); need {
				id.groups = append(slices.Clone(groups), g)
				id.extraGroup = int64(g)
			}
		}
		id.cred = &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}
	case os.Geteuid() == 0:
		id.uid, id.gid, id.groups = 0, uint32(os.Getgid()), callerGroups()
		id.asJob = cfg.UID == 0
		id.why = fmt.Sprintf("qemu.runas = false keeps QEMU as root for a job of uid %d", cfg.UID)
	default:
		id.uid, id.gid, id.groups = uint32(os.Geteuid()), uint32(os.Getegid()), callerGroups()
		id.asJob = id.uid == cfg.UID && id.gid == cfg.GID && sameSet(id.groups, groups, id.gid)
		id.why = fmt.Sprintf("QEMU would run as the caller (uid %d gid %d), not as the job's uid %d gid %d with its groups", id.uid, id.gid, cfg.UID, cfg.GID)
	}
	return id, nil
}

func callerGroups() []uint32 {
	gs, _ := unix.Getgroups()
	out := make([]uint32, 0, len(gs))
	for _, g := range gs {
		out = append(out, uint32(g))
	}
	return out
}

// sameSet compares two group lists as sets, the primary gid counting as a
// member of both (getgroups may or may not list it).
func sameSet(a, b []uint32, primary uint32) bool {
	set := func(l []uint32) map[uint32]bool {
		m := map[uint32]bool{primary: true}
		for _, g := range l {
			m[g] = true
		}
		return m
	}
	sa, sb := set(a), set(b)
	if len(sa) != len(sb) {
		return false
	}
	for g := range sa {
		if !sb[g] {
			return false
		}
	}
	return true
}

// kvmGroup returns the group of dev and true when uid/gid/groups cannot
// open it read-write by its mode bits (ACLs are not consulted: they can
// only allow more, and an unneeded group costs nothing but the addition).
func kvmGroup(dev string, uid, gid uint32, groups []uint32) (uint32, bool) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return 0, false // QEMU reports the missing device itself
	}
	const rw = 0o6
	switch {
	case st.Uid == uid:
		if st.Mode>>6&rw == rw {
			return 0, false
		}
	case st.Gid == gid || slices.Contains(groups, st.Gid):
		if st.Mode>>3&rw == rw {
			return 0, false
		}
	case st.Mode&rw == rw:
		return 0, false
	}
	if st.Mode>>3&rw != rw {
		return 0, false // the group would not help either
	}
	return st.Gid, true
}

// giveDevices hands device files that QEMU opens by name (VFIO group
// files, /dev/vfio/<group>: QEMU 7.2's vfio-pci takes no descriptor) to
// the VMM's uid, mode 0600, as libvirt does; the returned function gives
// them back to root (0600), and is called once the VMM is gone. Stop from
// a fresh process does the same through the GPU release (ReleaseDevices).
func giveDevices(files []string, id vmmIdentity) (func(), error) {
	if id.cred == nil || len(files) == 0 {
		return func() {}, nil
	}
	var given []string
	restore := func() { _ = ReleaseDevices(given) }
	for _, f := range files {
		if err := chownDevice(f, int(id.uid), int(id.gid)); err != nil {
			restore()
			return nil, fmt.Errorf("give %s to the VMM's uid %d: %w", f, id.uid, err)
		}
		given = append(given, f)
	}
	return restore, nil
}

// ReleaseDevices gives device files back to root, mode 0600. Files that no
// longer exist (a VFIO group gone with its driver) are not an error.
func ReleaseDevices(files []string) error {
	var errs []error
	for _, f := range files {
		if err := chownDevice(f, 0, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("give %s back to root: %w", f, err))
		}
	}
	return errors.Join(errs...)
}

// chownDevice changes owner and mode of the device node path without
// following a symlink, refusing anything but a character device.
func chownDevice(path string, uid, gid int) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return fmt.Errorf("%s is not a character device", path)
	}
	p := fmt.Sprintf("/proc/self/fd/%d", fd)
	if err := unix.Fchownat(unix.AT_FDCWD, p, uid, gid, 0); err != nil {
		return &os.PathError{Op: "chown", Path: path, Err: err}
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, p, 0o600, 0); err != nil {
		return &os.PathError{Op: "chmod", Path: path, Err: err}
	}
	return nil
}
