package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

func mkchr(t *testing.T, path string, mode uint32, uid, gid int) {
	t.Helper()
	prereq.Root(t, "mknod of a character device")
	if err := unix.Mknod(path, unix.S_IFCHR|mode, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatalf("mknod %s: %v", path, err)
	}
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// TestGiveDevices: VFIO group files go to the VMM's uid (0600) for its
// life and back to root (0600) after; symlinks and non-devices are refused.
func TestGiveDevices(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "12")
	mkchr(t, dev, 0o600, 0, 0)
	owner := func(p string) (uint32, uint32, uint32) {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Uid, st.Gid, st.Mode & 0o7777
	}
	id := vmmIdentity{cred: &syscall.Credential{Uid: 65534, Gid: 4242}, uid: 65534, gid: 4242}
	restore, err := giveDevices([]string{dev}, id)
	if err != nil {
		t.Fatal(err)
	}
	if u, g, m := owner(dev); u != 65534 || g != 4242 || m != 0o600 {
		t.Errorf("given: %d:%d %#o, want 65534:4242 0600", u, g, m)
	}
	restore()
	if u, g, m := owner(dev); u != 0 || g != 0 || m != 0o600 {
		t.Errorf("restored: %d:%d %#o, want 0:0 0600", u, g, m)
	}
	if err := ReleaseDevices([]string{filepath.Join(dir, "gone")}); err != nil {
		t.Errorf("release of a missing file: %v", err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(dev, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, file} {
		if _, err := giveDevices([]string{p}, id); err == nil || !strings.Contains(err.Error(), "not a character device") {
			t.Errorf("give %s: err %v, want a refusal", p, err)
		}
	}
	if u, _, _ := owner(dev); u != 0 {
		t.Errorf("the link's target changed owner to %d", u)
	}
}

func TestKVMGroup(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name     string
		mode     uint32
		uid, gid int
		groups   []uint32
		need     bool
	}{
		{"root:kvm 0660, user outside kvm", 0o660, 0, 77, []uint32{4242}, true},
		{"user already in the group", 0o660, 0, 4243, []uint32{4242, 4243}, false},
		{"world rw", 0o666, 0, 77, []uint32{4242}, false},
		{"group without rw helps nothing", 0o600, 0, 77, []uint32{4242}, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, "kvm"+string(rune('a'+i)))
			mkchr(t, p, tt.mode, tt.uid, tt.gid)
			g, need := kvmGroup(p, 65534, 4242, tt.groups)
			if need != tt.need || (need && g != uint32(tt.gid)) {
				t.Errorf("kvmGroup = %d, %v; want %d, %v", g, need, tt.gid, tt.need)
			}
		})
	}
}
