package fs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
)

// A node with Lustre, GPFS, NFS and BeeGFS, in /proc/self/mountinfo format.
const fakeMountinfo = `22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw
24 22 0:22 / /tmp rw,nosuid,nodev shared:6 - tmpfs tmpfs rw
30 22 0:40 / /lustre rw,relatime shared:10 - lustre 10.0.0.1@o2ib:/fs1 rw,flock,lazystatfs
31 22 0:41 / /gpfs/fs0 rw,relatime shared:11 - gpfs fs0 rw
32 22 0:42 / /home rw,relatime shared:12 - nfs4 nas:/export/home rw,vers=4.2,sec=sys
33 30 0:43 / /lustre/scratch rw,relatime shared:13 - beegfs beegfs_nodev rw,cfgFile=/etc/beegfs/beegfs-client.conf
34 22 8:16 / /lustre2 rw,relatime shared:14 - xfs /dev/sdb rw
35 22 0:44 / /mnt/remote rw,nosuid,nodev shared:15 - fuse.sshfs u@h:/ rw,user_id=0
36 22 0:45 / /apps rw,relatime shared:16 - nfs nas:/apps ro,vers=3
37 22 0:46 / /data rw shared:17 - ext4 /dev/sdc rw
38 22 0:47 / /data rw shared:18 - gpfs fs1 rw
39 22 0:48 / /mnt/ceph rw - ceph 10.0.0.2:/ rw
`

func TestClassifyPath(t *testing.T) {
	mounts, err := mountinfo.GetMountsFromReader(strings.NewReader(fakeMountinfo), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, typ, kind, mountpoint string
		network                     bool
	}{
		{"/lustre/datasets/imagenet", "lustre", "lustre", "/lustre", true},
		{"/lustre", "lustre", "lustre", "/lustre", true},
		{"/lustre2/x", "xfs", "local", "/lustre2", false}, // components, not prefixes
		{"/lustre/scratch/u", "beegfs", "beegfs", "/lustre/scratch", true},
		{"/lustre/scratch2", "lustre", "lustre", "/lustre", true},
		{"/gpfs/fs0/proj", "gpfs", "gpfs", "/gpfs/fs0", true},
		{"/gpfs/fs01", "ext4", "local", "/", false},
		{"/home/alice", "nfs4", "nfs4", "/home", true},
		{"/apps/x", "nfs", "nfs", "/apps", true},
		{"/mnt/remote/f", "fuse.sshfs", "sshfs", "/mnt/remote", true},
		{"/mnt/ceph/f", "ceph", "cephfs", "/mnt/ceph", true},
		{"/data/x", "gpfs", "gpfs", "/data", true}, // the mount on top wins
		{"/tmp/x", "tmpfs", "local", "/tmp", false},
		{"/proc/1", "proc", "pseudo", "/proc", false},
		{"/var/cache", "ext4", "local", "/", false},
	} {
		got, err := ClassifyPath(mounts, tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if got.Type != tc.typ || got.Kind != tc.kind || got.Mountpoint != tc.mountpoint || got.Network != tc.network {
			t.Errorf("ClassifyPath(%s) = %+v, want %s/%s on %s network=%v", tc.path, got, tc.typ, tc.kind, tc.mountpoint, tc.network)
		}
		if IsNetworkFS(got.Type) != tc.network {
			t.Errorf("IsNetworkFS(%s) = %v", got.Type, !tc.network)
		}
	}
}

func TestKindOf(t *testing.T) {
	for typ, want := range map[string]bool{
		"lustre": true, "gpfs": true, "nfs": true, "nfs4": true, "beegfs": true, "cifs": true,
		"fuse.glusterfs": true, "fuse.whatever": true, "wekafs": true, "dvs": true,
		"ext4": false, "xfs": false, "btrfs": false, "zfs": false, "tmpfs": false, "overlay": false, "fuseblk": false,
	} {
		if IsNetworkFS(typ) != want {
			t.Errorf("IsNetworkFS(%q) = %v", typ, !want)
		}
	}
}

func TestClassifyFileAndLocalStore(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info, err := ClassifyFile(f)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := mountinfo.GetMounts(nil)
	if err != nil {
		t.Fatal(err)
	}
	byPath, err := ClassifyPath(ms, dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.MountID != byPath.MountID || info.Type == "" {
		t.Errorf("ClassifyFile %+v, ClassifyPath %+v", info, byPath)
	}
	// The cache check walks up to the nearest existing directory.
	if err := CheckLocalStore("cache_dir", filepath.Join(dir, "not/yet/there")); err != nil && !info.Network {
		t.Errorf("CheckLocalStore on %s (%s): %v", dir, info.Type, err)
	}
	if err := CheckLocalStore("cache_dir", "relative"); err == nil {
		t.Error("relative cache_dir accepted")
	}
}
