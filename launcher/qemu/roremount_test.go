package qemu_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// TestReadOnlyShareGuestRootRemount: a guest root remounts
// the cache=loose read-only share rw and writes every way; the host tree
// must stay as it was.
func TestReadOnlyShareGuestRootRemount(t *testing.T) {
	fixture.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := newVMEnv(t, ctx, "RO Remount OS", func(rootfs string) {
		bin := filepath.Join(rootfs, "bin", "roremount")
		cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./testdata/roremount")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
		_ = os.Chown(bin, 0, 0)
		if err := os.Chmod(bin, 0o755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
	})
	ro := filepath.Join(e.tmp, "ro")
	if err := os.Mkdir(ro, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(ro, 0o777)
	if err := os.WriteFile(filepath.Join(ro, "marker"), []byte("host\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(filepath.Join(ro, "marker"), 0o666)
	f, err := os.Open(ro)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stateDir := e.stateDir(t, "state")
	cfg := jobConfig("roremount", stateDir, e.disk)
	cfg.Shares = []driver.Share{{Dir: f, Destination: "/data", ReadOnly: true}}
	sb, err := e.driver(true).Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer sb.Stop(context.Background())
	run := serve(t, ctx, sb, stateDir)
	out, st, err := run("/bin/roremount", "/data")
	t.Logf("guest (status %v, err %v):\n%s", st, err, out)
	if !strings.Contains(string(out), "remount rw:") {
		t.Fatalf("the guest program did not become root, so nothing reached QEMU as root:\n%s", out)
	}
	entries, _ := os.ReadDir(ro)
	for _, d := range entries {
		t.Logf("host entry: %s", d.Name())
	}
	if b, _ := os.ReadFile(filepath.Join(ro, "marker")); string(b) != "host\n" {
		t.Errorf("host file now %q", b)
	}
	if fi, _ := os.Stat(filepath.Join(ro, "marker")); fi == nil || fi.Mode().Perm() != 0o666 {
		t.Errorf("host file mode changed or gone: %v", fi)
	}
	if len(entries) != 1 {
		t.Errorf("host tree changed: %d entries", len(entries))
	}
}
