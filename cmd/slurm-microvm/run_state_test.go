package main

import (
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMain lets a test run this binary's main as another user (the test
// binary re-executed with SMV_TEST_MAIN=1).
func TestMain(m *testing.M) {
	if os.Getenv("SMV_TEST_MAIN") == "1" {
		os.Args = append([]string{"slurm-microvm"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A non-root `run` under cron or su (no XDG_RUNTIME_DIR of its own) whose
// predictable state directory another user created first: the run must
// not put anything there (the other user would get its control socket
// and logs), and it must not use another user's XDG_RUNTIME_DIR. Runs as
// two real uids (the job user A, the planting user B).
func TestRunStateNotInPlantedDir(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Root(t, "runs as two other uids")
	}
	const userA, userB = 43201, 43202
	dir, bin := otherUIDBinary(t, "smv-cmd-test-")
	tmp := filepath.Join(dir, "tmp") // a /tmp: sticky, world-writable
	xdgB := filepath.Join(dir, "xdg-b")
	for _, d := range []string{tmp, xdgB} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(tmp, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(xdgB, userB, userB); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(xdgB, 0o777); err != nil { // B lets anyone in
		t.Fatal(err)
	}
	planted := filepath.Join(tmp, "slurm-microvm-"+strconv.Itoa(userA))
	if err := os.Mkdir(planted, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(planted, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(planted, userB, userB); err != nil {
		t.Fatal(err)
	}
	// B's state root inside it, and a watch on both: the run tears its
	// state down at the end, so what it did there is seen as it happens.
	plantedRoot := filepath.Join(planted, "slurm-microvm")
	if err := os.Mkdir(plantedRoot, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(plantedRoot, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(plantedRoot, userB, userB); err != nil {
		t.Fatal(err)
	}
	ifd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ifd)
	for _, d := range []string{planted, plantedRoot, xdgB} {
		if _, err := unix.InotifyAddWatch(ifd, d, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(dir, "home-a")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, userA, userA); err != nil {
		t.Fatal(err)
	}
	for _, xdg := range []string{"", xdgB} {
		cmd := exec.Command(bin, "--config", filepath.Join(dir, "none.toml"), "run", "--image", filepath.Join(dir, "no-such-image.tar"), "--", "true")
		cmd.Env = []string{"SMV_TEST_MAIN=1", "TMPDIR=" + tmp, "HOME=" + home, "PATH=/usr/bin:/bin"}
		if xdg != "" {
			cmd.Env = append(cmd.Env, "XDG_RUNTIME_DIR="+xdg)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: userA, Gid: userA}}
		out, _ := cmd.CombinedOutput()
		buf := make([]byte, 4096)
		if n, _ := unix.Read(ifd, buf); n > 0 {
			t.Errorf("XDG_RUNTIME_DIR=%q: run as uid %d created entries in the directories of uid %d (%s, %s)\n%s", xdg, userA, userB, planted, xdgB, out)
		}
		// Nothing of the run is left in the real temporary directory.
		ents, _ := os.ReadDir(tmp)
		if len(ents) != 1 { // planted
			t.Errorf("XDG_RUNTIME_DIR=%q: %s holds %v after the run\n%s", xdg, tmp, ents, out)
		}
	}
}
