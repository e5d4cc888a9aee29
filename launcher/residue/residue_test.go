package residue

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

func has(left []string, prefix, what string) bool {
	for _, l := range left {
		if strings.HasPrefix(l, prefix) && strings.Contains(l, what) {
			return true
		}
	}
	return false
}

// TestLeft plants each kind of leftover (a mount under the scope, a loop
// device backed by a cache file, a mount of it in the watched tmp dir, a
// process of a watched program, a state directory, a cache work
// directory, a temporary file) and checks that Left names each, and
// nothing once they are gone.
func TestLeft(t *testing.T) {
	prereq.Root(t, "mount(2) and loop devices")
	prereq.Tools(t, "losetup", "mkfs.ext2", "sleep")
	root := t.TempDir()
	scopeDir, tmp, run, cache := filepath.Join(root, "scope"), filepath.Join(root, "tmp"), filepath.Join(root, "run"), filepath.Join(root, "cache")
	for _, d := range []string{scopeDir + "/mnt", tmp, run, cache + "/images/0"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	scope := Scope{Paths: []string{scopeDir, cache}, RuntimeDir: run, CacheDir: cache, Programs: []string{"sleep"}, TmpDirs: []string{tmp}}
	before := Take(scope)
	if left := before.Left(); len(left) != 0 {
		t.Fatalf("left before anything was planted: %v", left)
	}

	if err := unix.Mount("tmpfs", scopeDir+"/mnt", "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(scopeDir+"/mnt", unix.MNT_DETACH)
	disk := filepath.Join(cache, "images/0/disk.img")
	if out, err := exec.Command("sh", "-c", "truncate -s 4M "+disk+" && mkfs.ext2 -q "+disk).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	out, err := exec.Command("losetup", "-f", "--show", disk).Output()
	if err != nil {
		t.Fatal(err)
	}
	loop := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "-d", loop).Run()
	inspect := filepath.Join(tmp, "slurm-microvm-mpi-x")
	if err := os.Mkdir(inspect, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(loop, inspect, "ext2", unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(inspect, unix.MNT_DETACH)
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer sleep.Process.Kill()
	for _, d := range []string{run + "/7.0.0", cache + "/images/0/tmp-abc-123"} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, "stray"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	left := before.Left()
	for _, w := range []struct{ prefix, what string }{
		{"mount", scopeDir + "/mnt"},
		{"mount", inspect},
		{"loop device", disk},
		{"process", "sleep 60"},
		{"state", "7.0.0"},
		{"cache work file", "tmp-abc-123"},
		{"temporary file", "stray"},
	} {
		if !has(left, w.prefix, w.what) {
			t.Errorf("Left does not report the %s %s:\n  %s", w.prefix, w.what, strings.Join(left, "\n  "))
		}
	}

	_ = unix.Unmount(inspect, 0)
	_ = unix.Unmount(scopeDir+"/mnt", 0)
	_ = exec.Command("losetup", "-d", loop).Run()
	_ = sleep.Process.Kill()
	_ = sleep.Wait()
	for _, p := range []string{run + "/7.0.0", cache + "/images/0/tmp-abc-123", filepath.Join(tmp, "stray"), inspect, disk} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	if left := before.WaitClean(context.Background(), 5*time.Second); len(left) > 0 {
		t.Errorf("left:\n  %s", strings.Join(left, "\n  "))
	}
}

func TestCompilerTemp(t *testing.T) {
	for name, want := range map[string]bool{
		"go-build123": true, "go-link-4258721366": true, "ccXpTaVD.cdtor.c": true, "cc6pmdwj.cdtor.o": true,
		"TestFoo123": true, "slurm-microvm-mpi-1": false, "cache.log": false, "ccache": false,
	} {
		if got := compilerTemp(name); got != want {
			t.Errorf("compilerTemp(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestSysfsLeftovers: a job cgroup directory that outlives its job and a
// device left bound to vfio-pci are reported, in a fake sysfs tree;
// what existed before the snapshot is not.
func TestSysfsLeftovers(t *testing.T) {
	sys := t.TempDir()
	vfio := filepath.Join(sys, "bus/pci/drivers/vfio-pci")
	cg := filepath.Join(sys, "fs/cgroup/system.slice/slurmstepd.scope")
	for _, d := range []string{vfio, filepath.Join(cg, "job_1")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../../../../devices/pci0000:00/0000:00:02.0", filepath.Join(vfio, "0000:00:02.0")); err != nil {
		t.Fatal(err)
	}
	before := Take(Scope{SysRoot: sys, TmpDirs: []string{t.TempDir()}})
	if err := os.Symlink("../../../../devices/pci0000:3a/0000:3b:00.0", filepath.Join(vfio, "0000:3b:00.0")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vfio, "new_id"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(cg, "job_2", "step_0"), 0o755); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(before.Left(), "\n")
	for _, want := range []string{"VFIO binding of PCI device 0000:3b:00.0", "cgroup directory " + filepath.Join(cg, "job_2")} {
		if !strings.Contains(got, want) {
			t.Errorf("Left lacks %q:\n%s", want, got)
		}
	}
	for _, old := range []string{"0000:00:02.0", "job_1", "new_id"} {
		if strings.Contains(got, old) {
			t.Errorf("Left blames %s, which is not new:\n%s", old, got)
		}
	}
}

// TestNoCmdlines: with Scope.NoCmdlines a leftover process is named by pid
// and executable only; its command line (another user's to keep) is not
// in the line.
func TestNoCmdlines(t *testing.T) {
	prereq.Tools(t, "sleep")
	for _, hide := range []bool{false, true} {
		before := Take(Scope{Programs: []string{"sleep"}, TmpDirs: []string{t.TempDir()}, NoCmdlines: hide})
		p := exec.Command("sleep", "301.5")
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		got := strings.Join(before.Left(), "\n")
		_ = p.Process.Kill()
		_ = p.Wait()
		if !strings.Contains(got, fmt.Sprintf("process %d", p.Process.Pid)) {
			t.Errorf("NoCmdlines %v: the process is not named: %q", hide, got)
		}
		if shown := strings.Contains(got, "301.5"); shown == hide {
			t.Errorf("NoCmdlines %v: command line shown %v: %q", hide, shown, got)
		}
	}
}
