package main

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// nonRootUser returns a real user with a passwd entry, not root: the test
// cluster's microvmtest, else one made now and removed at cleanup.
func nonRootUser(t *testing.T) (uid, gid int) {
	t.Helper()
	u, err := user.Lookup("microvmtest")
	if err != nil {
		const name = "smv-cmd-scratch"
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", name).CombinedOutput(); err != nil {
			t.Fatalf("useradd %s: %v\n%s", name, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("userdel", name).Run() })
		if u, err = user.Lookup(name); err != nil {
			t.Fatal(err)
		}
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid
}

// TestRunNonRootScratch: a non-root `run` (no Slurm) makes its step's
// scratch directory in its own private run directory, not in the node's
// root-owned scratch base (which it cannot write), and leaves nothing
// behind. The image does not exist: the mounts, scratch included, are
// resolved before the image, so getting the image's error proves the
// scratch was made; an empty TMPDIR afterwards that it was removed.
func TestRunNonRootScratch(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Root(t, "runs as another, real user")
	}
	uid, gid := nonRootUser(t)
	dir, bin := otherUIDBinary(t, "smv-cmd-test-")
	tmp, home := filepath.Join(dir, "tmp"), filepath.Join(dir, "home")
	for _, d := range []string{tmp, home} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	// The defaults: scratch in /var/lib/slurm-microvm/scratch, root's.
	img := filepath.Join(dir, "no-such-image.tar")
	cmd := exec.Command(bin, "--config", filepath.Join(dir, "none.toml"), "run", "--image", img, "--", "true")
	cmd.Env = []string{"SMV_TEST_MAIN=1", "TMPDIR=" + tmp, "HOME=" + home, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, _ := cmd.CombinedOutput()
	if strings.Contains(string(out), "scratch") || !strings.Contains(string(out), img) {
		t.Fatalf("run as uid %d: %s\nwant only the image's error (the scratch made in the run's own directory)", uid, out)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("run as uid %d left %v in its TMPDIR %s\n%s", uid, ents, tmp, out)
	}
}
