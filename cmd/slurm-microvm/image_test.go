package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestImageConfigErrors: `image ls`/`rm` with a config that cannot be
// parsed fail and name the file, as every other command does; a missing
// config means the defaults.
func TestImageConfigErrors(t *testing.T) {
	dir := t.TempDir()
	cache := filepath.Join(dir, "cache")
	good := write(t, dir, "good.toml", "cache_dir = \""+cache+"\"\n")
	broken := write(t, dir, "broken.toml", "cache_dir = [\n")
	unknown := write(t, dir, "unknown.toml", "no_such_key = 1\n")
	tests := []struct {
		name   string
		args   []string
		wantOK bool
	}{
		{"good config", []string{"--config", good, "image", "ls"}, true},
		{"missing config means defaults", []string{"--config", filepath.Join(dir, "none.toml"), "image", "ls", "--cache-root", cache}, true},
		{"missing config, no --cache-root", []string{"--config", filepath.Join(dir, "none.toml"), "image", "ls", "--uid", "4294967"}, true},
		{"unparsable config, ls", []string{"--config", broken, "image", "ls"}, false},
		{"unknown key, ls", []string{"--config", unknown, "image", "ls"}, false},
		{"unparsable config, rm", []string{"--config", broken, "image", "rm", "sha256:0123456789ab"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runApp(t, tc.args...)
			if tc.wantOK && code != 0 {
				t.Fatalf("exit %d; want 0: %s", code, out)
			}
			if !tc.wantOK && (code == 0 || !strings.Contains(out, tc.args[1])) {
				t.Fatalf("exit %d, %q; want non-zero naming %s", code, out, tc.args[1])
			}
		})
	}
}

// TestImageNonRootNodeCache: a non-root user's `image ls` and `image rm`
// act on their personal cache and say where their jobs' images are (the
// node's cache, root's alone) and what to run there. Runs as a real uid.
func TestImageNonRootNodeCache(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Root(t, "runs as another uid")
	}
	const uid = 43203
	dir, bin := otherUIDBinary(t, "smv-image-test-")
	node := filepath.Join(dir, "cache", "images")
	userNode := filepath.Join(node, strconv.Itoa(uid))
	if err := os.MkdirAll(userNode, 0o700); err != nil { // as the launcher makes it
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "cache"), 0o755)
	os.Chmod(node, 0o755)
	cfg := write(t, dir, "microvm.toml", "cache_dir = \""+filepath.Join(dir, "cache")+"\"\n")
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, uid, uid); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(bin, append([]string{"--config", cfg, "image"}, args...)...)
		cmd.Env = []string{"SMV_TEST_MAIN=1", "HOME=" + home, "PATH=/usr/bin:/bin"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("ls")
	if err != nil {
		t.Fatalf("image ls: %v: %s", err, out)
	}
	for _, want := range []string{userNode, "sudo slurm-microvm image ls --uid 43203"} {
		if !strings.Contains(out, want) {
			t.Errorf("image ls as uid %d = %q; want it to name %q", uid, out, want)
		}
	}
	const digest = "sha256:0123456789abcdef"
	out, err = run("rm", digest)
	if err == nil {
		t.Fatalf("image rm of an image not in the personal cache succeeded: %s", out)
	}
	for _, want := range []string{userNode, "sudo slurm-microvm image rm --uid 43203 " + digest} {
		if !strings.Contains(out, want) {
			t.Errorf("image rm as uid %d = %q; want it to name %q", uid, out, want)
		}
	}
}
