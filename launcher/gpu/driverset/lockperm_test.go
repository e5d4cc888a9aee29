package driverset

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestUnprivilegedCannotStallUse: an entry's .inuse and the cache's .lock
// are root's alone, so a local user (here nobody, 65534) cannot take
// them and hold every GPU step's Use or every Build behind its lock
// (flock needs only an open file). Before, both were 0644.
func TestUnprivilegedCannotStallUse(t *testing.T) {
	prereq.Root(t, "runs flock(1) as another uid")
	prereq.Tools(t, "flock")
	_, s := discovered(t, xzDKMS)
	base, err := os.MkdirTemp("/var/tmp", "driverset-lock-") // parents searchable, as /var/cache
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(base, "cache")
	b, err := Build(context.Background(), s, cache)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(b.Dir, inUseFile), filepath.Join(cache, ".lock")} {
		cmd := exec.Command("flock", "-x", "-n", p, "true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("uid 65534 took an exclusive lock on %s", p)
		} else {
			t.Logf("uid 65534 on %s: %v %s", p, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	release, err := Use(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	release()
}
