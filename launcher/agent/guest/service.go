package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
)

// maxRead bounds one ReadOutput or WriteStdin transfer (1 MiB).
const maxRead = 1 << 20

// pollInterval is how often a blocked AcceptChannel looks whether its
// request was cancelled.
const pollInterval = 200 * time.Millisecond

// Options configure a Service.
type Options struct {
	// Setup prepares the root filesystem for a SetupRequest and returns the
	// directory processes are chrooted into ("" or "/": no chroot). The
	// guest uses MountRoot; tests pass a function that mounts nothing.
	Setup func(ctx context.Context, req *api.SetupRequest) (root string, err error)
	// PowerOff ends the guest after Shutdown answered. Nil: do nothing.
	PowerOff func()
	// SetClock sets the system's CLOCK_REALTIME (the guest passes
	// SetRealtime). Nil: the clock is left alone (tests that run the
	// service on the host).
	SetClock func(time.Time) error
	// PendingSignalGrace bounds the wait of a pending signal for its
	// process to catch or ignore it; 0 means PendingSignalGrace.
	PendingSignalGrace time.Duration
	// Cgroup is a cgroup2 directory with the memory controller enabled
	// for its children (MountCgroup): each process starts in a cgroup of
	// its own there, which tells its OOM kills apart from other
	// processes'. "": the guest-wide /proc/vmstat counter is used.
	Cgroup string
	// Boot holds the agent's own boot marks, filled by PID 1 before it
	// serves; Setup answers with them. Nil: no marks (tests).
	Boot   *BootMarks
	Logger *slog.Logger
}

// BootMarks are points of the agent's start-up, as the guest's
// CLOCK_BOOTTIME (Uptime).
type BootMarks struct {
	Start, ModulesDone, Serving time.Duration
}

// Uptime is the guest's CLOCK_BOOTTIME: time since the kernel's clock
// began, comparable with the kernel log's timestamps.
func Uptime() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return time.Duration(ts.Nano())
}

// Service implements api.AgentService.
type Service struct {
	opts   Options
	log    *slog.Logger
	reaper *reaper

	mu       sync.Mutex
	setup    *api.SetupRequest
	root     string
	procs    map[string]*process
	nextID   int
	channels map[string]*channel
	nextChan int
	stopped  bool

	// spareMu guards spare, a cgroup made ahead for the next process
	// (makeSpare), nil when none is ready; making, set while one is
	// being made; and closed, set by Close.
	spareMu sync.Mutex
	spare   *oomProbe
	making  bool
	closed  bool

	clockMu sync.Mutex
}

type process struct {
	id     string
	pid    int
	stdin  *os.File
	stdout *os.File
	stderr *os.File // nil with a terminal
	tty    bool
	exited chan struct{}
	status unix.WaitStatus
	// run is the time from the start to the reaping; set before exited
	// is closed.
	run time.Duration
	// oomKilled: the OOM killer killed it or one of its processes; set
	// before exited is closed.
	oomKilled bool
	readMu    [2]sync.Mutex
	stdinMu   sync.Mutex
	fw        *forwards

	// sigMu guards pending: signals waiting for the process to catch or
	// ignore them (deliverPending), in arrival order.
	sigMu   sync.Mutex
	pending []unix.Signal
}

// New returns a Service; call Close when done.
func New(o Options) *Service {
	l := o.Logger
	if l == nil {
		l = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Service{opts: o, log: l, reaper: newReaper(), procs: map[string]*process{}, channels: map[string]*channel{}}
}

// Register adds the service to a ttrpc server.
func (s *Service) Register(srv *ttrpc.Server) { api.RegisterAgentService(srv, s) }

// Close stops the reaper and removes the spare cgroup. It does not kill
// processes.
func (s *Service) Close() {
	s.reaper.stop()
	s.spareMu.Lock()
	spare := s.spare
	s.spare, s.closed = nil, true
	s.spareMu.Unlock()
	if spare != nil {
		spare.drop()
	}
}

// uptimeMs is CLOCK_BOOTTIME in ms: guest-side timestamps comparable with
// the kernel's log.
func uptimeMs() int64 { return Uptime().Milliseconds() }

func (s *Service) Ping(ctx context.Context, _ *api.PingRequest) (*api.PingResponse, error) {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	bootID, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return &api.PingResponse{
		KernelRelease: unix.ByteSliceToString(uts.Release[:]),
		BootId:        strings.TrimSpace(string(bootID)),
		UptimeMs:      uint64(uptimeMs()),
	}, nil
}

func (s *Service) Setup(ctx context.Context, req *api.SetupRequest) (*api.SetupResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.setup != nil {
		return nil, status.Error(codes.FailedPrecondition, "sandbox is already set up")
	}
	begun := Uptime()
	s.log.Debug("setup received", "uptime_ms", begun.Milliseconds())
	root := ""
	if s.opts.Setup != nil {
		r, err := s.opts.Setup(ctx, req)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "set up guest root: %v", err)
		}
		root = r
	}
	if root == "/" {
		root = ""
	}
	s.setup, s.root = req, root
	s.makeSpare()
	done := Uptime()
	s.log.Info("sandbox set up", "uptime_ms", done.Milliseconds(), "uid", req.Uid, "gid", req.Gid, "groups", req.Groups, "root", root)
	resp := &api.SetupResponse{SetupStartUs: uint64(begun.Microseconds()), SetupDoneUs: uint64(done.Microseconds())}
	if b := s.opts.Boot; b != nil {
		resp.AgentStartUs = uint64(b.Start.Microseconds())
		resp.ModulesDoneUs = uint64(b.ModulesDone.Microseconds())
		resp.ServingUs = uint64(b.Serving.Microseconds())
	}
	return resp, nil
}

func (s *Service) identity() (*api.SetupRequest, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.setup == nil {
		return nil, "", status.Error(codes.FailedPrecondition, "sandbox is not set up yet")
	}
	if s.stopped {
		return nil, "", status.Error(codes.Unavailable, "sandbox is shutting down")
	}
	return s.setup, s.root, nil
}

func (s *Service) CreateProcess(ctx context.Context, req *api.CreateProcessRequest) (*api.CreateProcessResponse, error) {
	arrived := time.Now()
	setup, root, err := s.identity()
	if err != nil {
		return nil, err
	}
	// Go strings hold any bytes: argv, env and cwd go to execve as sent.
	argv := api.Strings(req.Argv)
	if len(argv) == 0 || argv[0] == "" {
		return nil, status.Error(codes.InvalidArgument, "empty argv")
	}
	imageEnv := api.Strings(setup.ImageEnv)
	imagePath, ok := envValue(imageEnv, "PATH")
	if !ok {
		imagePath = DefaultPath
	}
	taskEnv, imagePath := driverEnv(setup.GpuDriver, mergeEnv(imageEnv, api.Strings(req.Env)), imagePath)
	resolved, err := lookPath(root, argv[0], imagePath)
	if err != nil {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	cwd := string(req.Cwd)
	if cwd == "" {
		cwd = string(setup.ImageWorkdir)
	}
	if cwd == "" {
		cwd = "/"
	}
	if err := checkWorkdir(root, cwd); err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	env := withPath(taskEnv, imagePath)
	fw, fwInfo, env, err := s.setupForwards(req.Forwards, env)
	if err != nil {
		return nil, err
	}

	p := &process{tty: req.Terminal, exited: make(chan struct{}), fw: fw, pending: pendingSignals(req.PendingSignals)}
	var childFiles []*os.File
	stdinClosed := false
	attr := &syscall.SysProcAttr{
		Setsid: true,
		Credential: &syscall.Credential{
			Uid: setup.Uid, Gid: setup.Gid, Groups: setup.Groups,
		},
	}
	if root != "" {
		attr.Chroot = root
	}
	if req.Terminal {
		master, slave, err := pty.Open()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "allocate pty: %v", err)
		}
		if req.Rows > 0 && req.Cols > 0 {
			_ = pty.Setsize(master, &pty.Winsize{Rows: uint16(req.Rows), Cols: uint16(req.Cols)})
		}
		if err := slave.Chown(int(setup.Uid), int(setup.Gid)); err != nil {
			s.log.Warn("chown pty", "err", err)
		}
		p.stdin, p.stdout = master, master
		childFiles = []*os.File{slave, slave, slave}
		attr.Setctty = true
		attr.Ctty = 0
	} else {
		inR, inW, err := os.Pipe()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "stdin pipe: %v", err)
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			inR.Close()
			inW.Close()
			return nil, status.Errorf(codes.Internal, "stdout pipe: %v", err)
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			inR.Close()
			inW.Close()
			outR.Close()
			outW.Close()
			return nil, status.Errorf(codes.Internal, "stderr pipe: %v", err)
		}
		p.stdin, p.stdout, p.stderr = inW, outR, errR
		childFiles = []*os.File{inR, outW, errW}
		if req.StdinClosed {
			// No input: at end of file from the start, as after
			// CloseStdin (whose later calls find it closed).
			_ = inW.Close()
			stdinClosed = true
		}
	}
	s.syncClock(req.HostTimeNs)
	oom, cgErr := s.takeCgroup()
	if cgErr != nil {
		s.log.Warn("no cgroup of its own for the process: OOM kills are told by /proc/vmstat", "err", cgErr)
	}
	startProc := func(cgroup *os.File) (int, error) {
		a := *attr
		if cgroup != nil {
			a.UseCgroupFD, a.CgroupFD = true, int(cgroup.Fd())
		}
		proc, err := os.StartProcess(resolved, argv, &os.ProcAttr{
			Dir: cwd, Env: env, Files: fw.childFiles(childFiles), Sys: &a,
		})
		if err != nil {
			return 0, err
		}
		pid := proc.Pid
		_ = proc.Release()
		return pid, nil
	}
	pid, exitCh, err := s.reaper.start(func() (int, error) {
		if oom.f == nil {
			return startProc(nil)
		}
		pid, err := startProc(oom.f)
		if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, os.ErrPermission) {
			// clone3 into a cgroup refused (an old guest kernel):
			// start it plainly, the vmstat counter tells OOM kills.
			s.log.Warn("start in the process's cgroup failed; starting it without", "err", err)
			oom.drop()
			oom.vmstat = vmstatOOMKills()
			return startProc(nil)
		}
		return pid, err
	})
	started := time.Now()
	oom.started()
	s.makeSpare()
	closeChildEnds(childFiles)
	fw.closeChildEnds()
	if err != nil {
		oom.drop()
		p.closeAll()
		s.closeForwards(fw)
		code := codes.Internal
		if errors.Is(err, os.ErrPermission) {
			code = codes.PermissionDenied
		} else if errors.Is(err, os.ErrNotExist) {
			code = codes.NotFound
		}
		return nil, status.Errorf(code, "start %s: %v", argv[0], err)
	}
	p.pid = pid
	if len(p.pending) > 0 {
		go s.deliverPending(p, time.Now())
	}

	s.mu.Lock()
	s.nextID++
	p.id = strconv.Itoa(s.nextID)
	s.procs[p.id] = p
	s.mu.Unlock()

	go func() {
		ex := <-exitCh
		p.status, p.run = ex.status, ex.at.Sub(started)
		p.oomKilled = oom.killed(p.status)
		close(p.exited)
		// Off the exit's path: the answer does not wait for it.
		oom.remove()
		// The rank is gone: its listeners go; its channels drain and
		// close when the host reads their EOF or the agent stops.
		for _, l := range fw.listeners {
			l.Close()
		}
		s.log.Info("process exited", "id", p.id, "pid", pid, "status", describe(p.status), "oom_killed", p.oomKilled)
	}()
	s.log.Info("process started", "id", p.id, "pid", pid, "path", resolved, "tty", req.Terminal, "pending_signals", len(p.pending))
	return &api.CreateProcessResponse{
		Id: p.id, Pid: uint32(pid), Path: []byte(resolved), Forwards: fwInfo,
		StdinClosed: stdinClosed, CreateNs: uint64(started.Sub(arrived)),
	}, nil
}

func closeChildEnds(files []*os.File) {
	seen := map[*os.File]bool{}
	for _, f := range files {
		if f != nil && !seen[f] {
			seen[f] = true
			f.Close()
		}
	}
}

func (p *process) closeAll() {
	for _, f := range []*os.File{p.stdin, p.stdout, p.stderr} {
		if f != nil {
			f.Close()
		}
	}
}

func describe(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "signal " + ws.Signal().String()
	}
	return "exit " + strconv.Itoa(ws.ExitStatus())
}

// mergeEnv returns image overridden by task (KEY=VALUE lists): the image's
// environment, then the task's, as pyxis and enroot combine them. Names the
// step owns (StepOwned) never come from the image, whether or not the task
// sets them.
func mergeEnv(image, task []string) []string {
	idx := map[string]int{}
	var out []string
	for i, list := range [][]string{image, task} {
		for _, kv := range list {
			k, _, _ := strings.Cut(kv, "=")
			if i == 0 && StepOwned(k) {
				continue
			}
			if i, ok := idx[k]; ok {
				out[i] = kv
				continue
			}
			idx[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// withPath returns env with PATH set to the image's search path.
func withPath(env []string, imagePath string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "PATH="+imagePath)
}

func (s *Service) proc(id string) (*process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.procs[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no process %q", id)
	}
	return p, nil
}

func (s *Service) WriteStdin(ctx context.Context, req *api.WriteStdinRequest) (*api.WriteStdinResponse, error) {
	p, err := s.proc(req.Id)
	if err != nil {
		return nil, err
	}
	if len(req.Data) > maxRead {
		return nil, status.Errorf(codes.InvalidArgument, "stdin chunk of %d bytes exceeds %d", len(req.Data), maxRead)
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	n, err := p.stdin.Write(req.Data)
	if err != nil {
		return &api.WriteStdinResponse{Len: uint32(n)}, status.Errorf(codes.Unavailable, "write stdin: %v", err)
	}
	return &api.WriteStdinResponse{Len: uint32(n)}, nil
}

func (s *Service) CloseStdin(ctx context.Context, req *api.ProcessRequest) (*api.Empty, error) {
	p, err := s.proc(req.Id)
	if err != nil {
		return nil, err
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.tty {
		// End of input on a terminal is the EOF character, as a shell sees it.
		_, _ = p.stdin.Write([]byte{4})
		return &api.Empty{}, nil
	}
	_ = p.stdin.Close()
	return &api.Empty{}, nil
}

func (s *Service) ReadOutput(ctx context.Context, req *api.ReadOutputRequest) (*api.ReadOutputResponse, error) {
	p, err := s.proc(req.Id)
	if err != nil {
		return nil, err
	}
	f := p.stdout
	if req.Stream == api.Stream_STDERR {
		f = p.stderr
	}
	if f == nil {
		return &api.ReadOutputResponse{Eof: true}, nil
	}
	mu := &p.readMu[req.Stream&1]
	mu.Lock()
	defer mu.Unlock()
	// Once the process is gone and nothing is buffered, its output ends:
	// a background child may keep the pipe open, but the task's output
	// ends with the task. EOF on a pipe, EIO on a pty master whose slave
	// closed, end it too.
	return readPolled(ctx, f, req.Len, p.exited)
}

// deadlineReader is a pollable *os.File or net.Conn.
type deadlineReader interface {
	Read([]byte) (int, error)
	SetReadDeadline(time.Time) error
}

// readPolled blocks until r has data (at most len bytes, 64 KiB when 0,
// never more than maxRead), r ends, ctx ends, or done is closed while
// nothing is buffered. A nil done never ends the wait. Calls on one r
// must not overlap (the callers hold a lock per stream).
//
// Nothing polls: the end of ctx or of done wakes the blocked Read by
// moving r's read deadline into the past, and once done is closed what is
// still buffered is read without waiting (drain) before the output ends.
// The wake-up goroutine is gone when readPolled returns, so a deadline it
// set never reaches a later call, which clears it first.
func readPolled(ctx context.Context, r deadlineReader, length uint32, done <-chan struct{}) (*api.ReadOutputResponse, error) {
	n := int(length)
	if n <= 0 || n > maxRead {
		n = 64 << 10
	}
	buf := make([]byte, n)
	_ = r.SetReadDeadline(time.Time{})
	stop, woke := make(chan struct{}), make(chan struct{})
	defer func() {
		close(stop)
		<-woke
	}()
	go func() {
		defer close(woke)
		select {
		case <-done:
		case <-ctx.Done():
		case <-stop:
			return
		}
		_ = r.SetReadDeadline(time.Unix(1, 0))
	}()
	for {
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		select {
		case <-done:
			return drain(r, buf)
		default:
		}
		k, err := r.Read(buf)
		if k > 0 {
			return &api.ReadOutputResponse{Data: buf[:k]}, nil
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			// Woken: ctx or done ended, which the loop looks at.
		default:
			return &api.ReadOutputResponse{Eof: true}, nil
		}
	}
}

// drain reads what r holds now into buf without waiting: data, or the end
// of the output when nothing is left (or r ended).
func drain(r deadlineReader, buf []byte) (*api.ReadOutputResponse, error) {
	sc, ok := r.(syscall.Conn) // *os.File, the process's outputs
	if !ok {
		return &api.ReadOutputResponse{Eof: true}, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return &api.ReadOutputResponse{Eof: true}, nil
	}
	k := 0
	_ = raw.Control(func(fd uintptr) {
		// The descriptor is non-blocking (in the poller): an empty
		// pipe answers EAGAIN at once.
		for {
			n, err := unix.Read(int(fd), buf)
			if err == unix.EINTR {
				continue
			}
			if err == nil && n > 0 {
				k = n
			}
			return
		}
	})
	if k > 0 {
		return &api.ReadOutputResponse{Data: buf[:k]}, nil
	}
	return &api.ReadOutputResponse{Eof: true}, nil
}

func (s *Service) Signal(ctx context.Context, req *api.SignalRequest) (*api.Empty, error) {
	p, err := s.proc(req.Id)
	if err != nil {
		return nil, err
	}
	if req.Signal == 0 || req.Signal > 64 {
		return nil, status.Errorf(codes.InvalidArgument, "signal %d out of range 1-64", req.Signal)
	}
	select {
	case <-p.exited:
		return &api.Empty{}, nil
	default:
	}
	if p.queue(unix.Signal(req.Signal)) {
		return &api.Empty{}, nil // after the pending ones, in order
	}
	if err := signalTask(p.pid, unix.Signal(req.Signal)); err != nil && err != unix.ESRCH {
		return nil, status.Errorf(codes.Internal, "signal %d to pid %d: %v", req.Signal, p.pid, err)
	}
	return &api.Empty{}, nil
}

func (s *Service) Wait(ctx context.Context, req *api.ProcessRequest) (*api.WaitResponse, error) {
	p, err := s.proc(req.Id)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if p.status.Signaled() {
		return &api.WaitResponse{ExitCode: -1, Signal: uint32(p.status.Signal()), OomKilled: p.oomKilled, RunNs: uint64(p.run)}, nil
	}
	return &api.WaitResponse{ExitCode: int32(p.status.ExitStatus()), OomKilled: p.oomKilled, RunNs: uint64(p.run)}, nil
}

func (s *Service) ResizeTTY(ctx context.Context, req *api.ResizeTTYRequest) (*api.Empty, error) {
	p, err := s.proc(req.Id)
	if err != nil {
		return nil, err
	}
	if !p.tty {
		return nil, status.Errorf(codes.FailedPrecondition, "process %s has no terminal", req.Id)
	}
	if err := pty.Setsize(p.stdout, &pty.Winsize{Rows: uint16(req.Rows), Cols: uint16(req.Cols)}); err != nil {
		return nil, status.Errorf(codes.Internal, "resize tty: %v", err)
	}
	return &api.Empty{}, nil
}

// ShutdownTermGrace is how long Shutdown lets the guest's processes handle
// SIGTERM before it kills them: well below the host's stop_grace (default
// 5 s), which bounds the whole Shutdown call.
const ShutdownTermGrace = time.Second

// Shutdown ends every process (SIGTERM, then SIGKILL after
// ShutdownTermGrace), waits for them, syncs, and powers the guest off.
func (s *Service) Shutdown(ctx context.Context, _ *api.Empty) (*api.Empty, error) {
	s.mu.Lock()
	s.stopped = true
	procs := make([]*process, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	// TERM first, then KILL after ShutdownTermGrace: a workload whose
	// task was killed on the host right after a forwarded TERM (srun in a
	// batch script kills its step's tasks when scancel's TERM reaches it)
	// still runs its trap, e.g. to write a checkpoint to a share, as it
	// would have on the host, where the TERM arrives before the KILL.
	var running []*process
	for _, p := range procs {
		select {
		case <-p.exited:
		default:
			_ = signalTask(p.pid, unix.SIGTERM)
			running = append(running, p)
		}
	}
	grace := time.After(ShutdownTermGrace)
wait:
	for _, p := range running {
		select {
		case <-p.exited:
		case <-grace:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	for _, p := range running {
		select {
		case <-p.exited:
		default:
			_ = unix.Kill(-p.pid, unix.SIGKILL) // its session's process group
			_ = unix.Kill(p.pid, unix.SIGKILL)
		}
	}
	// Wait (bounded by ctx) until they are reaped, so nothing writes
	// after the sync the host relies on.
	for _, p := range procs {
		select {
		case <-p.exited:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	unix.Sync()
	s.log.Info("shutdown requested", "processes", len(procs))
	if s.opts.PowerOff != nil {
		go func() {
			// Let the reply leave before the guest goes away.
			time.Sleep(50 * time.Millisecond)
			s.opts.PowerOff()
		}()
	}
	return &api.Empty{}, nil
}

// String helps logs.
func (p *process) String() string { return fmt.Sprintf("process %s (pid %d)", p.id, p.pid) }

// clockSlack is how far ahead of the host's time in a request the guest's
// clock may be before it is set back: the request's time is its sending
// time, so a guest clock up to the transit time ahead (a few ms over the
// virtio-serial port) is right, and is not stepped back on every start.
const clockSlack = 10 * time.Millisecond

// syncClock sets the clock to hostNs (the host's CLOCK_REALTIME when the
// request was sent, ns since the epoch) when the guest's is behind it, which
// it cannot rightly be, or more than clockSlack ahead. 0 or no SetClock:
// nothing.
func (s *Service) syncClock(hostNs int64) {
	if hostNs == 0 || s.opts.SetClock == nil {
		return
	}
	s.clockMu.Lock()
	defer s.clockMu.Unlock()
	host := time.Unix(0, hostNs)
	off := time.Since(host) // guest minus host, plus the transit time
	if off >= 0 && off <= clockSlack {
		return
	}
	if err := s.opts.SetClock(host); err != nil {
		s.log.Warn("set the clock to the host's", "err", err, "offset", off)
		return
	}
	s.log.Info("clock set to the host's", "was_off_ms", off.Milliseconds())
}

// SetRealtime sets CLOCK_REALTIME to t (needs CAP_SYS_TIME): the guest's
// SetClock.
func SetRealtime(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("clock_settime(CLOCK_REALTIME): %w", err)
	}
	return nil
}

// checkWorkdir checks that cwd (a guest path) is a directory below root:
// missing, not a directory and not reachable are told apart, so that
// --microvm-workdir=/etc/passwd is not reported as missing.
func checkWorkdir(root, cwd string) error {
	fi, err := os.Stat(root + cwd)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("working directory %q does not exist in the image", cwd)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("working directory %q: a parent of it is not a directory in the image", cwd)
	case err != nil:
		return fmt.Errorf("working directory %q: %w", cwd, err)
	case !fi.IsDir():
		return fmt.Errorf("working directory %q is not a directory in the image (it is a %s): give a directory", cwd, fileKind(fi.Mode()))
	}
	return nil
}

// fileKind names the type of a file mode for messages.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsRegular():
		return "regular file"
	case m&os.ModeSymlink != 0:
		return "symlink"
	case m&os.ModeDevice != 0:
		return "device"
	case m&os.ModeNamedPipe != 0:
		return "named pipe"
	case m&os.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}
