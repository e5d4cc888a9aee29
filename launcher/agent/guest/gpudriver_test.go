package guest

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/fs/guestpath"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// A /proc/devices as a kernel with the NVIDIA driver prints it (proc(5)):
// block devices have their own section, and a name may repeat.
const procDevices = `Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
195 nvidia
195 nvidia-modeset
236 nvidia-uvm
237 nvidia-caps

Block devices:
  7 loop
254 virtblk
259 blkext
`

func TestParseCharMajors(t *testing.T) {
	got, err := parseCharMajors(strings.NewReader(procDevices))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint32{"nvidia": 195, "nvidia-uvm": 236, "nvidia-caps": 237, "tty": 4, "mem": 1} {
		if got[name] != want {
			t.Errorf("%s: major %d, want %d", name, got[name], want)
		}
	}
	if _, ok := got["virtblk"]; ok {
		t.Errorf("block device virtblk read as a character device: %v", got)
	}
}

func TestDriverEnv(t *testing.T) {
	d := &api.GPUDriver{GuestLibDir: "/usr/local/nvidia/lib64", GuestBinDir: "/usr/local/nvidia/bin"}
	for _, tc := range []struct {
		name     string
		env      []string
		wantEnv  []string
		wantPath string
	}{
		{"none set", []string{"A=1"}, []string{"A=1", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64"}, "/usr/local/nvidia/bin:/usr/bin:/bin"},
		{"image or task set", []string{"LD_LIBRARY_PATH=/opt/cuda/lib64:/x"}, []string{"LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/opt/cuda/lib64:/x"}, "/usr/local/nvidia/bin:/usr/bin:/bin"},
		{"empty", []string{"LD_LIBRARY_PATH="}, []string{"LD_LIBRARY_PATH=/usr/local/nvidia/lib64"}, "/usr/local/nvidia/bin:/usr/bin:/bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, path := driverEnv(d, append([]string(nil), tc.env...), "/usr/bin:/bin")
			if !reflect.DeepEqual(env, tc.wantEnv) || path != tc.wantPath {
				t.Errorf("got %q %q, want %q %q", env, path, tc.wantEnv, tc.wantPath)
			}
		})
	}
	env, path := driverEnv(nil, []string{"A=1"}, "/bin")
	if !reflect.DeepEqual(env, []string{"A=1"}) || path != "/bin" {
		t.Errorf("no driver: got %q %q", env, path)
	}
}

func TestInSet(t *testing.T) {
	for _, bad := range []string{"", "/lib/modules", "../x", "a/../../x"} {
		if _, err := inSet(bad); err == nil {
			t.Errorf("inSet(%q) accepted a path outside the set", bad)
		}
	}
	if p, err := inSet("modules/nvidia.ko"); err != nil || p != gpuDriverDir+"/modules/nvidia.ko" {
		t.Errorf("inSet: %q %v", p, err)
	}
}

func TestMakeNode(t *testing.T) {
	prereq.Root(t, "mknod needs CAP_MKNOD")
	root := t.TempDir()
	majors := map[string]uint32{"nvidia": 195, "nvidia-uvm": 236}
	for _, tc := range []struct {
		n       *api.DeviceNode
		want    uint64
		wantErr string
	}{
		{&api.DeviceNode{Path: "nvidia0", MajorName: "nvidia", FallbackMajor: 195, Minor: 0, Mode: 0o666}, unix.Mkdev(195, 0), ""},
		{&api.DeviceNode{Path: "nvidia-uvm-tools", MajorName: "nvidia-uvm", Minor: 1}, unix.Mkdev(236, 1), ""},
		{&api.DeviceNode{Path: "nvidiactl", MajorName: "nvidia-frontend", FallbackMajor: 195, Minor: 255}, unix.Mkdev(195, 255), ""},
		{&api.DeviceNode{Path: "nvidia-caps/nvidia-cap1", MajorName: "nvidia-caps", Minor: 1}, 0, `no character device "nvidia-caps"`},
		{&api.DeviceNode{Path: "../escape", MajorName: "nvidia", FallbackMajor: 195}, 0, "not a path under /dev"},
	} {
		err := makeNode(root, tc.n, majors)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err %v, want %q", tc.n.Path, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.n.Path, err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, "dev", tc.n.Path), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != tc.want || st.Mode&0o777 != 0o666 {
			t.Errorf("%s: mode %o rdev %d:%d, want char 0666 %d:%d", tc.n.Path, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), unix.Major(tc.want), unix.Minor(tc.want))
		}
	}
	// A plain file the image put there is replaced by the node.
	p := filepath.Join(root, "dev", "nvidia1")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := makeNode(root, &api.DeviceNode{Path: "nvidia1", MajorName: "nvidia", Minor: 1}, majors); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(p); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("nvidia1 over a plain file: %v %v", fi.Mode(), err)
	}
}

// TestOwnMountPoint: an image's symlink (or file) where the agent mounts
// /dev, /proc, ... is replaced by a real directory, so the mount and the
// device nodes made in it stay in the root; a directory is kept.
func TestOwnMountPoint(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "dev")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "run"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/dev", "/run", "/proc", "/sys"} {
		if err := ownMountPoint(root, p); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	for _, p := range []string{"dev", "run"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
			t.Errorf("/%s: %v: the image's non-directory must be gone", p, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(root, "proc")); err != nil || !fi.IsDir() {
		t.Errorf("/proc directory: %v", err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("the symlink's target was touched: %v", err)
	}
}

// TestShareRefusedOverDriver: an image link that leads a share's
// destination onto the GPU driver's directory is refused in the guest.
func TestShareRefusedOverDriver(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "usr/local/nvidia/lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/local/nvidia/lib64", filepath.Join(root, "data")); err != nil {
		t.Fatal(err)
	}
	f, in, err := guestpath.Resolve(root, "/data", guestpath.Options{Create: true, Refuse: shareRefused})
	if err == nil {
		f.Close()
		t.Fatalf("/data resolved to %s and was not refused", in)
	}
	if !errors.Is(err, guestpath.ErrRefused) {
		t.Errorf("err %v, want ErrRefused", err)
	}
}
