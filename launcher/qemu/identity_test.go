package qemu_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// The job identity of these tests: nobody's uid with a primary group and
// supplementary groups that are not nobody's passwd group (65534) or what
// initgroups("nobody") gives, as a job's --gid and Slurm's group list can
// be.
const (
	jobUID = 65534
	jobGID = 4242
)

var jobGroups = []uint32{4242, 4243, 4244}

// vmEnv is what a real boot needs: guest assets and an erofs root disk.
type vmEnv struct {
	a    *assets.Assets
	disk string
	tmp  string
}

// newVMEnv builds the assets and a busybox root disk; extra is called on
// the root filesystem directory before the disk is made.
func newVMEnv(t testing.TB, ctx context.Context, osName string, extra func(rootfs string)) vmEnv {
	t.Helper()
	fixture.Require(t, "qemu-system-x86_64", "mkfs.erofs", "busybox")
	tmp := t.TempDir()
	a, err := assets.Ensure(ctx, assets.Options{Agent: fixture.Agent(t), CacheDir: filepath.Join(tmp, "assets")})
	if err != nil {
		t.Fatalf("assets: %v", err)
	}
	rootfs := filepath.Join(tmp, "rootfs")
	fixture.BusyboxRootfs(t, rootfs, osName)
	if extra != nil {
		extra(rootfs)
	}
	disk := filepath.Join(tmp, "root.erofs")
	fixture.Erofs(t, rootfs, disk)
	return vmEnv{a: a, disk: disk, tmp: tmp}
}

func (e vmEnv) driver(runAs bool) *qemu.Driver {
	accel := qemu.DetectAccel()
	return qemu.New(qemu.Options{
		Binary: "qemu-system-x86_64", Accel: accel, Kernel: e.a.Kernel, Initrd: e.a.Initrd,
		Cmdline: assets.KernelCmdline(accel), RunAs: runAs, Seccomp: true, PinTCG: true,
		BootTimeout: 90 * time.Second, StopGrace: 5 * time.Second,
	})
}

// stateDir is a fresh root-only state directory, as the launcher makes
// them: the VMM, not root, must get along without opening anything in it
// by name.
func (e vmEnv) stateDir(t testing.TB, name string) string {
	t.Helper()
	d := filepath.Join(e.tmp, name)
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func jobConfig(id, stateDir, disk string) driver.SandboxConfig {
	return driver.SandboxConfig{
		ID: id, StateDir: stateDir, CPUs: 1, MemoryMiB: 256, RootFS: driver.RootFS{Image: disk, OverlayMiB: 64},
		User: "nobody", UID: jobUID, GID: jobGID, Groups: jobGroups, Hostname: "guest-" + id,
	}
}

// serve starts the control socket of sb and returns a function running
// argv in it (output and status).
func serve(t *testing.T, ctx context.Context, sb driver.Sandbox, stateDir string) func(argv ...string) (string, driver.ExitStatus, error) {
	t.Helper()
	if err := sb.Listen(); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() { _ = sb.Serve(sctx) }()
	return func(argv ...string) (string, driver.ExitStatus, error) {
		c, err := control.Attach(ctx, stateDir)
		if err != nil {
			return "", driver.ExitStatus{}, err
		}
		defer c.Close()
		p, err := c.Exec(ctx, driver.ProcessSpec{Argv: argv, Env: []string{"HOME=/", "PATH=/bin:/usr/bin"}})
		if err != nil {
			return "", driver.ExitStatus{}, err
		}
		var out bytes.Buffer
		p.Relay(ctx, nil, &out, &out)
		st, err := p.Wait(ctx)
		return out.String(), st, err
	}
}

// procStatus returns the fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return m
}

// TestVMMIdentity: the VMM runs with exactly the job's numeric uid, gid
// and supplementary groups (the ones the mount check opens shares with),
// not with nobody's passwd group and initgroups() as QEMU's -runas would
// give; and it boots that way under the full seccomp sandbox
// (elevateprivileges=deny included) with a root-only state directory.
func TestVMMIdentity(t *testing.T) {
	fixture.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newVMEnv(t, ctx, "Identity OS", nil)
	stateDir := e.stateDir(t, "state")
	sb, err := e.driver(true).Start(ctx, jobConfig("ident", stateDir, e.disk))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = sb.Stop(context.Background()) })

	st := procStatus(t, sb.Pid())
	want := map[string]string{
		"Uid": strings.Repeat(strconv.Itoa(jobUID)+" ", 3) + strconv.Itoa(jobUID),
		"Gid": strings.Repeat(strconv.Itoa(jobGID)+" ", 3) + strconv.Itoa(jobGID),
	}
	groups := slices.Clone(jobGroups)
	if qemu.DetectAccel() == "kvm" {
		// The one documented addition: /dev/kvm's group when the job's
		// identity cannot open it.
		var kst syscall.Stat_t
		if err := syscall.Stat("/dev/kvm", &kst); err == nil && kst.Mode&0o006 != 0o006 && !slices.Contains(groups, kst.Gid) && kst.Uid != jobUID {
			groups = append(groups, kst.Gid)
		}
	}
	var gs []string
	for _, g := range groups {
		gs = append(gs, strconv.FormatUint(uint64(g), 10))
	}
	want["Groups"] = strings.Join(gs, " ")
	for k, v := range want {
		if st[k] != v {
			t.Errorf("VMM %s: %q, want %q (the job's identity)", k, st[k], v)
		}
	}
	if st["Seccomp"] != "2" {
		t.Errorf("VMM Seccomp: %q, want 2 (filter)", st["Seccomp"])
	}
	if st["CapEff"] != "0000000000000000" {
		t.Errorf("VMM CapEff: %q, want none", st["CapEff"])
	}
	// The console log is root's, 0644: the job's user reads it through
	// the state directory's ACL (--microvm-debug) but cannot write it,
	// and the VMM writes only the supervisor's pipe (console.go).
	var cst syscall.Stat_t
	if err := syscall.Stat(filepath.Join(stateDir, state.ConsoleLog), &cst); err != nil {
		t.Fatal(err)
	}
	if cst.Uid != 0 || cst.Mode&0o777 != 0o644 {
		t.Errorf("console.log: uid %d mode %o, want root's 0644 (a user-owned console lets the user write into root's log)", cst.Uid, cst.Mode&0o777)
	}
	run := serve(t, ctx, sb, stateDir)
	out, _, err := run("id")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "uid=65534") || !strings.Contains(out, "gid=4242") {
		t.Errorf("guest id: %q", out)
	}
}

// TestConsoleBounded floods the serial console from a guest root: the
// console log in the (tmpfs) state stops at the driver's bound with a note
// of what was dropped, and the guest is not blocked by it.
func TestConsoleBounded(t *testing.T) {
	fixture.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newVMEnv(t, ctx, "Console OS", nil)
	stateDir := e.stateDir(t, "state")
	const limit = 128 << 10
	accel := qemu.DetectAccel()
	d := qemu.New(qemu.Options{
		Binary: "qemu-system-x86_64", Accel: accel, Kernel: e.a.Kernel, Initrd: e.a.Initrd,
		Cmdline: assets.KernelCmdline(accel), RunAs: true, Seccomp: true,
		BootTimeout: 90 * time.Second, StopGrace: 5 * time.Second, ConsoleMaxBytes: limit,
	})
	cfg := jobConfig("console", stateDir, e.disk)
	cfg.User, cfg.UID, cfg.GID, cfg.Groups = "root", 0, 0, []uint32{0} // the workload is the guest's root
	sb, err := d.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = sb.Stop(context.Background()) })
	run := serve(t, ctx, sb, stateDir)
	out, st, err := run("sh", "-c", "dd if=/dev/zero bs=4096 count=128 2>/dev/null | tr '\\000' x >/dev/console; echo flooded")
	if err != nil || st.Code != 0 || !strings.Contains(out, "flooded") {
		t.Fatalf("flood: %q %+v %v", out, st, err)
	}
	_ = sb.Stop(context.Background())
	b, err := os.ReadFile(filepath.Join(stateDir, state.ConsoleLog))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > limit+200 {
		t.Errorf("console.log is %d bytes after a 512 KiB flood, want at most %d and a note", len(b), limit)
	}
	if !strings.Contains(string(b), "more bytes dropped") {
		t.Errorf("console.log has no note of the dropped bytes (%d bytes, ends %q)", len(b), b[max(0, len(b)-120):])
	}
}

// buildGuestRoot builds testdata/guestroot statically into rootfs, setuid
// root: the unprivileged job user becomes the guest's root with it.
func buildGuestRoot(t *testing.T, rootfs string) {
	t.Helper()
	bin := filepath.Join(rootfs, "bin", "guestroot")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./testdata/guestroot")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build guestroot: %v\n%s", err, out)
	}
	if err := os.Chown(bin, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(bin, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
}

// TestGuestRootInShare: a guest root's chown, setuid chmod and mknod in a
// writable share never make a root-owned file, a setuid or setgid file of
// anyone but the job's user, or a device node on the host. With
// runas = false (QEMU stays root, and would apply them), a share is
// refused before QEMU starts.
func TestGuestRootInShare(t *testing.T) {
	fixture.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := newVMEnv(t, ctx, "Guest Root OS", func(rootfs string) { buildGuestRoot(t, rootfs) })
	for _, tt := range []struct {
		name    string
		runAs   bool
		refused bool
	}{
		{name: "QEMU as the job's user", runAs: true},
		{name: "runas off refuses the share", runAs: false, refused: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			shareDir := filepath.Join(e.tmp, "share-"+strconv.FormatBool(tt.runAs))
			if err := os.Mkdir(shareDir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(shareDir, jobUID, jobGID); err != nil {
				t.Fatal(err)
			}
			dir, err := os.Open(shareDir)
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			stateDir := e.stateDir(t, "state-"+strconv.FormatBool(tt.runAs))
			cfg := jobConfig("groot", stateDir, e.disk)
			cfg.Shares = []driver.Share{{Dir: dir, Destination: "/scratch"}}
			sb, err := e.driver(tt.runAs).Start(ctx, cfg)
			if tt.refused {
				if err == nil {
					_ = sb.Stop(ctx)
				}
				if !errors.Is(err, qemu.ErrSharesNeedJobIdentity) || !strings.Contains(err.Error(), "qemu.runas") {
					t.Errorf("start with runas off and a share: err %v, want %v naming qemu.runas", err, qemu.ErrSharesNeedJobIdentity)
				}
			} else {
				if err != nil {
					t.Fatalf("start: %v", err)
				}
				defer sb.Stop(context.Background())
				run := serve(t, ctx, sb, stateDir)
				out, st, err := run("/bin/guestroot", "/scratch")
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("guest root in the share (status %v):\n%s", st, out)
				if !strings.Contains(out, "euid=0") {
					t.Fatalf("the helper did not become the guest's root: %q", out)
				}
				if !strings.Contains(out, "create: <nil>") {
					t.Fatalf("the guest could not write the share at all: %q", out)
				}
			}
			// The host side, whatever the guest reported.
			err = filepath.WalkDir(shareDir, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				var st syscall.Stat_t
				if err := syscall.Lstat(p, &st); err != nil {
					return err
				}
				switch {
				case st.Uid == 0 || st.Gid == 0:
					t.Errorf("%s is owned by %d:%d on the host", p, st.Uid, st.Gid)
				case st.Mode&syscall.S_IFMT == syscall.S_IFCHR || st.Mode&syscall.S_IFMT == syscall.S_IFBLK:
					t.Errorf("%s is a device node on the host (mode %#o)", p, st.Mode)
				case st.Mode&syscall.S_ISUID != 0 && st.Uid != jobUID:
					t.Errorf("%s is setuid %d on the host", p, st.Uid)
				case st.Mode&syscall.S_ISGID != 0 && !slices.Contains(jobGroups, st.Gid):
					t.Errorf("%s is setgid %d on the host, not a group of the job", p, st.Gid)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestVMMKilled: a VMM killed under a running task (an OOM kill, an admin's
// kill -9) is named as such in the task's error, not as a closed
// connection.
func TestVMMKilled(t *testing.T) {
	fixture.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newVMEnv(t, ctx, "Killed OS", nil)
	stateDir := e.stateDir(t, "state")
	sb, err := e.driver(true).Start(ctx, jobConfig("kill", stateDir, e.disk))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { _ = sb.Stop(context.Background()) })
	run := serve(t, ctx, sb, stateDir)
	type result struct {
		st  driver.ExitStatus
		err error
	}
	ch := make(chan result, 1)
	go func() {
		_, st, err := run("sleep", "60")
		ch <- result{st, err}
	}()
	time.Sleep(time.Second) // the task runs
	if err := syscall.Kill(sb.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal("the task did not end within 30s of its VMM's death")
	}
	const want = "the microVM's VMM exited: killed by signal 9 (SIGKILL)"
	if r.err == nil || !strings.Contains(r.err.Error(), want) || !errors.Is(r.err, driver.ErrSandboxExited) {
		t.Fatalf("task after kill -9 of its VMM: status %v, err %v; want %q", r.st, r.err, want)
	}
	t.Logf("task error: %v", r.err)
	// A task that attaches afterwards is told the same.
	_, _, err = run("true")
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("attach after the VMM's death: err %v, want %q", err, want)
	}
}

// TestShareLimit measures the share limit of -M microvm with real QEMU:
// qemu.MaxSharesMicrovm shares boot and are all mounted in the guest; one
// more is refused before QEMU starts, naming the limit. (Measured with
// this test and the check lifted: 22 shares make QEMU start but the guest
// hang in the last share's mount; 23 make QEMU fail with "No 'virtio-bus'
// bus found".)
func TestShareLimit(t *testing.T) {
	fixture.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newVMEnv(t, ctx, "Many Shares OS", nil)
	n := qemu.MaxSharesMicrovm
	var shares []driver.Share
	for i := 0; i <= n; i++ {
		d := filepath.Join(e.tmp, fmt.Sprintf("share%d", i))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "marker"), []byte(strconv.Itoa(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(d)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		shares = append(shares, driver.Share{Dir: f, Destination: fmt.Sprintf("/s%d", i), ReadOnly: true})
	}
	cfg := jobConfig("over", e.stateDir(t, "state-over"), e.disk)
	cfg.Shares = shares
	sb, err := e.driver(true).Start(ctx, cfg)
	var tm *qemu.TooManySharesError
	if !errors.As(err, &tm) || !strings.Contains(err.Error(), fmt.Sprintf("at most %d", n)) {
		if err == nil {
			_ = sb.Stop(ctx)
		}
		t.Fatalf("%d shares: err %v, want a refusal naming the limit %d", n+1, err, n)
	}
	t.Logf("%d shares: %v", n+1, err)

	stateDir := e.stateDir(t, "state-max")
	cfg = jobConfig("max", stateDir, e.disk)
	cfg.Shares = shares[:n]
	sb, err = e.driver(true).Start(ctx, cfg)
	if err != nil {
		con, _ := os.ReadFile(filepath.Join(stateDir, "console.log"))
		t.Fatalf("%d shares: %v\n%s", n, err, con)
	}
	defer sb.Stop(context.Background())
	run := serve(t, ctx, sb, stateDir)
	out, st, err := run("sh", "-c", fmt.Sprintf("cat /s0/marker; echo; cat /s%d/marker; echo; grep -c ' 9p ' /proc/mounts", n-1))
	if err != nil || st.Code != 0 {
		t.Fatalf("read the shares: %v %v %q", err, st, out)
	}
	if got, want := strings.Fields(out), []string{"0", strconv.Itoa(n - 1), strconv.Itoa(n)}; !slices.Equal(got, want) {
		t.Errorf("guest sees %q, want markers 0 and %d and %d 9p mounts", out, n-1, n)
	}
}
