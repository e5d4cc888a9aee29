package kata

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/guest"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata/taskapi"
)

// maxRead bounds one ReadOutput (the agent API's limit).
const maxRead = 1 << 20

// stdinOpenWait bounds how long closing stdin waits for the shim to open
// its end of the FIFO.
const stdinOpenWait = 10 * time.Second

// fifoReleaseWait bounds how long closing a FIFO end waits for its
// background open to return.
const fifoReleaseWait = 5 * time.Second

// maxProcs bounds the processes of one sandbox that the broker holds at
// once (each holds FIFOs and descriptors in the root supervisor until it
// was waited for and its output drained).
const maxProcs = 1024

// broker serves the guest agent's API (launcher/agent/api) on the step's
// control socket and carries each call out through the task API: a task
// process of the step cannot tell it from the QEMU driver's agent. Only
// what a task may do is served: processes as the job's user with no
// capabilities, in the one sandbox container. Setup, Shutdown and the
// PMI channels are refused.
type broker struct {
	svc      taskapi.Service
	ioDir    string // FIFOs, one directory per process
	uid, gid uint32
	groups   []uint32
	imageEnv []string
	workdir  string
	log      *slog.Logger

	next  atomic.Uint64
	mu    sync.Mutex
	procs map[string]*proc
}

type proc struct {
	execID                string
	dir                   string
	terminal              bool
	stdin, stdout, stderr *fifoEnd
	stdinOnce             sync.Once
	waitOnce              sync.Once
	exit                  taskapi.Exit
	waitErr               error

	// Guarded by broker.mu: the process is released (its FIFOs closed and
	// removed, its entry dropped) once it was waited for and each of its
	// outputs reached EOF.
	waited    bool
	stdoutEOF bool
	stderrEOF bool
	released  bool
}

// fifoEnd is this side's end of one stdio FIFO, opened blocking in the
// background: the open returns once the shim opened its end. Neither side
// ever holds both ends, so output ends (EOF) when the shim closes its end,
// and nothing written to stdin is lost to a shim that opens its end late
// (the runc shim opens it in the background after Start).
type fifoEnd struct {
	path  string
	flag  int
	ready chan struct{}
	f     *os.File
	err   error
}

func openFifo(path string, flag int) *fifoEnd {
	e := &fifoEnd{path: path, flag: flag, ready: make(chan struct{})}
	go func() {
		e.f, e.err = os.OpenFile(path, flag, 0)
		close(e.ready)
	}()
	return e
}

// get waits (bounded by ctx) until the shim opened its end.
func (e *fifoEnd) get(ctx context.Context) (*os.File, error) {
	select {
	case <-e.ready:
		return e.f, e.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// close closes this end. An open still waiting for the shim is released
// by opening the other end without blocking (and closing it at once),
// again until it returned: the background open may not have begun yet,
// and a poke before it finds no one (ENXIO) or goes unseen. Bounded by
// fifoReleaseWait.
func (e *fifoEnd) close() {
	other := os.O_WRONLY
	if e.flag&(os.O_WRONLY|os.O_RDWR) != 0 {
		other = os.O_RDONLY
	}
	deadline := time.Now().Add(fifoReleaseWait)
	for {
		select {
		case <-e.ready:
			if e.f != nil {
				e.f.Close()
			}
			return
		default:
		}
		if time.Now().After(deadline) {
			return // the open's goroutine stays blocked on a FIFO that is gone
		}
		if f, err := os.OpenFile(e.path, other|unix.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		select {
		case <-e.ready:
		case <-time.After(2 * time.Millisecond):
		}
	}
}

var _ api.AgentService = (*broker)(nil)

// handshaker admits connections from the job's uid and root only
// (SO_PEERCRED), as the QEMU driver's relay does.
func (b *broker) handshaker() ttrpc.Handshaker {
	return handshake(func(ctx context.Context, conn net.Conn) (net.Conn, any, error) {
		uid, err := peerUID(conn)
		if err != nil || (uid != b.uid && uid != 0) {
			conn.Close()
			b.log.Warn("refused exec client", "uid", uid, "err", err)
			return nil, nil, fmt.Errorf("exec client uid %d refused", uid)
		}
		return conn, nil, nil
	})
}

func (b *broker) Ping(ctx context.Context, _ *api.PingRequest) (*api.PingResponse, error) {
	if err := b.svc.Ping(ctx); err != nil {
		return nil, status.Errorf(codes.Unavailable, "kata shim: %v", err)
	}
	return &api.PingResponse{}, nil
}

func (b *broker) Setup(context.Context, *api.SetupRequest) (*api.SetupResponse, error) {
	return nil, status.Error(codes.PermissionDenied, "the sandbox is set up by its supervisor")
}

func (b *broker) Shutdown(context.Context, *api.Empty) (*api.Empty, error) {
	return nil, status.Error(codes.PermissionDenied, "the sandbox is stopped by its supervisor")
}

func (b *broker) CreateProcess(ctx context.Context, req *api.CreateProcessRequest) (*api.CreateProcessResponse, error) {
	argv := api.Strings(req.Argv)
	if len(argv) == 0 || argv[0] == "" {
		return nil, status.Error(codes.InvalidArgument, "empty argv")
	}
	if len(req.Forwards) > 0 {
		return nil, status.Error(codes.FailedPrecondition, errNoPMI)
	}
	cwd := string(req.Cwd)
	if cwd == "" {
		cwd = b.workdir
	}
	if cwd == "" {
		cwd = "/"
	}
	b.mu.Lock()
	live := len(b.procs)
	b.mu.Unlock()
	if live >= maxProcs {
		return nil, status.Errorf(codes.ResourceExhausted, "%d processes of this step are still running or not yet waited for: at most %d at once", live, maxProcs)
	}
	id := "p" + strconv.FormatUint(b.next.Add(1), 10)
	p := &proc{execID: id, dir: filepath.Join(b.ioDir, id), terminal: req.Terminal}
	io := taskapi.IO{Terminal: req.Terminal}
	if err := p.open(&io); err != nil {
		p.close()
		return nil, status.Errorf(codes.Internal, "stdio of %s: %v", argv[0], err)
	}
	spec := &specs.Process{
		Args: argv, Env: guest.MergeEnv(b.imageEnv, api.Strings(req.Env)), Cwd: cwd,
		User:            specs.User{UID: b.uid, GID: b.gid, AdditionalGids: b.groups},
		Terminal:        req.Terminal,
		NoNewPrivileges: true,
		Capabilities:    &specs.LinuxCapabilities{},
	}
	if req.Terminal && req.Rows > 0 && req.Cols > 0 {
		spec.ConsoleSize = &specs.Box{Height: uint(req.Rows), Width: uint(req.Cols)}
	}
	if err := b.svc.Exec(ctx, id, spec, io); err != nil {
		p.close()
		return nil, status.Errorf(codes.Internal, "exec %s in the sandbox: %v", argv[0], err)
	}
	pid, err := b.svc.Start(ctx, id)
	if err != nil {
		_, _ = b.svc.Delete(context.WithoutCancel(ctx), id)
		p.close()
		if notFound(err) {
			return nil, status.Errorf(codes.NotFound, "%s: %v", argv[0], err)
		}
		return nil, status.Errorf(codes.Internal, "start %s in the sandbox: %v", argv[0], err)
	}
	for _, sig := range req.PendingSignals {
		if err := b.svc.Kill(ctx, id, syscall.Signal(sig), false); err != nil {
			b.log.Warn("deliver a signal that came during boot", "signal", sig, "err", err)
		}
	}
	b.mu.Lock()
	if b.procs == nil {
		b.procs = map[string]*proc{}
	}
	b.procs[id] = p
	b.mu.Unlock()
	return &api.CreateProcessResponse{Id: id, Pid: pid, Path: []byte(argv[0])}, nil
}

// notFound: the runtime could not find or execute argv[0] (runc: "exec:
// \"x\": executable file not found in $PATH"; "no such file or
// directory" for a path).
func notFound(err error) bool {
	s := err.Error()
	return strings.Contains(s, "executable file not found") || strings.Contains(s, "no such file or directory")
}

// open makes the process's FIFOs (root's, 0600, in a root-only directory)
// and starts opening this side's ends (openFifo).
func (p *proc) open(io *taskapi.IO) error {
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	names := []string{"stdin", "stdout", "stderr"}
	if io.Terminal {
		names = names[:2]
	}
	for _, n := range names {
		path := filepath.Join(p.dir, n)
		if err := unix.Mkfifo(path, 0o600); err != nil {
			return fmt.Errorf("mkfifo %s: %w", path, err)
		}
		switch n {
		case "stdin":
			io.Stdin, p.stdin = path, openFifo(path, os.O_WRONLY)
		case "stdout":
			io.Stdout, p.stdout = path, openFifo(path, os.O_RDONLY)
		case "stderr":
			io.Stderr, p.stderr = path, openFifo(path, os.O_RDONLY)
		}
	}
	return nil
}

func (p *proc) close() {
	for _, e := range []*fifoEnd{p.stdin, p.stdout, p.stderr} {
		if e != nil {
			e.close()
		}
	}
	_ = os.RemoveAll(p.dir)
}

func (b *broker) proc(id string) (*proc, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p, ok := b.procs[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no process %q", id)
	}
	return p, nil
}

func (b *broker) WriteStdin(ctx context.Context, req *api.WriteStdinRequest) (*api.WriteStdinResponse, error) {
	p, err := b.proc(req.Id)
	if err != nil {
		return nil, err
	}
	if len(req.Data) > maxRead {
		return nil, status.Errorf(codes.InvalidArgument, "stdin chunk of %d bytes exceeds %d", len(req.Data), maxRead)
	}
	f, err := p.stdin.get(ctx)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "stdin: %v", err)
	}
	n, err := f.Write(req.Data)
	if err != nil {
		return &api.WriteStdinResponse{Len: uint32(n)}, status.Errorf(codes.FailedPrecondition, "stdin: %v", err)
	}
	return &api.WriteStdinResponse{Len: uint32(n)}, nil
}

func (b *broker) CloseStdin(ctx context.Context, req *api.ProcessRequest) (*api.Empty, error) {
	p, err := b.proc(req.Id)
	if err != nil {
		return nil, err
	}
	var cerr error
	p.stdinOnce.Do(func() {
		// The shim must hold its end first, or its late open would wait
		// for a writer that never comes.
		wctx, cancel := context.WithTimeout(ctx, stdinOpenWait)
		f, _ := p.stdin.get(wctx)
		cancel()
		if p.terminal {
			// End of input on a terminal is the EOF character, as the
			// agent gives it: closing the shim's side would hang the
			// terminal up (SIGHUP). The FIFO stays open until release.
			if f != nil {
				_, _ = f.Write([]byte{4})
			}
			return
		}
		p.stdin.close()
		cerr = b.svc.CloseIO(ctx, p.execID)
	})
	if cerr != nil {
		return nil, status.Errorf(codes.Internal, "close stdin: %v", cerr)
	}
	return &api.Empty{}, nil
}

func (b *broker) ReadOutput(ctx context.Context, req *api.ReadOutputRequest) (*api.ReadOutputResponse, error) {
	p, err := b.proc(req.Id)
	if err != nil {
		return nil, err
	}
	e := p.stdout
	if req.Stream == api.Stream_STDERR {
		e = p.stderr
	}
	if e == nil {
		b.outputEnded(p, req.Stream)
		return &api.ReadOutputResponse{Eof: true}, nil
	}
	f, err := e.get(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "output: %v", err)
	}
	n := int(req.Len)
	if n <= 0 || n > maxRead {
		n = maxRead
	}
	buf := make([]byte, n)
	m, err := f.Read(buf)
	if m > 0 {
		return &api.ReadOutputResponse{Data: buf[:m]}, nil
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, syscall.EIO) {
		// EIO: a terminal's other side closed.
		b.outputEnded(p, req.Stream)
		return &api.ReadOutputResponse{Eof: true}, nil
	}
	return nil, status.Errorf(codes.Internal, "read output: %v", err)
}

func (b *broker) Signal(ctx context.Context, req *api.SignalRequest) (*api.Empty, error) {
	p, err := b.proc(req.Id)
	if err != nil {
		return nil, err
	}
	if err := b.svc.Kill(ctx, p.execID, syscall.Signal(req.Signal), false); err != nil {
		return nil, status.Errorf(codes.Internal, "signal %d: %v", req.Signal, err)
	}
	return &api.Empty{}, nil
}

func (b *broker) Wait(ctx context.Context, req *api.ProcessRequest) (*api.WaitResponse, error) {
	p, err := b.proc(req.Id)
	if err != nil {
		return nil, err
	}
	p.waitOnce.Do(func() {
		p.exit, p.waitErr = b.svc.Wait(ctx, p.execID)
		if p.waitErr == nil {
			_, _ = b.svc.Delete(context.WithoutCancel(ctx), p.execID)
		}
	})
	if p.waitErr != nil {
		return nil, status.Errorf(codes.Unavailable, "wait: %v", p.waitErr)
	}
	b.mu.Lock()
	p.waited = true
	b.releaseLocked(p)
	b.mu.Unlock()
	return waitResponse(p.exit.Status), nil
}

// outputEnded marks one output of p at EOF and releases p when it is done.
func (b *broker) outputEnded(p *proc, stream api.Stream) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if stream == api.Stream_STDERR {
		p.stderrEOF = true
	} else {
		p.stdoutEOF = true
	}
	b.releaseLocked(p)
}

// releaseLocked closes and removes p's FIFOs and drops it once it was
// waited for and its outputs ended (a terminal has no stderr).
func (b *broker) releaseLocked(p *proc) {
	if p.released || !p.waited || !p.stdoutEOF || (!p.stderrEOF && !p.terminal) {
		return
	}
	p.released = true
	delete(b.procs, p.execID)
	go p.close()
}

// waitResponse reads status as containerd reports it: 128+n for a process
// killed by signal n.
func waitResponse(st uint32) *api.WaitResponse {
	if st > 128 && st < 128+65 {
		return &api.WaitResponse{ExitCode: -1, Signal: st - 128}
	}
	return &api.WaitResponse{ExitCode: int32(st)}
}

func (b *broker) ResizeTTY(ctx context.Context, req *api.ResizeTTYRequest) (*api.Empty, error) {
	p, err := b.proc(req.Id)
	if err != nil {
		return nil, err
	}
	if err := b.svc.ResizePty(ctx, p.execID, req.Cols, req.Rows); err != nil {
		return nil, status.Errorf(codes.Internal, "resize: %v", err)
	}
	return &api.Empty{}, nil
}

func (b *broker) AcceptChannel(context.Context, *api.AcceptChannelRequest) (*api.Channel, error) {
	return nil, status.Error(codes.Unimplemented, errNoPMI)
}
func (b *broker) ChannelRead(context.Context, *api.ChannelReadRequest) (*api.ReadOutputResponse, error) {
	return nil, status.Error(codes.Unimplemented, errNoPMI)
}
func (b *broker) ChannelWrite(context.Context, *api.ChannelWriteRequest) (*api.WriteStdinResponse, error) {
	return nil, status.Error(codes.Unimplemented, errNoPMI)
}
func (b *broker) ChannelClose(context.Context, *api.ChannelCloseRequest) (*api.Empty, error) {
	return nil, status.Error(codes.Unimplemented, errNoPMI)
}

// closeAll closes every process's stdio (the sandbox is gone).
func (b *broker) closeAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, p := range b.procs {
		p.released = true
		delete(b.procs, id)
		p.close()
	}
}

// handshake is a ttrpc.Handshaker of a function.
type handshake func(ctx context.Context, conn net.Conn) (net.Conn, any, error)

func (h handshake) Handshake(ctx context.Context, conn net.Conn) (net.Conn, any, error) {
	return h(ctx, conn)
}

func peerUID(c net.Conn) (uint32, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("not a unix socket: %T", c)
	}
	return control.PeerUID(uc)
}
