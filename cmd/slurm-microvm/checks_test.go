package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// runApp runs the command line in-process and returns the exit status
// main would give and what the command printed (to the app's writers;
// the error message included).
func runApp(t *testing.T, args ...string) (int, string) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, &out
	err := app.Run(append([]string{"slurm-microvm"}, args...))
	if err == nil {
		return 0, out.String()
	}
	out.WriteString(err.Error())
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		return ec.ExitCode(), out.String()
	}
	return 1, out.String()
}

func write(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCheckCommandsExitStatus: every check command exits non-zero when
// what it checks is unusable, and names why.
func TestCheckCommandsExitStatus(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"sys", "dev", "emptyroot", "cache"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fake := []string{"--sysfs-root", filepath.Join(dir, "sys"), "--dev-root", filepath.Join(dir, "dev"), "--no-nvml", "--node", "vm"}
	gres := func(name, content string) []string {
		return append([]string{"gpus", "--gres-conf", write(t, dir, name, content)}, fake...)
	}
	cfg := func(name, content string) []string {
		return []string{"--config", write(t, dir, name, content), "config", "check"}
	}
	tests := []struct {
		name string
		args []string
		want int
		says string // in the output, when want != 0
	}{
		{"gpus: unparsable gres.conf", gres("bad.conf", "Name=gpu File=/dev/nvidia0 Bogus\n"), 1, "Bogus"},
		{"gpus: --gres-conf that does not exist", append([]string{"gpus", "--gres-conf", filepath.Join(dir, "nothere.conf")}, fake...), 1, "nothere.conf"},
		{"gpus: a configured GPU is not there", gres("gone.conf", "NodeName=vm Name=gpu File=/dev/nvidia0\n"), 1, "cannot be passed through"},
		{"gpus: no GPU configured for this node", gres("other.conf", "NodeName=other Name=gpu File=/dev/nvidia0\n"), 0, ""},
		{"config check: unknown key", cfg("unknown.toml", "no_such_key = 1\n"), 1, "no_such_key"},
		{"config check: QEMU missing", cfg("qemu.toml", "cache_dir = \""+filepath.Join(dir, "cache")+"\"\n[qemu]\nbinary = \"/nonexistent/qemu\"\n"), 1, "qemu.binary"},
		{"mpi check: image without MPI", []string{"mpi", "check", "--image-root", filepath.Join(dir, "emptyroot")}, 1, "MPI"},
		{"mpi check: no image given", []string{"mpi", "check"}, 2, "--image"},
		{"image check: missing image", []string{"image", "check", filepath.Join(dir, "nothere.tar")}, 1, "nothere.tar"},
		{"image check: not an image", []string{"image", "check", write(t, dir, "junk.tar", "not a tar")}, 1, "junk.tar"},
		{"mounts: bad syntax", []string{"--config", filepath.Join(dir, "none.toml"), "mounts", "--plan", "--mounts", "relative/path"}, 2, "relative/path"},
		{"mounts: source outside the allowed trees", []string{"--config", filepath.Join(dir, "none.toml"), "mounts", "--mounts", dir}, 1, dir},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := runApp(t, tt.args...)
			if code != tt.want {
				t.Fatalf("slurm-microvm %s: exit %d, want %d\n%s", strings.Join(tt.args, " "), code, tt.want, out)
			}
			if tt.want != 0 && !strings.Contains(out, tt.says) {
				t.Errorf("output does not name %q:\n%s", tt.says, out)
			}
		})
	}
}
