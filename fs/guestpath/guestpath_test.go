package guestpath

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// imageRoot builds a fake image root next to a directory "outside" that no
// resolution may touch:
//
//	root/run/                 directory
//	root/var/run -> /run      the usual absolute link
//	root/escape -> ../../../../../outside
//	root/abs -> /etc/host     absolute, target missing
//	root/loop -> loop
//	root/file                 regular file
//	root/procl -> /proc
//	root/outl -> <outside>    absolute host path of outside
func imageRoot(t *testing.T) (root, outside string) {
	t.Helper()
	dir := t.TempDir()
	root, outside = filepath.Join(dir, "root"), filepath.Join(dir, "outside")
	for _, d := range []string{root + "/run", root + "/var", root + "/proc", outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{
		"var/run": "/run", "escape": "../../../../../outside", "abs": "/etc/host",
		"loop": "loop", "procl": "/proc", "outl": outside,
	} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return root, outside
}

func TestResolve(t *testing.T) {
	refuse := []string{"/", "/proc", "/sys", "/dev", "/run/microvm"}
	for _, tc := range []struct {
		name, dest string
		create     bool
		want       string // in-root path
		errIs      error
	}{
		{name: "plain new", dest: "/data", create: true, want: "/data"},
		{name: "var/run stays in the root", dest: "/var/run/x", create: true, want: "/run/x"},
		{name: "relative link cannot climb out", dest: "/escape/y", create: true, want: "/outside/y"},
		{name: "absolute link starts at the root", dest: "/abs", create: true, want: "/etc/host"},
		{name: "link to a host path stays in the root", dest: "/outl/z", create: true, want: "{outside}/z"},
		{name: "dot-dot stops at the root", dest: "/a/../../../b", create: true, want: "/b"},
		{name: "symlink loop", dest: "/loop/x", create: true, errIs: unix.ELOOP},
		{name: "through a file", dest: "/file/x", create: true, errIs: unix.ENOTDIR},
		{name: "onto a file", dest: "/file", create: true, errIs: unix.ENOTDIR},
		{name: "refused after a symlink", dest: "/procl", create: true, errIs: ErrRefused},
		{name: "refused below", dest: "/proc/x", create: true, errIs: ErrRefused},
		{name: "refused root", dest: "/x/..", create: true, errIs: ErrRefused},
		{name: "agent dir", dest: "/run/microvm", create: true, errIs: ErrRefused},
		{name: "missing without create", dest: "/nope", errIs: unix.ENOENT},
		{name: "existing without create", dest: "/var/run", want: "/run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root, outside := imageRoot(t)
			// The host path of outside, taken as a path inside the root.
			want := strings.ReplaceAll(tc.want, "{outside}", outside)
			f, in, err := Resolve(root, tc.dest, Options{Create: tc.create, Refuse: refuse})
			if tc.errIs != nil {
				if !errors.Is(err, tc.errIs) {
					t.Fatalf("Resolve(%q) = %q, %v; want %v", tc.dest, in, err, tc.errIs)
				}
				t.Logf("%v", err)
				return
			}
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tc.dest, err)
			}
			defer f.Close()
			if in != want {
				t.Errorf("Resolve(%q) = %q, want %q", tc.dest, in, want)
			}
			var got, exp unix.Stat_t
			if err := unix.Fstat(int(f.Fd()), &got); err != nil {
				t.Fatal(err)
			}
			if err := unix.Stat(filepath.Join(root, in), &exp); err != nil {
				t.Fatalf("%s not created inside the root: %v", in, err)
			}
			if got.Ino != exp.Ino || got.Dev != exp.Dev {
				t.Errorf("descriptor is not %s inside the root", in)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Errorf("something was created outside the root: %v", ents)
			}
		})
	}
}

func TestResolveRelative(t *testing.T) {
	if _, _, err := Resolve(t.TempDir(), "data", Options{Create: true}); err == nil {
		t.Error("relative destination accepted")
	}
}

// The agent mounts onto the returned descriptor: mount(2) on
// /proc/self/fd/N lands on the resolved directory inside the root.
func TestMountOnDescriptor(t *testing.T) {
	prereq.Root(t, "mount(2)")
	root, _ := imageRoot(t)
	f, in, err := Resolve(root, "/var/run/share", Options{Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Mount("smv-test", "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(filepath.Join(root, in), unix.MNT_DETACH) })
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(root, "run/share"), &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Errorf("%s inside the root is not the mount: type %#x, %v", in, st.Type, err)
	}
}
