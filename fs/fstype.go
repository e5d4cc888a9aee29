package fs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// FSInfo is the filesystem a path or an opened file lives on, from
// /proc/self/mountinfo.
type FSInfo struct {
	// Type is the mountinfo fstype: "lustre", "gpfs", "nfs4", "ext4",
	// "fuse.sshfs", ...
	Type string
	// Kind is the family: "lustre", "gpfs", "nfs", "nfs4", "beegfs",
	// "cephfs", "cifs", "glusterfs", "weka", "orangefs", "afs", "dvs",
	// "panfs", "fuse" (other FUSE), "local" or "pseudo" (proc, sysfs, ...).
	Kind string
	// Network is true for parallel and network filesystems (and FUSE,
	// which usually is one): shared with the guest directly, never used as
	// an overlay layer or image store.
	Network bool
	// Mountpoint and Source of the mount holding the path.
	Mountpoint string
	Source     string
	// MountID is mountinfo's mount id.
	MountID int
}

// kinds maps mountinfo fstypes to their family and whether they are
// network/parallel filesystems. Types not listed are local, except
// "fuse.*" (network unless listed) and "fuseblk" (local block FUSE: ntfs-3g).
var kinds = map[string]struct {
	kind    string
	network bool
}{
	"lustre": {"lustre", true}, "gpfs": {"gpfs", true}, "nfs": {"nfs", true}, "nfs4": {"nfs4", true},
	"beegfs": {"beegfs", true}, "ceph": {"cephfs", true}, "fuse.ceph-fuse": {"cephfs", true}, "fuse.ceph": {"cephfs", true},
	"cifs": {"cifs", true}, "smb3": {"cifs", true}, "smbfs": {"cifs", true},
	"glusterfs": {"glusterfs", true}, "fuse.glusterfs": {"glusterfs", true},
	"wekafs": {"weka", true}, "pvfs2": {"orangefs", true}, "orangefs": {"orangefs", true},
	"afs": {"afs", true}, "openafs": {"afs", true}, "dvs": {"dvs", true}, "panfs": {"panfs", true},
	"fuse.quobyte": {"quobyte", true}, "fuse.sshfs": {"sshfs", true}, "fuse.s3fs": {"s3fs", true},
	"9p": {"9p", true}, "virtiofs": {"virtiofs", true}, "davfs": {"davfs", true}, "ocfs2": {"ocfs2", true}, "gfs2": {"gfs2", true},
	"proc": {"pseudo", false}, "sysfs": {"pseudo", false}, "cgroup": {"pseudo", false}, "cgroup2": {"pseudo", false},
	"devtmpfs": {"pseudo", false}, "devpts": {"pseudo", false}, "securityfs": {"pseudo", false}, "debugfs": {"pseudo", false},
	"tracefs": {"pseudo", false}, "mqueue": {"pseudo", false}, "bpf": {"pseudo", false}, "configfs": {"pseudo", false},
	"fusectl": {"pseudo", false}, "hugetlbfs": {"pseudo", false}, "binfmt_misc": {"pseudo", false}, "pstore": {"pseudo", false},
	"fuseblk": {"local", false},
}

// KindOf returns the family of a mountinfo fstype and whether it is a
// network or parallel filesystem.
func KindOf(fstype string) (kind string, network bool) {
	if k, ok := kinds[fstype]; ok {
		return k.kind, k.network
	}
	if fstype == "fuse" || strings.HasPrefix(fstype, "fuse.") {
		return "fuse", true
	}
	return "local", false
}

// IsNetworkFS reports whether fstype (as in mountinfo) is a parallel or
// network filesystem (Lustre, GPFS, NFS, BeeGFS, CephFS, ...).
func IsNetworkFS(fstype string) bool {
	_, n := KindOf(fstype)
	return n
}

func infoOf(m *mountinfo.Info) FSInfo {
	k, n := KindOf(m.FSType)
	return FSInfo{Type: m.FSType, Kind: k, Network: n, Mountpoint: m.Mountpoint, Source: m.Source, MountID: m.ID}
}

// ClassifyPath returns the filesystem of the clean absolute path p among
// mounts (as read from a mountinfo file): the mount with the deepest
// mountpoint holding p, by path components; of several mounts on one
// mountpoint the last listed (the one on top). It resolves nothing: give it
// a resolved path (OpenAs, OpenDirAs), or use ClassifyFile.
func ClassifyPath(mounts []*mountinfo.Info, p string) (FSInfo, error) {
	var best *mountinfo.Info
	for _, m := range mounts {
		if !underOrAt(p, m.Mountpoint) {
			continue
		}
		if best == nil || len(m.Mountpoint) >= len(best.Mountpoint) {
			best = m
		}
	}
	if best == nil {
		return FSInfo{}, fmt.Errorf("no mount holds %s", p)
	}
	return infoOf(best), nil
}

// ClassifyFile returns the filesystem of an open file: the mount whose id
// the kernel reports in /proc/self/fdinfo (exact, even for paths that are
// hidden or renamed), falling back to ClassifyPath of the file's path.
func ClassifyFile(f *os.File) (FSInfo, error) {
	id, err := fdMountID(int(f.Fd()))
	if err == nil {
		ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) { return m.ID != id, m.ID == id })
		if err == nil && len(ms) == 1 {
			return infoOf(ms[0]), nil
		}
	}
	p, err := fdPath(int(f.Fd()))
	if err != nil {
		return FSInfo{}, fmt.Errorf("filesystem of %s: %w", f.Name(), err)
	}
	ms, err := mountinfo.GetMounts(nil)
	if err != nil {
		return FSInfo{}, fmt.Errorf("filesystem of %s: %w", p, err)
	}
	return ClassifyPath(ms, p)
}

// fdMountID reads "mnt_id:" from /proc/self/fdinfo/FD (Linux 3.15+).
func fdMountID(fd int) (int, error) {
	fi, err := os.Open("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return 0, err
	}
	defer fi.Close()
	sc := bufio.NewScanner(fi)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "mnt_id:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no mnt_id in fdinfo")
}

// CheckLocalStore returns an error when dir (or, if it does not exist yet,
// its nearest existing parent) is on a network or parallel filesystem: the
// image cache, converted erofs images and overlay layers must be local
// (a Lustre or NFS cache would be shared by nodes that lock and rename in
// it, and every guest block read would cross the network twice). For the
// launcher's cache_dir check; key names the setting in the error.
func CheckLocalStore(key, dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%s %q: not an absolute path", key, dir)
	}
	p := filepath.Clean(dir)
	for {
		f, err := os.OpenFile(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err == nil {
			info, err := ClassifyFile(f)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s %q: %w", key, dir, err)
			}
			if info.Network {
				return fmt.Errorf("%s %q is on %s (%s mounted at %s): images and overlay layers must be on a local filesystem; shared filesystems are mounted into guests directly",
					key, dir, info.Type, info.Source, info.Mountpoint)
			}
			return nil
		}
		if !errors.Is(err, os.ErrNotExist) || p == "/" {
			return fmt.Errorf("%s %q: %w", key, dir, err)
		}
		p = filepath.Dir(p)
	}
}
