package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/kata/taskapi"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// noSubreaperEnv makes TestMain leave the test process a plain process
// (TestStartNeedsSubreaper's child).
const noSubreaperEnv = "SMV_SHIM_TEST_NO_SUBREAPER"

func TestMain(m *testing.M) {
	if os.Getenv(noSubreaperEnv) == "1" {
		os.Exit(m.Run())
	}
	if err := BecomeSubreaper(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	// runc's root of the test namespace (runc makes it, never removes it).
	_ = os.Remove("/run/containerd/runc/" + testNamespace)
	os.Exit(code)
}

// debianShim is Debian's containerd 1.6 runc shim (task API v2, bare
// address on start), the stand-in for containerd-shim-kata-v2.
const debianShim = "/usr/bin/containerd-shim-runc-v2"

// v3ShimModule is the containerd 2.x runc shim built for the v3 test.
const (
	v3ShimPackage = "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	v3ShimVersion = "v2.4.2"
)

// testShim is one shim binary the tests run against.
type testShim struct {
	name    string
	binary  func(t *testing.T) string
	version int // task API version it must announce
}

var testShims = []testShim{
	{name: "containerd-1.6", binary: debianShimBinary, version: 2},
	{name: "containerd-" + v3ShimVersion, binary: v3ShimBinary, version: 3},
}

func needRunc(t *testing.T) {
	t.Helper()
	prereq.Root(t, "runs containers with runc under a containerd shim")
	prereq.Tools(t, "runc", "busybox")
}

func debianShimBinary(t *testing.T) string {
	t.Helper()
	needRunc(t)
	if _, err := os.Stat(debianShim); err != nil {
		prereq.Missing(t, "%s is missing (Debian package containerd; hack/setup-debian.sh)", debianShim)
	}
	return debianShim
}

// v3ShimBinary builds containerd's 2.x runc shim (task API v3, protobuf
// bootstrap) once into the user cache: one binary of about 21 MB, in a
// directory holding only the current version (older ones are removed).
func v3ShimBinary(t *testing.T) string {
	t.Helper()
	needRunc(t)
	if testing.Short() {
		prereq.OptIn(t, "-short: builds containerd's %s runc shim (about 20 s)", v3ShimVersion)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatalf("user cache dir: %v", err)
	}
	root := filepath.Join(cache, "slurm-microvm", "containerd-shim")
	dir := filepath.Join(root, v3ShimVersion)
	bin := filepath.Join(dir, "containerd-shim-runc-v2")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	old, _ := os.ReadDir(root)
	for _, e := range old {
		_ = os.RemoveAll(filepath.Join(root, e.Name()))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		prereq.Missing(t, "go is not in PATH (it builds containerd's %s runc shim)", v3ShimVersion)
	}
	cmd := exec.Command(gobin, "install", v3ShimPackage+"@"+v3ShimVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-buildvcs=false", "CGO_ENABLED=0")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		prereq.Missing(t, "build %s@%s (needs the Go module proxy): %v\n%s", v3ShimPackage, v3ShimVersion, err, out)
	}
	return bin
}

var seq atomic.Int64

// sandbox is one test sandbox: a bundle with a busybox rootfs and a
// private state directory.
type sandbox struct {
	id, ns, base, bundle, state string
}

const testNamespace = "smv-shim-test"

// newSandbox lays out <tmp>/<id>/{config.json,rootfs} with an init that
// sleeps, and <tmp>/state. The id is unique on the node (runc's state is
// keyed by namespace and id; other worktrees run these tests too).
func newSandbox(t *testing.T, id string) sandbox {
	t.Helper()
	if id == "" {
		id = fmt.Sprintf("t%d-%d", os.Getpid(), seq.Add(1))
	}
	// Not t.TempDir: the test names make its path too long for the
	// sockets in the state directory.
	base, err := os.MkdirTemp("", "smv-shim-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	sb := sandbox{id: id, ns: testNamespace, base: base, bundle: filepath.Join(base, id), state: filepath.Join(base, "state")}
	rootfs := filepath.Join(sb.bundle, "rootfs")
	for _, d := range []string{filepath.Join(rootfs, "bin"), filepath.Join(rootfs, "proc"), filepath.Join(rootfs, "dev"), filepath.Join(rootfs, "tmp"), sb.state} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		prereq.Missing(t, "busybox is missing (busybox-static; hack/setup-debian.sh)")
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "cat", "sleep", "stty", "echo"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	spec := &specs.Spec{
		Version:  specs.Version,
		Process:  process(false, "busybox", "sleep", "1000"),
		Root:     &specs.Root{Path: rootfs},
		Hostname: "shimtest",
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace},
			},
		},
	}
	b, err := json.MarshalIndent(spec, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sb.bundle, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return sb
}

func process(terminal bool, args ...string) *specs.Process {
	return &specs.Process{
		Terminal:        terminal,
		Args:            append([]string{"/bin/" + args[0]}, args[1:]...),
		Env:             []string{"PATH=/bin", "TERM=dumb"},
		Cwd:             "/",
		NoNewPrivileges: true,
	}
}

func (sb sandbox) options(bin string, log *slog.Logger) Options {
	return Options{Binary: bin, ID: sb.id, Namespace: sb.ns, Bundle: sb.bundle, StateDir: sb.state, Logger: log}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tlogWriter struct{ t *testing.T }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// fifo creates a FIFO in dir and, for a reader, opens it in the background
// and returns what was read once the writer (the shim) closes it.
func fifo(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := unix.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func readFifo(t *testing.T, p string) <-chan string {
	t.Helper()
	var buf fixture.SyncBuffer
	done := streamFifo(p, &buf)
	ch := make(chan string, 1)
	go func() { <-done; ch <- buf.String() }()
	return ch
}

// streamFifo opens the FIFO p for reading in the background (the open
// waits for the shim's write end) and copies it into buf; done is closed
// at EOF.
func streamFifo(p string, buf *fixture.SyncBuffer) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.Open(p)
		if err != nil {
			fmt.Fprintf(buf, "open: %v", err)
			return
		}
		defer f.Close()
		_, _ = io.Copy(buf, f)
	}()
	return done
}

// waitFor waits up to 10 s for buf to contain want.
func waitFor(t *testing.T, buf *fixture.SyncBuffer, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(buf.String(), want) {
			return
		}
	}
	t.Fatalf("output %q: no %q after 10 s", buf.String(), want)
}

func recv(t *testing.T, ch <-chan string, what string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: nothing after 20 s", what)
		return ""
	}
}

// runcState is where Debian's runc shim keeps runc's state of the
// container (process.RuncRoot/<namespace>/<id>).
func runcState(sb sandbox) string { return filepath.Join("/run/containerd/runc", sb.ns, sb.id) }

// assertGone checks that nothing of the shim r is left: no shim process,
// no socket, no events socket, no runc state for the id, no log FIFO.
func assertGone(t *testing.T, r Record, sb sandbox) {
	t.Helper()
	fd, err := sameProcess(r.Pid, r.StartTime)
	if err != nil {
		t.Errorf("check shim pid %d: %v", r.Pid, err)
	}
	if fd >= 0 {
		unix.Close(fd)
		t.Errorf("shim pid %d still runs", r.Pid)
	}
	for _, p := range []string{r.Socket, r.DebugSocket, r.Events, runcState(sb), filepath.Join(sb.bundle, "log")} {
		if p == "" {
			continue
		}
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left (%v)", p, err)
		}
	}
}

// startInit starts a shim, creates the container and starts its init.
func startInit(t *testing.T, ctx context.Context, ts testShim, sb sandbox) (*Shim, taskapi.Service) {
	t.Helper()
	s := startShim(t, ctx, ts, sb)
	return s, createInit(t, ctx, s, sb)
}

// startShim starts a shim for sb and removes it at the end of the test.
func startShim(t *testing.T, ctx context.Context, ts testShim, sb sandbox) *Shim {
	t.Helper()
	s, err := Start(ctx, sb.options(ts.binary(t), testLogger(t)))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := Cleanup(context.Background(), s.Record(), testLogger(t)); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	})
	if got := s.Record().Version; got != ts.version {
		t.Errorf("task API version = %d, want %d", got, ts.version)
	}
	// A 2.x shim with -debug (the test logger is at debug) serves a debug
	// socket, which Cleanup must know to remove.
	if ts.version == 3 {
		if _, err := os.Stat(s.Record().DebugSocket); err != nil {
			t.Errorf("the debug socket of the %s shim: %v", ts.name, err)
		}
	}
	return s
}

// createInit creates the container of sb and starts its init.
func createInit(t *testing.T, ctx context.Context, s *Shim, sb sandbox) taskapi.Service {
	t.Helper()
	svc := s.Service()
	b, err := os.ReadFile(filepath.Join(sb.bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Create(ctx, taskapi.CreateOptions{Bundle: sb.bundle, Spec: &spec}); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if _, err := svc.Start(ctx, ""); err != nil {
		t.Fatalf("Start init: %v", err)
	}
	return svc
}

func rssKiB(t *testing.T, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// TestLifecycle drives a real shim and runc through the task API the Kata
// driver uses: create, start, exec with stdio FIFOs and an exit code,
// stdin and CloseIO, a terminal and ResizePty, a signalled exec, delete,
// shutdown; and checks that nothing is left.
func TestLifecycle(t *testing.T) {
	for _, ts := range testShims {
		t.Run(ts.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			sb := newSandbox(t, "")
			began := time.Now()
			s, svc := startInit(t, ctx, ts, sb)
			io := t.TempDir()

			// First exec: the figure "Start to a running exec".
			out, errp := fifo(t, io, "out"), fifo(t, io, "err")
			outc, errc := readFifo(t, out), readFifo(t, errp)
			if err := svc.Exec(ctx, "e1", process(false, "sh", "-c", "echo out; echo err >&2; exit 3"), taskapi.IO{Stdout: out, Stderr: errp}); err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if _, err := svc.Start(ctx, "e1"); err != nil {
				t.Fatalf("Start exec: %v", err)
			}
			t.Logf("FIGURE %s: Start to a running exec: %d ms; shim RSS %d KiB", ts.name, time.Since(began).Milliseconds(), rssKiB(t, s.Pid()))
			exit, err := svc.Wait(ctx, "e1")
			if err != nil || exit.Status != 3 {
				t.Errorf("Wait e1 = %+v, %v; want status 3", exit, err)
			}
			if o, e := recv(t, outc, "stdout"), recv(t, errc, "stderr"); o != "out\n" || e != "err\n" {
				t.Errorf("stdout %q stderr %q, want out/err", o, e)
			}
			if _, err := svc.Delete(ctx, "e1"); err != nil {
				t.Errorf("Delete e1: %v", err)
			}

			cases := []struct {
				name     string
				proc     *specs.Process
				terminal bool
				drive    func(t *testing.T, id string, stdin *os.File, out *fixture.SyncBuffer)
				status   uint32
				want     string // in stdout
			}{
				{
					name: "stdin EOF by CloseIO",
					proc: process(false, "cat"),
					drive: func(t *testing.T, id string, stdin *os.File, out *fixture.SyncBuffer) {
						if _, err := stdin.WriteString("hello\n"); err != nil {
							t.Fatal(err)
						}
						// The runc shim opens its read end of the FIFO in
						// the background; data lost if the last writer
						// goes first. Seeing the echo proves it is open.
						waitFor(t, out, "hello")
						// The shim holds a write end of the FIFO too (so
						// that a caller reopening it gives no EOF): the
						// process sees EOF only after CloseIO.
						stdin.Close()
						if err := svc.CloseIO(ctx, id); err != nil {
							t.Fatalf("CloseIO: %v", err)
						}
					},
					want: "hello\n",
				},
				{
					name:     "terminal and ResizePty",
					proc:     process(true, "sh", "-c", "read x; stty size"),
					terminal: true,
					drive: func(t *testing.T, id string, stdin *os.File, _ *fixture.SyncBuffer) {
						if err := svc.ResizePty(ctx, id, 91, 27); err != nil {
							t.Fatalf("ResizePty: %v", err)
						}
						if _, err := stdin.WriteString("\n"); err != nil {
							t.Fatal(err)
						}
					},
					want: "27 91",
				},
				{
					name: "SIGTERM of an exec",
					proc: process(false, "sleep", "1000"),
					drive: func(t *testing.T, id string, _ *os.File, _ *fixture.SyncBuffer) {
						if err := svc.Kill(ctx, id, syscall.SIGTERM, false); err != nil {
							t.Fatalf("Kill: %v", err)
						}
					},
					status: 128 + uint32(syscall.SIGTERM),
				},
			}
			for i, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					id := fmt.Sprintf("e%d", i+2)
					dir := t.TempDir()
					in, out := fifo(t, dir, "in"), fifo(t, dir, "out")
					var outBuf fixture.SyncBuffer
					outDone := streamFifo(out, &outBuf)
					// Read-write: opening does not wait for the shim, and
					// only CloseIO can give the process EOF.
					stdin, err := os.OpenFile(in, os.O_RDWR, 0)
					if err != nil {
						t.Fatal(err)
					}
					defer stdin.Close()
					tio := taskapi.IO{Stdin: in, Stdout: out, Terminal: c.terminal}
					if !c.terminal {
						tio.Stderr = out
					}
					if err := svc.Exec(ctx, id, c.proc, tio); err != nil {
						t.Fatalf("Exec: %v", err)
					}
					if _, err := svc.Start(ctx, id); err != nil {
						t.Fatalf("Start: %v", err)
					}
					c.drive(t, id, stdin, &outBuf)
					wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
					defer wcancel()
					exit, err := svc.Wait(wctx, id)
					if err != nil || exit.Status != c.status {
						t.Errorf("Wait = %+v, %v; want status %d", exit, err, c.status)
					}
					select {
					case <-outDone:
					case <-time.After(20 * time.Second):
						t.Fatalf("stdout: no EOF after 20 s (so far %q)", outBuf.String())
					}
					if got := outBuf.String(); !strings.Contains(got, c.want) {
						t.Errorf("stdout %q, want it to contain %q", got, c.want)
					}
					if _, err := svc.Delete(ctx, id); err != nil {
						t.Errorf("Delete: %v", err)
					}
				})
			}

			if err := svc.Ping(ctx); err != nil {
				t.Errorf("Ping: %v", err)
			}
			if err := svc.Kill(ctx, "", syscall.SIGKILL, true); err != nil {
				t.Errorf("Kill init: %v", err)
			}
			if exit, err := svc.Wait(ctx, ""); err != nil || exit.Status != 128+uint32(syscall.SIGKILL) {
				t.Errorf("Wait init = %+v, %v; want 137", exit, err)
			}
			if _, err := svc.Delete(ctx, ""); err != nil {
				t.Errorf("Delete: %v", err)
			}
			t0 := time.Now()
			if err := svc.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			if d := time.Since(t0); d > 5*time.Second {
				t.Errorf("Shutdown took %v (the events server should keep teardown short)", d)
			}
			select {
			case <-s.Exited():
			default:
				t.Error("Shutdown returned before the shim was reaped")
			}
			assertGone(t, s.Record(), sb)
		})
	}
}

// TestCleanupAfterCrash leaves a running sandbox behind as a crashed
// launcher would (its connection, events server and log reader closed;
// optionally the shim killed too) and checks that Cleanup from the Record
// alone removes everything, and is idempotent.
func TestCleanupAfterCrash(t *testing.T) {
	for _, ts := range testShims {
		for _, c := range []struct {
			create, killShim bool
		}{{true, false}, {true, true}, {false, false}, {false, true}} {
			t.Run(fmt.Sprintf("%s/created=%v/shim-killed=%v", ts.name, c.create, c.killShim), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				sb := newSandbox(t, "")
				s := startShim(t, ctx, ts, sb)
				if c.create {
					svc := createInit(t, ctx, s, sb)
					if err := svc.Exec(ctx, "e1", process(false, "sleep", "1000"), taskapi.IO{}); err != nil {
						t.Fatalf("Exec: %v", err)
					}
					if _, err := svc.Start(ctx, "e1"); err != nil {
						t.Fatalf("Start exec: %v", err)
					}
					if _, err := os.Stat(runcState(sb)); err != nil {
						t.Fatalf("runc state before Cleanup: %v", err)
					}
				}
				// What the driver persisted, through JSON.
				b, err := json.Marshal(s.Record())
				if err != nil {
					t.Fatal(err)
				}
				var rec Record
				if err := json.Unmarshal(b, &rec); err != nil {
					t.Fatal(err)
				}
				s.release() // the crash: this process's ends close
				if c.killShim {
					if err := syscall.Kill(rec.Pid, syscall.SIGKILL); err != nil {
						t.Fatal(err)
					}
					<-s.Exited()
				}
				for i := range 2 {
					if err := Cleanup(ctx, rec, testLogger(t)); err != nil {
						t.Errorf("Cleanup #%d: %v", i+1, err)
					}
				}
				assertGone(t, rec, sb)
			})
		}
	}
}

// TestUniqueAddress is pitfall 2: a shim names its socket after address,
// namespace and id, and a start that finds that socket served returns the
// first shim. Two sandboxes with the same namespace and id in different
// state directories get two shims; a state directory still served is
// refused; a crashed launcher's shim at the same address is not adopted.
func TestUniqueAddress(t *testing.T) {
	ts := testShims[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := testLogger(t)
	bin := ts.binary(t)
	id := fmt.Sprintf("u%d-%d", os.Getpid(), seq.Add(1))
	a, b := newSandbox(t, id), newSandbox(t, id)
	sa, err := Start(ctx, a.options(bin, log))
	if err != nil {
		t.Fatalf("Start a: %v", err)
	}
	defer Cleanup(context.Background(), sa.Record(), log)
	sbShim, err := Start(ctx, b.options(bin, log))
	if err != nil {
		t.Fatalf("Start b: %v", err)
	}
	defer Cleanup(context.Background(), sbShim.Record(), log)
	ra, rb := sa.Record(), sbShim.Record()
	if ra.Pid == rb.Pid || ra.Socket == rb.Socket {
		t.Errorf("same id in two state dirs: pids %d/%d, sockets %s/%s; want two shims", ra.Pid, rb.Pid, ra.Socket, rb.Socket)
	}

	for _, c := range []struct {
		name  string
		crash bool // release a's ends first (a crashed launcher)
		want  string
	}{
		{name: "state dir in use", want: "belongs to a running shim"},
		{name: "crashed launcher's shim", crash: true, want: "must be unique per sandbox"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.crash {
				sa.release()
			}
			// Another bundle for the same id and a's state directory.
			other := newSandbox(t, id)
			o := other.options(bin, log)
			o.StateDir = a.state
			s, err := Start(ctx, o)
			if err == nil {
				_ = Cleanup(context.Background(), s.Record(), log)
				t.Fatalf("Start with a's state dir: no error, want %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("Start with a's state dir: %v; want %q", err, c.want)
			}
			// a's shim is untouched.
			if fd, _ := sameProcess(ra.Pid, ra.StartTime); fd < 0 {
				t.Errorf("shim a (pid %d) is gone after the refused Start", ra.Pid)
			} else {
				unix.Close(fd)
			}
		})
	}
	for _, r := range []Record{ra, rb} {
		if err := Cleanup(ctx, r, log); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
	}
	assertGone(t, ra, a)
	assertGone(t, rb, b)
}

// TestLogFIFO is pitfall 1: the shim writes its log to <bundle>/log and
// dies when no one holds the FIFO. Start holds it and passes the lines on;
// the shim still answers after start.
func TestLogFIFO(t *testing.T) {
	ts := testShims[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb := newSandbox(t, "")
	var buf fixture.SyncBuffer
	s, err := Start(ctx, sb.options(ts.binary(t), slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer Cleanup(context.Background(), s.Record(), nil)
	if fi, err := os.Stat(filepath.Join(sb.bundle, "log")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("<bundle>/log: %v, %v; want a FIFO", fi, err)
	}
	time.Sleep(2 * time.Second) // the shim dies within about a second without a reader
	select {
	case <-s.Exited():
		t.Fatal("the shim exited after start")
	default:
	}
	if err := s.Service().Ping(ctx); err != nil {
		t.Fatalf("Ping after 2 s: %v", err)
	}
	// A debug run makes the shim log; its lines reach the logger.
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), "shim log") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(buf.String(), "shim log") {
		t.Errorf("no shim log line reached the logger:\n%s", buf.String())
	}
	if err := s.Service().Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	assertGone(t, s.Record(), sb)
}

// TestStartRefuses covers the options Start checks before it runs
// anything.
func TestStartRefuses(t *testing.T) {
	dir := t.TempDir()
	bundle := filepath.Join(dir, "job1")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	long := filepath.Join(dir, strings.Repeat("d", 100))
	if err := os.MkdirAll(long, 0o700); err != nil {
		t.Fatal(err)
	}
	good := Options{Binary: "true", ID: "job1", Namespace: "ns", Bundle: bundle, StateDir: dir}
	for _, c := range []struct {
		name string
		edit func(o *Options)
		want string
	}{
		{"bad id", func(o *Options) { o.ID = "a/b" }, "containerd identifiers"},
		{"bad namespace", func(o *Options) { o.Namespace = "" }, "containerd identifiers"},
		{"bundle not named after id", func(o *Options) { o.ID = "job2" }, "ending in the id"},
		{"relative bundle", func(o *Options) { o.Bundle = "job1" }, "absolute path ending in the id"},
		{"no config.json", func(o *Options) { o.Bundle = filepath.Join(dir, "x", "job1") }, "write config.json"},
		{"missing state dir", func(o *Options) { o.StateDir = filepath.Join(dir, "none") }, "existing directory"},
		{"long state dir", func(o *Options) { o.StateDir = long }, "too long for a unix socket"},
		{"no binary", func(o *Options) { o.Binary = "" }, "shim binary"},
		{"binary not in PATH", func(o *Options) { o.Binary = "containerd-shim-nonexistent-v2" }, "not found in PATH"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := good
			c.edit(&o)
			_, err := Start(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Start: %v; want an error containing %q", err, c.want)
			}
		})
	}
}

// TestStartNeedsSubreaper is pitfall 4: Start refuses to run a shim from a
// process that is not a child subreaper (the daemonized shim would go to
// PID 1, unreaped by the step). The test process is a subreaper
// (TestMain), so the check runs in a child that is not.
func TestStartNeedsSubreaper(t *testing.T) {
	if os.Getenv(noSubreaperEnv) != "1" {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestStartNeedsSubreaper$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), noSubreaperEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestStartNeedsSubreaper") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	if ok, err := isSubreaper(); err != nil || ok {
		t.Fatalf("isSubreaper = %v, %v; want false in the child", ok, err)
	}
	dir := t.TempDir()
	bundle := filepath.Join(dir, "job1")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), Options{Binary: "true", ID: "job1", Namespace: "ns", Bundle: bundle, StateDir: dir})
	if err == nil || !strings.Contains(err.Error(), "BecomeSubreaper") {
		t.Fatalf("Start from a plain process: %v; want an error naming BecomeSubreaper", err)
	}
	if err := BecomeSubreaper(); err != nil {
		t.Fatal(err)
	}
	if ok, err := isSubreaper(); err != nil || !ok {
		t.Fatalf("isSubreaper after BecomeSubreaper = %v, %v; want true", ok, err)
	}
}
