package kata_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

func TestMain(m *testing.M) {
	code := m.Run()
	fixture.RemoveAgent()
	os.Exit(code)
}

const kataConf = `[hypervisor.qemu]
path = "/usr/bin/qemu-system-x86_64"
enable_annotations = ["default_vcpus", "default_memory"]
default_memory = 2048
shared_fs = "virtio-fs"
[runtime]
sandbox_cgroup_only = true
`

// TestSandboxWithRuncShim boots a sandbox of the Kata driver with
// containerd's runc shim standing in for containerd-shim-kata-v2 (same
// task API), runs processes in it through the step's control socket as a
// task would, and stops it: nothing of it may be left (shim, mounts,
// bundle, FIFOs).
func TestSandboxWithRuncShim(t *testing.T) {
	fixture.RequireRoot(t)
	fixture.Require(t, "containerd-shim-runc-v2", "runc", "mkfs.erofs", "busybox")
	tmp := t.TempDir()
	rootfs := filepath.Join(tmp, "rootfs")
	fixture.BusyboxRootfs(t, rootfs, "Kata Driver Test")
	img := filepath.Join(tmp, "root.erofs")
	fixture.Erofs(t, rootfs, img)
	conf := filepath.Join(tmp, "configuration.toml")
	if err := os.WriteFile(conf, []byte(kataConf), 0o644); err != nil {
		t.Fatal(err)
	}
	share := filepath.Join(tmp, "share")
	if err := os.MkdirAll(share, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(share, "f"), []byte("SHARED\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, err := os.Open(share)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	stateDir := filepath.Join(tmp, "state")
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	before := mountsUnder(t, tmp)
	// runc's root of the namespace (runc makes it, never removes it).
	t.Cleanup(func() { _ = os.Remove("/run/containerd/runc/smv-unit") })

	d := kata.New(kata.Options{Mode: "shim", Shim: "/usr/bin/containerd-shim-runc-v2", Configuration: conf, Namespace: "smv-unit", Init: fixture.Agent(t), StopGrace: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := d.Prepare(ctx, nil); err != nil {
		t.Fatal(err)
	}
	sb, err := d.Start(ctx, driver.SandboxConfig{
		ID: "7.0.0", StateDir: stateDir, CPUs: 1, MemoryMiB: 256,
		RootFS:   driver.RootFS{Image: img, OverlayMiB: 16},
		ImageEnv: []string{"PATH=/bin:/usr/bin", "IMAGE_VAR=from-image"},
		UID:      65534, GID: 65534, Hostname: "kata-test",
		Shares: []driver.Share{{Dir: dir, Destination: "/data", ReadOnly: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	shimPid := sb.Pid()
	defer sb.Stop(context.Background())
	if err := sb.Listen(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = sb.Serve(ctx) }()
	c, err := control.Attach(ctx, stateDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	tests := []struct {
		name     string
		argv     []string
		stdin    string
		code     int
		signal   int
		out, err string
	}{
		{name: "identity, env, share", argv: []string{"sh", "-c", "echo $(id -u) $IMAGE_VAR $(hostname) $(cat /data/f) $(tr '\\0' ' ' </proc/1/cmdline); echo err >&2"},
			out: "65534 from-image kata-test SHARED /.slurm-microvm/init pause\n", err: "err\n"},
		{name: "exit code", argv: []string{"sh", "-c", "exit 3"}, code: 3},
		{name: "killed by a signal", argv: []string{"sh", "-c", "kill -KILL $$"}, code: 137, signal: 9},
		{name: "stdin to EOF", argv: []string{"cat"}, stdin: "line\n", out: "line\n"},
		{name: "empty stdin ends cat", argv: []string{"sh", "-c", "cat; echo DONE"}, out: "DONE\n"},
		{name: "output relayed whole", argv: []string{"sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x; echo"}, out: strings.Repeat("x", 3000000) + "\n"},
		{name: "read-only share", argv: []string{"sh", "-c", "touch /data/x 2>/dev/null && echo WROTE || echo REFUSED"}, out: "REFUSED\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := c.Exec(ctx, driver.ProcessSpec{Argv: tt.argv, Env: []string{"TASK=1"}})
			if err != nil {
				t.Fatal(err)
			}
			var out, errb bytes.Buffer
			p.Relay(ctx, strings.NewReader(tt.stdin), &out, &errb)
			st, err := p.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Code != tt.code || int(st.Signal) != tt.signal {
				t.Errorf("exit %d signal %d, want %d %d", st.Code, st.Signal, tt.code, tt.signal)
			}
			if tt.out != "" && out.String() != tt.out || tt.err != "" && errb.String() != tt.err {
				t.Errorf("stdout %q stderr %q, want %q %q", out.String(), errb.String(), tt.out, tt.err)
			}
		})
	}
	t.Run("command not found", func(t *testing.T) {
		_, err := c.Exec(ctx, driver.ProcessSpec{Argv: []string{"no-such-command"}})
		if err == nil || !strings.Contains(err.Error(), driver.ErrCommandNotFound.Error()) {
			t.Fatalf("err %v, want %v", err, driver.ErrCommandNotFound)
		}
	})
	t.Run("PMI refused with the reason", func(t *testing.T) {
		_, err := c.Exec(ctx, driver.ProcessSpec{Argv: []string{"true"}, Listeners: []driver.ListenerForward{{Listen: "127.0.0.1:0"}}})
		if err == nil || !strings.Contains(err.Error(), "carries no PMI") {
			t.Fatalf("err %v, want the PMI refusal", err)
		}
	})
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after Stop")
	}
	if err := unix.Kill(shimPid, 0); err == nil {
		t.Errorf("shim pid %d alive after Stop", shimPid)
	}
	if left := mountsUnder(t, tmp); len(left) > len(before) {
		t.Errorf("mounts left under %s: %v", tmp, left)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "kata")); !os.IsNotExist(err) {
		t.Errorf("bundle directory left: %v", err)
	}
	if err := d.Cleanup(ctx, stateDir); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
}

func mountsUnder(t *testing.T, dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, dir) {
			out = append(out, l)
		}
	}
	return out
}
