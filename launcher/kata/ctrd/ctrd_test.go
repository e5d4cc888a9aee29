package ctrd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/fifo"
	"github.com/containerd/typeurl/v2"
	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/slurm-microvm/slurm-microvm/launcher/kata/taskapi"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// The runc shim stands in for Kata's over the same task API.
const runcHandler = "io.containerd.runc.v2"

// sandbox is one container of the test daemon with its rootfs.
type sandbox struct {
	d      *fixture.Containerd
	opts   Options
	rootfs string
	cgroup string // the spec's linux.cgroupsPath
	fifos  string // directory of the FIFOs
}

func newSandbox(t *testing.T, d *fixture.Containerd, id string) *sandbox {
	t.Helper()
	dir := t.TempDir()
	sb := &sandbox{
		d: d,
		opts: Options{
			Address:   d.Address,
			Namespace: d.Namespace,
			Runtime:   runcHandler,
			ID:        id,
		},
		rootfs: filepath.Join(dir, "rootfs"),
		cgroup: "/" + d.Namespace + "-" + id,
		fifos:  filepath.Join(dir, "fifos"),
	}
	fixture.BusyboxRootfs(t, sb.rootfs, "ctrd test")
	// Whatever the test did, nothing of this container outlives it (a
	// failed test would leave its shim to the next one's leftover check).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := Cleanup(ctx, sb.opts); err != nil {
			t.Errorf("cleanup of container %s: %v", id, err)
		}
	})
	if err := os.Mkdir(sb.fifos, 0o700); err != nil {
		t.Fatal(err)
	}
	return sb
}

// spec is a minimal OCI spec for the busybox rootfs: its own mount, pid,
// ipc, uts and network namespaces, /proc, a tmpfs /dev with /dev/pts,
// init `busybox sleep 1000`.
func (sb *sandbox) spec() *specs.Spec {
	return &specs.Spec{
		Version:  specs.Version,
		Hostname: "ctrd-test",
		Root:     &specs.Root{Path: sb.rootfs},
		Process:  process("busybox", "sleep", "1000"),
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: sb.cgroup,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.NetworkNamespace},
			},
		},
		Annotations: map[string]string{"test": "ctrd"},
	}
}

func process(args ...string) *specs.Process {
	caps := []string{"CAP_KILL", "CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_DAC_OVERRIDE"}
	return &specs.Process{
		Args: args,
		Env:  []string{"PATH=/bin", "TERM=xterm"},
		Cwd:  "/",
		Capabilities: &specs.LinuxCapabilities{
			Bounding: caps, Effective: caps, Permitted: caps,
		},
		NoNewPrivileges: true,
	}
}

// stdio makes the FIFOs of one process (name.stdout; name.stdin if
// asked; name.stderr without a terminal) and opens the test's ends (non-blocking opens: containerd/fifo
// completes them when the shim opens its end).
type stdio struct {
	io       taskapi.IO
	stdin    io.WriteCloser
	stdout   io.ReadCloser
	stderr   io.ReadCloser
	out, err chan string
}

func (sb *sandbox) stdio(t *testing.T, name string, stdin, terminal bool) *stdio {
	t.Helper()
	ctx := context.Background()
	s := &stdio{io: taskapi.IO{Terminal: terminal}, out: make(chan string, 1), err: make(chan string, 1)}
	open := func(suffix string, flag int) (string, io.ReadWriteCloser) {
		p := filepath.Join(sb.fifos, name+"."+suffix)
		f, err := fifo.OpenFifo(ctx, p, flag|syscall.O_CREAT|syscall.O_NONBLOCK, 0o600)
		if err != nil {
			t.Fatalf("fifo %s: %v", p, err)
		}
		t.Cleanup(func() { f.Close() })
		return p, f
	}
	var f io.ReadWriteCloser
	s.io.Stdout, f = open("stdout", syscall.O_RDONLY)
	s.stdout = f
	go func() { b, _ := io.ReadAll(s.stdout); s.out <- string(b) }()
	if stdin {
		s.io.Stdin, f = open("stdin", syscall.O_WRONLY)
		s.stdin = f
	}
	if !terminal {
		s.io.Stderr, f = open("stderr", syscall.O_RDONLY)
		s.stderr = f
		go func() { b, _ := io.ReadAll(s.stderr); s.err <- string(b) }()
	} else {
		s.err <- ""
	}
	return s
}

func read(t *testing.T, ch chan string, what string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no EOF after 10 s", what)
		return ""
	}
}

// shimSocket is where containerd 1.6's runc shim serves this container.
func (sb *sandbox) shimSocket() string {
	return fixture.ShimSocket(sb.d.Address, sb.d.Namespace, sb.opts.ID)
}

// traces lists what the running container has on the host: its shim
// process, the shim's socket, runc's state, mounts of its rootfs, its
// cgroup (in the v1 hierarchies, or the unified one).
func (sb *sandbox) traces(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, pid := range sb.d.Shims(sb.opts.ID) {
		out = append(out, fmt.Sprintf("shim process %d", pid))
	}
	for _, p := range []string{sb.shimSocket(), filepath.Join(sb.d.RuncStateDir(), sb.opts.ID)} {
		if _, err := os.Lstat(p); err == nil {
			out = append(out, p)
		}
	}
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return !strings.HasPrefix(m.Mountpoint, sb.rootfs) && !strings.HasPrefix(m.Mountpoint, sb.d.Dir), false
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		out = append(out, "mount "+m.Mountpoint)
	}
	cgs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", sb.cgroup))
	if c := filepath.Join("/sys/fs/cgroup", sb.cgroup); exists(c) {
		cgs = append(cgs, c)
	}
	for _, c := range cgs {
		out = append(out, "cgroup "+c)
	}
	return out
}

// memoryCgroup is pid's memory cgroup (v1), or its v2 one.
func memoryCgroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	v2 := ""
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[1] == "memory" {
			return f[2]
		}
		if f[0] == "0" {
			v2 = f[2]
		}
	}
	return v2
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// checkRunning checks that the running container's traces are where
// traces looks (so that an empty list afterwards means something).
func (sb *sandbox) checkRunning(t *testing.T) {
	t.Helper()
	got := strings.Join(sb.traces(t), "\n")
	for _, want := range []string{"shim process", sb.shimSocket(), filepath.Join(sb.d.RuncStateDir(), sb.opts.ID), "cgroup "} {
		if !strings.Contains(got, want) {
			t.Errorf("running container: no %q among its traces on the host:\n%s", want, got)
		}
	}
}

// checkGone fails t if the container left anything on the host.
func (sb *sandbox) checkGone(t *testing.T) {
	t.Helper()
	sb.d.WaitGone(context.Background(), sb.opts.ID, 5*time.Second)
	if left := sb.traces(t); len(left) > 0 {
		t.Errorf("left on the host after delete:\n%s", strings.Join(left, "\n"))
	}
}

func TestService(t *testing.T) {
	d := fixture.StartContainerd(t)
	sb := newSandbox(t, d, "svc")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t0 := time.Now()
	s, err := Connect(ctx, sb.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(ctx)
	if _, err := s.Create(ctx, taskapi.CreateOptions{Spec: sb.spec()}); err != nil {
		t.Fatalf("%v\n%s", err, d.Log())
	}
	tCreate := time.Since(t0)
	initPid, err := s.Start(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	first := sb.stdio(t, "first", false, false)
	if err := s.Exec(ctx, "first", process("true"), first.io); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	tExec := time.Since(t0)
	rss, _ := d.RSS()
	v, _ := s.client.Version(ctx)
	t.Logf("runc shim through containerd %s: Connect to created task %v, to a running exec %v; containerd RSS %d KiB", v.Version, tCreate.Round(time.Millisecond), tExec.Round(time.Millisecond), rss)
	if e, err := s.Wait(ctx, "first"); err != nil || e.Status != 0 {
		t.Fatalf("exec true: %+v, %v", e, err)
	}
	if _, err := s.Delete(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	sb.checkRunning(t)
	// The design decision in doc.go: the container's processes follow
	// linux.cgroupsPath, the shim stays in the daemon's cgroup.
	shims := d.Shims(sb.opts.ID)
	if len(shims) != 1 {
		t.Fatalf("shims of %s: %v, want one", sb.opts.ID, shims)
	}
	if got := memoryCgroup(t, int(initPid)); got != sb.cgroup {
		t.Errorf("init's memory cgroup %q, want the spec's %q", got, sb.cgroup)
	}
	if got, want := memoryCgroup(t, shims[0]), memoryCgroup(t, d.Pid); got != want {
		t.Errorf("shim's memory cgroup %q, want containerd's %q", got, want)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
	// A second sandbox with the same namespace and id is refused: no step
	// attaches to another step's container by creating it again.
	other, err := Connect(ctx, sb.opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Create(ctx, taskapi.CreateOptions{Spec: sb.spec()}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("Create of an id that exists: %v, want already exists", err)
	}
	other.Shutdown(ctx)

	tests := []struct {
		name            string
		p               *specs.Process
		stdin, terminal bool
		// act runs after Start, before Wait.
		act              func(t *testing.T, id string, io *stdio)
		status           uint32
		wantOut, wantErr string
		outContains      string
	}{
		{
			name: "status and output", p: process("sh", "-c", "echo out; echo err >&2; exit 3"),
			status: 3, wantOut: "out\n", wantErr: "err\n",
		},
		{
			name: "stdin EOF after CloseIO", p: process("cat"), stdin: true, status: 0, wantOut: "hello\n",
			act: func(t *testing.T, id string, io *stdio) {
				if _, err := io.stdin.Write([]byte("hello\n")); err != nil {
					t.Fatal(err)
				}
				io.stdin.Close()
				// The shim holds its own end of the stdin FIFO: no EOF
				// until CloseIO.
				wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer wcancel()
				if e, err := s.Wait(wctx, id); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("cat ended (%+v, %v) before CloseIO", e, err)
				}
				if err := s.CloseIO(ctx, id); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "terminal and ResizePty", p: func() *specs.Process {
				p := process("sh", "-c", "read x; stty size")
				p.Terminal = true
				return p
			}(), stdin: true, terminal: true, status: 0, outContains: "30 100",
			act: func(t *testing.T, id string, io *stdio) {
				if err := s.ResizePty(ctx, id, 100, 30); err != nil {
					t.Fatal(err)
				}
				if _, err := io.stdin.Write([]byte("go\n")); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "SIGTERM", p: process("sleep", "1000"), status: 128 + 15,
			act: func(t *testing.T, id string, io *stdio) {
				if err := s.Kill(ctx, id, syscall.SIGTERM, false); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			id := fmt.Sprintf("exec%d", i)
			io := sb.stdio(t, id, tt.stdin, tt.terminal)
			if err := s.Exec(ctx, id, tt.p, io.io); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Start(ctx, id); err != nil {
				t.Fatal(err)
			}
			if tt.act != nil {
				tt.act(t, id, io)
			}
			e, err := s.Wait(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if e.Status != tt.status {
				t.Errorf("exit status %d, want %d", e.Status, tt.status)
			}
			out, stderr := read(t, io.out, "stdout"), read(t, io.err, "stderr")
			if tt.outContains != "" {
				if !strings.Contains(out, tt.outContains) {
					t.Errorf("stdout %q does not contain %q", out, tt.outContains)
				}
			} else if out != tt.wantOut || stderr != tt.wantErr {
				t.Errorf("stdout %q, stderr %q; want %q, %q", out, stderr, tt.wantOut, tt.wantErr)
			}
			d, err := s.Delete(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if d.Status != tt.status {
				t.Errorf("Delete: exit status %d, want %d", d.Status, tt.status)
			}
		})
	}

	// Another process (a second `exec`, `stop`) reaches the same
	// container through its own connection: the task and the exec are
	// loaded from the daemon.
	t.Run("second connection", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		io := sb.stdio(t, "other", false, false)
		if err := s.Exec(ctx, "other", process("sleep", "1000"), io.io); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Start(ctx, "other"); err != nil {
			t.Fatal(err)
		}
		s2, err := Connect(ctx, sb.opts)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Shutdown(ctx)
		if err := s2.Kill(ctx, "other", syscall.SIGKILL, false); err != nil {
			t.Fatal(err)
		}
		if e, err := s2.Wait(ctx, "other"); err != nil || e.Status != 128+9 {
			t.Fatalf("Wait through the second connection: %+v, %v; want status 137", e, err)
		}
		if _, err := s2.Delete(ctx, "other"); err != nil {
			t.Fatal(err)
		}
		if _, err := s2.Wait(ctx, "nosuch"); !errdefs.IsNotFound(err) {
			t.Errorf("Wait for an exec that is not there: %v, want not found", err)
		}
	})

	if _, err := s.Delete(ctx, ""); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Delete of a running init: %v, want a failed precondition", err)
	}
	if err := s.Kill(ctx, "", syscall.SIGKILL, true); err != nil {
		t.Fatal(err)
	}
	if e, err := s.Wait(ctx, ""); err != nil || e.Status != 128+9 {
		t.Fatalf("init after SIGKILL: %+v, %v; want status 137", e, err)
	}
	if e, err := s.Delete(ctx, ""); err != nil || e.Status != 128+9 {
		t.Fatalf("Delete: %+v, %v", e, err)
	}
	if _, err := s.client.LoadContainer(ctx, sb.opts.ID); !errdefs.IsNotFound(err) {
		t.Errorf("container after Delete(\"\"): %v, want not found", err)
	}
	sb.checkGone(t)
}

// TestCleanup drops a Service without deleting anything (a launcher
// crash: the connection closes, the container stays in the daemon) and
// cleans up from a fresh connection, twice.
func TestCleanup(t *testing.T) {
	d := fixture.StartContainerd(t)
	tests := []struct {
		name  string
		setup func(t *testing.T, ctx context.Context, s *Service, sb *sandbox)
	}{
		{"running init and exec", func(t *testing.T, ctx context.Context, s *Service, sb *sandbox) {
			if _, err := s.Create(ctx, taskapi.CreateOptions{Spec: sb.spec()}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Start(ctx, ""); err != nil {
				t.Fatal(err)
			}
			io := sb.stdio(t, "sleep", false, false)
			if err := s.Exec(ctx, "sleep", process("sleep", "1000"), io.io); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Start(ctx, "sleep"); err != nil {
				t.Fatal(err)
			}
			sb.checkRunning(t)
		}},
		{"created, not started", func(t *testing.T, ctx context.Context, s *Service, sb *sandbox) {
			if _, err := s.Create(ctx, taskapi.CreateOptions{Spec: sb.spec()}); err != nil {
				t.Fatal(err)
			}
		}},
		{"init ended", func(t *testing.T, ctx context.Context, s *Service, sb *sandbox) {
			spec := sb.spec()
			spec.Process = process("true")
			if _, err := s.Create(ctx, taskapi.CreateOptions{Spec: spec}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Start(ctx, ""); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Wait(ctx, ""); err != nil {
				t.Fatal(err)
			}
		}},
		{"never created", func(*testing.T, context.Context, *Service, *sandbox) {}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			sb := newSandbox(t, d, fmt.Sprintf("crash%d", i))
			s, err := Connect(ctx, sb.opts)
			if err != nil {
				t.Fatal(err)
			}
			tt.setup(t, ctx, s, sb)
			s.Shutdown(ctx) // the launcher is gone
			for n := range 2 {
				if err := Cleanup(ctx, sb.opts); err != nil {
					t.Fatalf("Cleanup #%d: %v", n+1, err)
				}
			}
			sb.checkGone(t)
			probe, err := Connect(ctx, sb.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer probe.Shutdown(ctx)
			if _, err := probe.client.LoadContainer(ctx, sb.opts.ID); !errdefs.IsNotFound(err) {
				t.Errorf("container after Cleanup: %v, want not found", err)
			}
		})
	}
}

// TestConfigPath: a Kata configuration path reaches the container's
// runtime options as runtimeoptions.v1.Options{ConfigPath}, where Kata's
// shim reads it (the runc shim would reject them, so no task is made).
// TestCreateFails: a task the runtime cannot create (init not in the
// rootfs) leaves no container behind, and the error keeps runc's text.
func TestCreateFails(t *testing.T) {
	d := fixture.StartContainerd(t)
	sb := newSandbox(t, d, "bad")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := Connect(ctx, sb.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(ctx)
	spec := sb.spec()
	spec.Process = process("/no/such/init")
	_, err = s.Create(ctx, taskapi.CreateOptions{Spec: spec})
	if err == nil || !strings.Contains(err.Error(), "create task of container bad") || !strings.Contains(err.Error(), "/no/such/init") {
		t.Fatalf("Create with a missing init: %v; want the task's error naming the path", err)
	}
	if _, err := s.client.LoadContainer(ctx, sb.opts.ID); !errdefs.IsNotFound(err) {
		t.Errorf("container after a failed Create: %v, want not found", err)
	}
	sb.checkGone(t)
}

func TestConfigPath(t *testing.T) {
	d := fixture.StartContainerd(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := Options{Address: d.Address, Namespace: d.Namespace, Runtime: "io.containerd.kata.v2", ID: "conf", ConfigPath: "/etc/kata-containers/configuration.toml"}
	s, err := Connect(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(ctx)
	spec := &specs.Spec{Version: specs.Version, Root: &specs.Root{Path: "/"}, Process: process("true")}
	c, err := s.client.NewContainer(ctx, o.ID, o.containerOpts(spec)...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Delete(context.WithoutCancel(ctx))
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Runtime.Name != o.Runtime {
		t.Errorf("runtime %q, want %q", info.Runtime.Name, o.Runtime)
	}
	v, err := typeurl.UnmarshalAny(info.Runtime.Options)
	if err != nil {
		t.Fatalf("runtime options: %v", err)
	}
	if ro, ok := v.(*runtimeoptions.Options); !ok || ro.ConfigPath != o.ConfigPath {
		t.Errorf("runtime options %T %+v, want runtimeoptions.Options{ConfigPath: %q}", v, v, o.ConfigPath)
	}
}

func TestCheckIO(t *testing.T) {
	tests := []struct {
		io   taskapi.IO
		want string // "" for valid
	}{
		{taskapi.IO{}, ""},
		{taskapi.IO{Stdout: "/o", Stderr: "/e"}, ""},
		{taskapi.IO{Stdin: "/i", Stdout: "/o", Stderr: "/e"}, ""},
		{taskapi.IO{Stdin: "/i"}, ""},
		{taskapi.IO{Stdin: "/i", Stdout: "/o", Terminal: true}, ""},
		{taskapi.IO{Stdout: "/o"}, "give both FIFOs or neither"},
		{taskapi.IO{Stderr: "/e"}, "give both FIFOs or neither"},
		{taskapi.IO{Stdout: "/o", Stderr: "/e", Terminal: true}, "leave stderr empty"},
	}
	for _, tt := range tests {
		err := checkIO(tt.io)
		if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
			t.Errorf("checkIO(%+v) = %v, want %q", tt.io, err, tt.want)
		}
	}
}

// staleSocket is a unix socket file nothing listens on (a daemon that
// died without removing it).
func staleSocket(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	return p
}

func TestConnectErrors(t *testing.T) {
	good := Options{Address: "/nonexistent/containerd.sock", Namespace: "ns", Runtime: runcHandler, ID: "id"}
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"relative address", func(o *Options) { o.Address = "containerd.sock" }, "kata.containerd_address"},
		{"bad namespace", func(o *Options) { o.Namespace = "-x" }, "kata.namespace"},
		{"bad id", func(o *Options) { o.ID = "a/b" }, "container id"},
		{"no runtime", func(o *Options) { o.Runtime = "" }, "kata.runtime_handler"},
		{"relative config", func(o *Options) { o.ConfigPath = "kata.toml" }, "kata.configuration"},
		{"no daemon", func(*Options) {}, "is containerd running"},
		{"nothing listens", func(o *Options) { o.Address = staleSocket(t) }, "is containerd running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := good
			tt.edit(&o)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			s, err := Connect(ctx, o)
			if err == nil {
				s.Shutdown(ctx)
				t.Fatal("Connect succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %q", err, tt.want)
			}
		})
	}
}
