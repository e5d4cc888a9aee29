package qemu_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// TestBootExecStop boots a real microVM (TCG here) with a busybox erofs
// root, runs processes in it through the control socket, and stops it.
func TestBootExecStop(t *testing.T) {
	fixture.Require(t, "qemu-system-x86_64", "mkfs.erofs", "busybox")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	a, err := assets.Ensure(ctx, assets.Options{Agent: fixture.Agent(t), CacheDir: filepath.Join(tmp, "assets")})
	if err != nil {
		t.Fatalf("assets: %v", err)
	}
	rootfs := filepath.Join(tmp, "rootfs")
	fixture.BusyboxRootfs(t, rootfs, "Microvm Test OS")
	disk := filepath.Join(tmp, "root.erofs")
	fixture.Erofs(t, rootfs, disk)
	stateDir := filepath.Join(tmp, "state")
	if err := os.Mkdir(stateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	user := ""
	if uid == 0 {
		// Run the guest processes, and QEMU, as nobody.
		uid, gid = 65534, 65534
	}
	accel := qemu.DetectAccel()
	d := qemu.New(qemu.Options{
		Binary: "qemu-system-x86_64", Accel: accel, Kernel: a.Kernel, Initrd: a.Initrd,
		Cmdline: assets.KernelCmdline(accel), Seccomp: true, RunAs: true,
		BootTimeout: 90 * time.Second, StopGrace: 5 * time.Second,
	})
	t0 := time.Now()
	var logBuf bytes.Buffer
	sb, err := d.Start(ctx, driver.SandboxConfig{
		ID: "test", StateDir: stateDir, CPUs: 1, MemoryMiB: 256, RootFS: driver.RootFS{Image: disk, OverlayMiB: 64},
		User: user, UID: uid, GID: gid, Groups: []uint32{gid}, Hostname: "guest-test",
		Logger: slog.New(slog.NewTextHandler(&logBuf, nil)),
	})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Logf("boot to agent ready: %v (accel %s)", time.Since(t0), accel)
	// The real agent sends its boot marks: the timeline has a kernel, a
	// module and a set-up part, and its parts add up to its total.
	tl := regexp.MustCompile(`msg="boot timeline" total_ms=([\d.]+) vmm_ms=([\d.]+) kernel_ms=([\d.]+) modules_ms=([\d.]+) agent_init_ms=([\d.]+) setup_wait_ms=([\d.]+) setup_ms=([\d.]+)`).FindStringSubmatch(logBuf.String())
	if tl == nil {
		t.Fatalf("no boot timeline logged:\n%s", logBuf.String())
	}
	var parts [7]float64
	for i := range parts {
		parts[i], _ = strconv.ParseFloat(tl[i+1], 64)
	}
	if sum := parts[1] + parts[2] + parts[3] + parts[4] + parts[5] + parts[6]; parts[2] <= 0 || parts[3] <= 0 || parts[6] <= 0 || sum < parts[0]-0.01 || sum > parts[0]+0.01 {
		t.Errorf("boot timeline %v: want kernel, modules and set-up parts that add up to the total", parts)
	}
	vmmPid := sb.Pid()
	t.Cleanup(func() {
		_ = sb.Stop(context.Background())
		if err := syscall.Kill(vmmPid, 0); err == nil {
			t.Errorf("VMM pid %d still alive after Stop", vmmPid)
		}
	})
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	if err := sb.Listen(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = sb.Serve(sctx) }()
	sock := filepath.Join(stateDir, "control.sock")
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket: %v, mode %v; want 0600", err, fi.Mode())
	}

	hostBoot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	run := func(argv ...string) (string, driver.ExitStatus) {
		t.Helper()
		return runArgv(t, ctx, stateDir, argv...)
	}
	tests := []struct {
		argv  []string
		check func(string, driver.ExitStatus) error
	}{
		{[]string{"cat", "/etc/os-release"}, func(out string, _ driver.ExitStatus) error {
			if !strings.Contains(out, "Microvm Test OS") {
				return errors.New("not the image's os-release")
			}
			return nil
		}},
		{[]string{"uname", "-r"}, func(out string, _ driver.ExitStatus) error {
			if strings.TrimSpace(out) != a.KernelVersion {
				return errors.New("not the guest kernel " + a.KernelVersion)
			}
			return nil
		}},
		{[]string{"cat", "/proc/sys/kernel/random/boot_id"}, func(out string, _ driver.ExitStatus) error {
			if out == string(hostBoot) || len(out) < 30 {
				return errors.New("boot_id is the host's")
			}
			return nil
		}},
		{[]string{"id", "-u"}, func(out string, _ driver.ExitStatus) error {
			if strings.TrimSpace(out) != strconv.FormatUint(uint64(uid), 10) {
				return errors.New("wrong uid")
			}
			return nil
		}},
		{[]string{"sh", "-c", "exit 7"}, func(_ string, st driver.ExitStatus) error {
			if st.Code != 7 {
				return errors.New("exit code not 7")
			}
			return nil
		}},
		{[]string{"sh", "-c", "kill -TERM $$"}, func(_ string, st driver.ExitStatus) error {
			if st.Signal != syscall.SIGTERM {
				return errors.New("not killed by SIGTERM")
			}
			return nil
		}},
		{[]string{"sh", "-c", "echo x > /tmp/f && cat /tmp/f && touch /etc/new"}, func(out string, st driver.ExitStatus) error {
			if !strings.HasPrefix(out, "x\n") {
				return errors.New("tmpfs overlay not writable")
			}
			return nil
		}},
	}
	for _, tt := range tests {
		out, st := run(tt.argv...)
		if err := tt.check(out, st); err != nil {
			t.Errorf("%v: %v (output %q, status %v)", tt.argv, err, out, st)
		}
	}
	c, err := control.Attach(ctx, stateDir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, driver.ProcessSpec{Argv: []string{"no-such-cmd"}})
	c.Close()
	if !errors.Is(err, driver.ErrCommandNotFound) {
		t.Errorf("missing command: err %v, want ErrCommandNotFound", err)
	}
	t1 := time.Now()
	if err := sb.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Done():
	default:
		t.Fatal("Stop returned with the VMM running")
	}
	t.Logf("stop: %v", time.Since(t1))
	if con, err := os.ReadFile(filepath.Join(stateDir, "console.log")); err == nil {
		t.Logf("guest console:\n%s", con)
	}
}

// TestBootFailsFast: a guest that cannot set itself up (here: a share whose
// destination is a file in the image) fails Start with the guest's reason
// within seconds, and leaves no VMM behind.
func TestBootFailsFast(t *testing.T) {
	fixture.Require(t, "qemu-system-x86_64", "mkfs.erofs", "busybox")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	a, err := assets.Ensure(ctx, assets.Options{Agent: fixture.Agent(t), CacheDir: filepath.Join(tmp, "assets")})
	if err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(tmp, "rootfs")
	fixture.BusyboxRootfs(t, rootfs, "Fail Fast OS")
	disk := filepath.Join(tmp, "root.erofs")
	fixture.Erofs(t, rootfs, disk)
	shareDir := t.TempDir()
	if err := os.Chmod(shareDir, 0o755); err != nil { // QEMU runs as nobody
		t.Fatal(err)
	}
	share, err := os.Open(shareDir)
	if err != nil {
		t.Fatal(err)
	}
	defer share.Close()
	stateDir := filepath.Join(tmp, "state")
	if err := os.Mkdir(stateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	accel := qemu.DetectAccel()
	d := qemu.New(qemu.Options{
		Binary: "qemu-system-x86_64", Accel: accel, Kernel: a.Kernel, Initrd: a.Initrd,
		Cmdline: assets.KernelCmdline(accel), RunAs: true, BootTimeout: 90 * time.Second, StopGrace: 5 * time.Second,
	})
	t0 := time.Now()
	sb, err := d.Start(ctx, driver.SandboxConfig{
		ID: "fail", StateDir: stateDir, CPUs: 1, MemoryMiB: 256, RootFS: driver.RootFS{Image: disk, OverlayMiB: 64},
		UID: 65534, GID: 65534, Shares: []driver.Share{{Dir: share, Destination: "/etc/os-release", ReadOnly: true}},
	})
	if err == nil {
		_ = sb.Stop(ctx)
		t.Fatal("Start succeeded with a share over a file")
	}
	if !strings.Contains(err.Error(), "/etc/os-release") {
		t.Errorf("error %q does not name the destination", err)
	}
	if took := time.Since(t0); took > 30*time.Second {
		t.Errorf("failed after %v: the guest's error must end the start at once", took)
	}
	t.Logf("failed in %v: %v", time.Since(t0), err)
}
