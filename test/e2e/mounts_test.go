package e2e

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// secondUser is the other job user of the isolation test.
const secondUser = "microvmtest2"

// ensureUser creates name (useradd -m) unless it exists, removing it at
// the end when it was created here.
func ensureUser(t *testing.T, name string) *user.User {
	t.Helper()
	if u, err := user.Lookup(name); err == nil {
		return u
	}
	if out, err := exec.Command("useradd", "-m", "-s", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("userdel", "-r", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func mkdirOwned(t *testing.T, dir string, u *user.User, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

// mountTests: host paths in the guest, enforced on the host (read-only by
// QEMU's 9p server, sources opened with the job user's credentials).
func mountTests(t *testing.T, e *harness.Env) {
	img := "--microvm=" + e.Image
	if err := os.MkdirAll(harness.DataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(harness.DataDir); os.RemoveAll(harness.ScratchDir) })
	_ = os.Chmod(harness.DataDir, 0o755)

	ro := filepath.Join(harness.DataDir, "ro")
	if err := os.MkdirAll(filepath.Join(ro, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ro, "x"), []byte("dataset-bytes\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	e.Run(t, "read-only data, also after a remount in the guest", func(t *testing.T) {
		mnt := "--microvm-mounts=" + ro + ":/data:ro"
		out, errOut, code := e.Srun(t, "", img, mnt, "cat", "/data/x")
		if code != 0 || out != "dataset-bytes\n" {
			t.Fatalf("cat: exit %d, %q %q", code, out, errOut)
		}
		script := "touch /data/y 2>&1; mount -o remount,rw /data 2>&1; echo remounted=$?; " +
			"touch /data/y 2>&1; echo changed > /data/x 2>&1; mkdir /data/sub/z 2>&1; exit 0"
		out, errOut, code = e.Srun(t, "", img, mnt, "sh", "-c", script)
		if code != 0 || !strings.Contains(out, "Read-only file system") {
			t.Fatalf("writes: exit %d, %q %q: want read-only errors", code, out, errOut)
		}
		t.Logf("guest said: %q", out)
		if _, err := os.Stat(filepath.Join(ro, "y")); err == nil {
			t.Error("the guest created /data/y on the host")
		}
		if _, err := os.Stat(filepath.Join(ro, "sub/z")); err == nil {
			t.Error("the guest created a directory below the share on the host")
		}
		if b, _ := os.ReadFile(filepath.Join(ro, "x")); string(b) != "dataset-bytes\n" {
			t.Errorf("host file changed to %q", b)
		}
	})

	u1, err := user.Lookup(cluster.TestUser)
	if err != nil {
		t.Fatal(err)
	}
	u2 := ensureUser(t, secondUser)
	rw := filepath.Join(harness.DataDir, "rw")
	if err := os.MkdirAll(rw, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := func(u *user.User) string { return filepath.Join(rw, u.Username) }
	mkdirOwned(t, dir(u1), u1, 0o700)
	mkdirOwned(t, dir(u2), u2, 0o700)

	e.Run(t, "writable mount and scratch, owned by the job user", func(t *testing.T) {
		mnt := "--microvm-mounts=" + dir(u1) + ":/out:rw"
		script := "echo JOB=$SLURM_JOB_ID; echo result > /out/f && echo scratch > /scratch/s && ls /scratch && id -u"
		out, errOut, code := e.Srun(t, cluster.TestUser, img, mnt, "sh", "-c", script)
		if code != 0 {
			t.Fatalf("exit %d, %q %q", code, out, errOut)
		}
		fi, err := os.Stat(filepath.Join(dir(u1), "f"))
		if err != nil {
			t.Fatalf("file written in the guest is not on the host: %v", err)
		}
		st := fileOwner(fi)
		if strconv.Itoa(int(st)) != u1.Uid {
			t.Errorf("host file owned by uid %d, want the job user's %s", st, u1.Uid)
		}
		job := jobOf(t, out)
		e.WaitClean(t, job)
		entries, _ := os.ReadDir(harness.ScratchDir)
		for _, en := range entries {
			if strings.HasPrefix(en.Name(), strconv.Itoa(job)+".") {
				t.Errorf("scratch %s left after the step", en.Name())
			}
		}
	})

	e.Run(t, "two users see only their own paths", func(t *testing.T) {
		for _, c := range []struct{ me, other *user.User }{{u1, u2}, {u2, u1}} {
			if err := os.WriteFile(filepath.Join(dir(c.me), "mine"), []byte(c.me.Username+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_ = exec.Command("chown", c.me.Uid, filepath.Join(dir(c.me), "mine")).Run()
			own := "--microvm-mounts=" + dir(c.me) + ":/mine:rw"
			out, errOut, code := e.Srun(t, c.me.Username, img, own, "sh", "-c", "cat /mine/mine; ls /mine")
			if code != 0 || !strings.HasPrefix(out, c.me.Username+"\n") {
				t.Errorf("%s reading its own: exit %d %q %q", c.me.Username, code, out, errOut)
			}
			for _, mode := range []string{"ro", "rw"} {
				other := "--microvm-mounts=" + dir(c.other) + ":/theirs:" + mode
				out, errOut, code = e.Srun(t, c.me.Username, img, other, "sh", "-c", "cat /theirs/mine; echo x > /theirs/evil")
				if code == 0 || strings.Contains(out, c.other.Username) {
					t.Errorf("%s mounting %s's directory (%s): exit %d, %q: must fail", c.me.Username, c.other.Username, mode, code, out)
				}
				if !strings.Contains(errOut, dir(c.other)) {
					t.Errorf("%s: error %q does not name the refused path", c.me.Username, errOut)
				}
			}
			if _, err := os.Stat(filepath.Join(dir(c.other), "evil")); err == nil {
				t.Errorf("%s wrote into %s's directory", c.me.Username, c.other.Username)
			}
		}
	})

	e.Run(t, "bad mount specs fail before queueing", func(t *testing.T) {
		for _, c := range []struct{ spec, want string }{
			{ro + ":data", `destination "data" must be absolute`},
			{ro + ":/proc", "/proc"},
			{"/etc:/etc2", "/etc"},
			{ro + ":/d:bogus", "bogus"},
		} {
			_, errOut, code := e.Srun(t, "", img, "--microvm-mounts="+c.spec, "true")
			if code == 0 || !strings.Contains(errOut, c.want) || strings.Contains(errOut, "has been allocated") {
				t.Errorf("--microvm-mounts=%s: exit %d, stderr %q: want a refusal naming %q before queueing", c.spec, code, errOut, c.want)
			}
		}
	})

	e.Run(t, "workdir", func(t *testing.T) {
		out, errOut, code := e.Srun(t, "", img, "--microvm-workdir=/etc", "pwd")
		if code != 0 || out != "/etc\n" {
			t.Fatalf("exit %d, %q %q", code, out, errOut)
		}
	})
}

func fileOwner(fi os.FileInfo) uint32 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return ^uint32(0)
}
