package oci

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestSpecUnderRunc runs the spec with runc, the runtime behind the runc
// shim that stands in for Kata's in the tests: the init process runs as
// the job's uid and gids with no capabilities and no_new_privs, a
// read-only share refuses writes while a read-write one takes them,
// masked paths are masked, and a VFIO-path device node is the job's and
// usable (its numbers are /dev/zero's: this machine has no VFIO group).
func TestSpecUnderRunc(t *testing.T) {
	prereq.Root(t, "runc creates namespaces, mounts and cgroups")
	prereq.Tools(t, "runc", "busybox")
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("file", "-L", busybox).Output(); err == nil && !strings.Contains(string(out), "statically linked") {
		prereq.Missing(t, "%s is not static (install busybox-static)", busybox)
	}

	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	mkdirs(t, filepath.Join(rootfs, "bin"), filepath.Join(dir, "ro"), filepath.Join(dir, "rw"), filepath.Join(dir, "state"))
	copyFile(t, busybox, filepath.Join(rootfs, "bin", "busybox"))
	for _, a := range []string{"sh", "id", "grep", "cat", "touch", "hostname", "wc", "head", "stat", "echo"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "ro", "hello"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(dir, "ro"), 1000, 1000); err != nil { // writable for the job but for the mount
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(dir, "rw"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	masked := ""
	for _, p := range maskedPaths() {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			masked = p
			break
		}
	}
	if masked == "" {
		t.Fatalf("none of the masked files %v is on this host", maskedPaths())
	}
	script := strings.Join([]string{
		`set -e`,
		`test "$(id -u):$(id -g)" = 1000:1000`,
		`id -G | grep -qw 100`,
		`grep -q '^CapEff:[[:space:]]*0000000000000000$' /proc/self/status`,
		`grep -q '^CapBnd:[[:space:]]*0000000000000000$' /proc/self/status`,
		`grep -q '^NoNewPrivs:[[:space:]]*1$' /proc/self/status`,
		`test "$(hostname)" = node1`,
		`test "$(cat /data/ro/hello)" = "from the host"`,
		`if touch /data/ro/new 2>/dev/null; then echo "read-only share took a write"; exit 1; fi`,
		`echo written > /data/rw/new`,
		`test "$(stat -c %t:%T ` + masked + `)" = 1:3`, // /dev/null over it
		`test "$(head -c 4 /dev/vfio/7 | wc -c)" -eq 4`,
		`test "$(stat -c %u /dev/vfio/7)" -eq 1000`,
		`test "$PWD" = /data/rw`,
		`echo OK`,
	}, "\n")
	in := Input{
		RootfsPath: rootfs,
		Hostname:   "node1",
		UID:        1000, GID: 1000, AdditionalGids: []uint32{100},
		Init: Process{Args: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/bin"}, Cwd: "/data/rw"},
		Mounts: []Mount{
			{Source: filepath.Join(dir, "rw"), Destination: "/data/rw"},
			{Source: filepath.Join(dir, "ro"), Destination: "/data/ro", ReadOnly: true},
		},
		CgroupsPath: fmt.Sprintf("/smv-oci-test-%d", os.Getpid()),
		Devices:     []Device{{Path: "/dev/vfio/7", Major: 1, Minor: 5}},
	}
	s, err := Spec(in)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := runc(t, dir, s, "smv-oci-test"); err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "rw", "new")); err != nil || string(got) != "written\n" {
		t.Errorf("the read-write share's write: %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "ro", "new")); err == nil {
		t.Error("the read-only share was written on the host")
	}

	// Why Spec refuses a source in /proc: a directory the caller holds
	// open, named /proc/<pid>/fd/<n>, lives in the caller's mount
	// namespace, and runc mounts after unsharing its own: EINVAL.
	f, err := os.Open(filepath.Join(dir, "rw"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s.Mounts[len(s.Mounts)-1].Source = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
	s.Process.Args = []string{"/bin/echo", "OK"}
	out, err := runc(t, dir, s, "smv-oci-test-fd")
	if err == nil || !strings.Contains(string(out), "invalid argument") {
		t.Errorf("runc with a /proc/<pid>/fd source: %v\n%s\nwant EINVAL (if runc accepts it now, Spec may too)", err, out)
	}
}

// runc runs spec s as container name+pid with bundle dir and returns what
// it printed.
func runc(t *testing.T, dir string, s *specs.Spec, name string) ([]byte, error) {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := fmt.Sprintf("%s-%d", name, os.Getpid())
	state := filepath.Join(dir, "state")
	t.Cleanup(func() { _ = exec.Command("runc", "--root", state, "delete", "--force", id).Run() })
	return exec.CommandContext(ctx, "runc", "--root", state, "run", "--bundle", dir, id).CombinedOutput()
}

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}
