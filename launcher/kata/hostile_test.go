package kata_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// hostileSandbox starts a Kata-driver sandbox with the runc shim (as
// TestSandboxWithRuncShim does), with extra entries planted in the image
// (symlinks a tenant could build into an image), and returns a raw agent
// API client on the step's control socket: a tenant speaks the API itself,
// not through the exec entry.
func hostileSandbox(t *testing.T, plant func(rootfs string), shares []driver.Share) (stateDir, img string, sb driver.Sandbox, c api.AgentService) {
	t.Helper()
	fixture.RequireRoot(t)
	fixture.Require(t, "containerd-shim-runc-v2", "runc", "mkfs.erofs", "busybox")
	// Under /run, entered by others (0711) as the runtime directory is:
	// what the job's user can reach is then decided by the modes the
	// driver sets, not by the test's temporary directory.
	tmp, err := os.MkdirTemp("/run", "smv-review-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	if err := os.Chmod(tmp, 0o711); err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(tmp, "rootfs")
	fixture.BusyboxRootfs(t, rootfs, "Kata Hostile Test")
	if plant != nil {
		plant(rootfs)
	}
	img = filepath.Join(tmp, "root.erofs")
	fixture.Erofs(t, rootfs, img)
	conf := filepath.Join(tmp, "configuration.toml")
	if err := os.WriteFile(conf, []byte(kataConf), 0o644); err != nil {
		t.Fatal(err)
	}
	stateDir = filepath.Join(tmp, "state")
	// The step's state directory: root's, searchable by the job's user
	// (the lifecycle grants it by ACL; 0711 here).
	if err := os.Mkdir(stateDir, 0o711); err != nil {
		t.Fatal(err)
	}
	d := kata.New(kata.Options{Mode: "shim", Shim: "/usr/bin/containerd-shim-runc-v2", Configuration: conf, Namespace: "smv-hostile", Init: fixture.Agent(t), StopGrace: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if err := d.Prepare(ctx, nil); err != nil {
		t.Fatal(err)
	}
	sb, err = d.Start(ctx, driver.SandboxConfig{
		ID: "9.0.0", StateDir: stateDir, CPUs: 1, MemoryMiB: 256,
		RootFS:   driver.RootFS{Image: img, OverlayMiB: 16},
		ImageEnv: []string{"PATH=/bin:/usr/bin"},
		UID:      65534, GID: 65534, Hostname: "kata-hostile",
		Shares: shares,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Stop(context.Background()) })
	if err := sb.Listen(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = sb.Serve(ctx) }()
	conn, err := net.Dial("unix", filepath.Join(stateDir, state.ControlSocket))
	if err != nil {
		t.Fatal(err)
	}
	tc := ttrpc.NewClient(conn)
	t.Cleanup(func() { tc.Close() })
	return stateDir, img, sb, api.NewAgentClient(tc)
}

// run starts argv through the raw API, reads stdout to EOF and waits.
func run(ctx context.Context, t *testing.T, c api.AgentService, argv []string, terminal bool) (string, *api.WaitResponse) {
	t.Helper()
	r, err := c.CreateProcess(ctx, &api.CreateProcessRequest{Argv: api.Bytes(argv), Terminal: terminal, Rows: 24, Cols: 80})
	if err != nil {
		t.Fatalf("CreateProcess %q: %v", argv, err)
	}
	if !terminal {
		if _, err := c.CloseStdin(ctx, &api.ProcessRequest{Id: r.Id}); err != nil {
			t.Fatalf("CloseStdin: %v", err)
		}
	}
	var out strings.Builder
	for _, s := range []api.Stream{api.Stream_STDOUT, api.Stream_STDERR} {
		for {
			o, err := c.ReadOutput(ctx, &api.ReadOutputRequest{Id: r.Id, Stream: s})
			if err != nil {
				t.Fatalf("ReadOutput: %v", err)
			}
			if o.Eof {
				break
			}
			if s == api.Stream_STDOUT {
				out.Write(o.Data)
			} else {
				t.Logf("stderr of %q: %s", argv, o.Data)
			}
		}
	}
	w, err := c.Wait(ctx, &api.ProcessRequest{Id: r.Id})
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	t.Logf("%q terminal=%v: exit %d signal %d, %d bytes of stdout", argv, terminal, w.ExitCode, w.Signal, out.Len())
	return out.String(), w
}

// TestHostileCredentials: every process a tenant creates runs as the job's
// uid and gid with no capability in any set and no_new_privs, with or
// without a terminal.
func TestHostileCredentials(t *testing.T) {
	_, _, _, c := hostileSandbox(t, nil, nil)
	ctx := context.Background()
	for _, terminal := range []bool{false, true} {
		out, _ := run(ctx, t, c, []string{"cat", "/proc/self/status"}, terminal)
		fields := map[string]string{}
		for _, l := range strings.Split(out, "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok {
				fields[k] = strings.Join(strings.Fields(v), " ")
			}
		}
		want := map[string]string{
			"Uid": "65534 65534 65534 65534", "Gid": "65534 65534 65534 65534",
			"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
			"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
		}
		for k, v := range want {
			if fields[k] != v {
				t.Errorf("terminal=%v: %s = %q, want %q", terminal, k, fields[k], v)
			}
		}
	}
}

// TestHostileProcessResourcesReleased: a process that was waited for
// leaves nothing in the supervisor (the broker): no FIFO directory, no open
// FIFO descriptor. A tenant that runs many short processes through its
// control socket (a loop of `true`) must not grow the root supervisor's
// descriptors and state without bound.
func TestHostileProcessResourcesReleased(t *testing.T) {
	stateDir, _, _, c := hostileSandbox(t, nil, nil)
	ctx := context.Background()
	ioDir := filepath.Join(stateDir, "kata", "io")
	fifoFDs := func() int {
		n := 0
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(l, ioDir) {
				n++
			}
		}
		return n
	}
	const n = 20
	for i := 0; i < n; i++ {
		run(ctx, t, c, []string{"true"}, false)
	}
	time.Sleep(200 * time.Millisecond)
	ents, _ := os.ReadDir(ioDir)
	if len(ents) > 0 || fifoFDs() > 0 {
		t.Errorf("after %d processes ran and were waited for, the supervisor holds %d FIFO directories in %s and %d FIFO descriptors (want 0: released at Wait)", n, len(ents), ioDir, fifoFDs())
	}
}

// TestHostileImageSymlinks: symlinks a tenant builds into its image at
// the share destination and at the init's mount point lead to host paths;
// mounting the sandbox must not follow them out of the bundle's rootfs (a
// bind over a host directory would outlive the step or hide host files).
func TestHostileImageSymlinks(t *testing.T) {
	host := filepath.Join("/root/review-scratch", "hostile-target-"+strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.MkdirAll(host, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(host)
	if err := os.WriteFile(filepath.Join(host, "canary"), []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	share := t.TempDir()
	if err := os.WriteFile(filepath.Join(share, "f"), []byte("SHARED\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, err := os.Open(share)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	plant := func(rootfs string) {
		for name, target := range map[string]string{"data": host, ".slurm-microvm": host} {
			if err := os.Symlink(target, filepath.Join(rootfs, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, _, sb, c := hostileSandbox(t, plant, []driver.Share{{Dir: dir, Destination: "/data", ReadOnly: true}})
	// The share follows the symlink inside the rootfs (runc's securejoin:
	// the container's own view, where the init's mount, whose mount point
	// is the same symlink, then stacks on it): not a host path.
	run(context.Background(), t, c, []string{"true"}, false)
	if pid := sb.Pid(); pid > 0 {
		mi, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "mountinfo"))
		if strings.Contains(string(mi), host) {
			t.Errorf("a mount on the host directory %s in the shim's mount namespace", host)
		}
	}
	// Seen from the host's mount namespace and from the shim's: the host
	// directory the symlinks name is untouched.
	if b, err := os.ReadFile(filepath.Join(host, "canary")); err != nil || string(b) != "host\n" {
		t.Errorf("host canary: %q %v", b, err)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), host) {
		t.Errorf("a mount on the host directory %s: %s", host, mi)
	}
}

// TestHostileNothingLeftAfterStop: after Stop, nothing of the sandbox is
// left on the host: the shim's task socket in /run/containerd/s, runc's
// state of the container, the loop device of the image, the shim process.
func TestHostileNothingLeftAfterStop(t *testing.T) {
	stateDir, img, sb, c := hostileSandbox(t, nil, nil)
	run(context.Background(), t, c, []string{"true"}, false)
	rec := readKataRecord(t, stateDir)
	if err := sb.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	for _, p := range []string{rec.Shim.Socket, filepath.Join("/run/containerd/runc", rec.Shim.Namespace, rec.Shim.ID)} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("left after Stop: %s", p)
		}
	}
	out, _ := exec.Command("losetup", "-j", img).CombinedOutput()
	if strings.TrimSpace(string(out)) != "" {
		t.Errorf("loop device of the image left after Stop: %s", out)
	}
	if rec.Shim.Pid > 0 {
		if cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(rec.Shim.Pid), "cmdline")); err == nil && strings.Contains(string(cmd), "containerd-shim") {
			t.Errorf("shim pid %d alive after Stop", rec.Shim.Pid)
		}
	}
}

// TestHostileTerminalStdinEOF: the end of a terminal task's stdin (srun
// --pty with stdin from a file or /dev/null) is the EOF character, as the
// QEMU driver's agent sends it (launcher/agent/guest CloseStdin): the task
// keeps its terminal and its output. The broker's CloseStdin closes the
// FIFO and calls CloseIO, and the runc shim then hangs the terminal up:
// the task dies of SIGHUP before its output (seen 1 in 6 runs with an
// immediate close, every run with a short sleep first).
func TestHostileTerminalStdinEOF(t *testing.T) {
	_, _, _, c := hostileSandbox(t, nil, nil)
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		argv []string
		out  string
	}{
		{"output after stdin ended", []string{"sh", "-c", "sleep 0.5; echo OUT"}, "OUT"},
		{"cat ends at EOF", []string{"sh", "-c", "cat; echo DONE"}, "DONE"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := c.CreateProcess(ctx, &api.CreateProcessRequest{Argv: api.Bytes(tt.argv), Terminal: true, Rows: 24, Cols: 80})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.CloseStdin(ctx, &api.ProcessRequest{Id: r.Id}); err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			for {
				o, err := c.ReadOutput(ctx, &api.ReadOutputRequest{Id: r.Id, Stream: api.Stream_STDOUT})
				if err != nil {
					t.Fatal(err)
				}
				if o.Eof {
					break
				}
				out.Write(o.Data)
			}
			w, err := c.Wait(ctx, &api.ProcessRequest{Id: r.Id})
			if err != nil {
				t.Fatal(err)
			}
			if w.Signal != 0 || w.ExitCode != 0 || !strings.Contains(out.String(), tt.out) {
				t.Errorf("exit %d signal %d output %q, want exit 0 and %q", w.ExitCode, w.Signal, out.String(), tt.out)
			}
		})
	}
}

// TestHostileShimKilledCleanup: after the shim dies by SIGKILL (scancel
// kills every process of the step's cgroup; the supervisor may die with
// it), the driver's Cleanup from the step's records, as stop or gc run it
// in a fresh process, leaves nothing: no process of the sandbox (its init
// and tasks run as the job's user), no runc state, no loop device of the
// image, no shim socket.
func TestHostileShimKilledCleanup(t *testing.T) {
	stateDir, img, sb, c := hostileSandbox(t, nil, nil)
	ctx := context.Background()
	r, err := c.CreateProcess(ctx, &api.CreateProcessRequest{Argv: api.Bytes([]string{"sleep", "300"})})
	if err != nil {
		t.Fatal(err)
	}
	rec := readKataRecord(t, stateDir)
	if err := syscall.Kill(rec.Shim.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sb.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the shim died")
	}
	d := kata.New(kata.Options{Mode: "shim", Shim: "/usr/bin/containerd-shim-runc-v2", Namespace: "smv-hostile"})
	if err := d.Cleanup(ctx, stateDir); err != nil {
		t.Fatalf("Cleanup after the shim died: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	if r.Pid > 0 {
		if cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(int(r.Pid)), "cmdline")); err == nil && strings.Contains(string(cmd), "sleep") {
			t.Errorf("the task's process (pid %d) alive after Cleanup", r.Pid)
		}
	}
	for _, p := range []string{rec.Shim.Socket, filepath.Join("/run/containerd/runc", rec.Shim.Namespace, rec.Shim.ID), filepath.Join(stateDir, "kata")} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("left after Cleanup: %s", p)
		}
	}
	out, _ := exec.Command("losetup", "-j", img).CombinedOutput()
	if strings.TrimSpace(string(out)) != "" {
		t.Errorf("loop device of the image left after Cleanup: %s", out)
	}
}

// TestHostileCleanupKeepsShareContent: in mode containerd the shares are
// attached on the host under <state>/kata/mnt/shares/<i>, and the record
// that lists them (kata.json) is written only after mountTree returns
// (sandbox.go). A supervisor killed in between (scancel while the step
// boots) leaves a share attached and unrecorded; Cleanup then removes the
// kata directory recursively, through the share's mount, as root: the
// user's files in a read-write share (or anyone's, in a group share) are
// deleted. This test makes that state by hand (a bind of the share where
// mountTree attaches it, no record) and runs Cleanup as stop or gc would.
func TestHostileCleanupKeepsShareContent(t *testing.T) {
	fixture.RequireRoot(t)
	tmp := t.TempDir()
	share := filepath.Join(tmp, "users-share")
	if err := os.MkdirAll(share, 0o755); err != nil {
		t.Fatal(err)
	}
	precious := filepath.Join(share, "results.dat")
	if err := os.WriteFile(precious, []byte("months of work\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(tmp, "state")
	target := filepath.Join(stateDir, "kata", "mnt", "shares", "0")
	if err := os.MkdirAll(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(share, target, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(target, syscall.MNT_DETACH)
	d := kata.New(kata.Options{Mode: "containerd", Namespace: "smv-hostile"})
	err := d.Cleanup(context.Background(), stateDir)
	if _, serr := os.Stat(precious); serr != nil {
		t.Errorf("Cleanup (err %v) deleted the content of a share still attached under the state directory: %v", err, serr)
	}
}

// TestHostileShimSocketsUnreachable: the job's user can connect to the
// step's control socket and to neither the shim's task API socket nor its
// events socket (whose APIs could create a container with any spec).
func TestHostileShimSocketsUnreachable(t *testing.T) {
	fixture.Require(t, "/usr/bin/python3")
	stateDir, _, _, _ := hostileSandbox(t, nil, nil)
	b, err := os.ReadFile(filepath.Join(stateDir, "kata.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Shim struct{ Socket, Events string } `json:"shim"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	connect := func(path string) string {
		cmd := exec.Command("/usr/bin/python3", "-c", "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect(sys.argv[1]); print('connected')\nexcept OSError as e:\n print(type(e).__name__)", path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("connect as 65534 to %s: %v: %s", path, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, tt := range []struct{ path, want string }{
		{filepath.Join(stateDir, state.ControlSocket), "connected"},
		{rec.Shim.Socket, "PermissionError"},
		{rec.Shim.Events, "PermissionError"},
	} {
		if got := connect(tt.path); got != tt.want {
			t.Errorf("the job's user connecting to %s: %s, want %s", tt.path, got, tt.want)
		}
	}
}

// kataRecord is the part of the driver's kata.json the tests read.
type kataRecord struct {
	Shim struct {
		ID, Namespace, Socket string
		Pid                   int
	} `json:"shim"`
}

// readKataRecord reads the driver's record in stateDir.
func readKataRecord(t *testing.T, stateDir string) kataRecord {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, "kata.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec kataRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}
