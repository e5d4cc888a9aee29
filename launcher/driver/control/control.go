package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// Listen creates the control socket of stateDir (state.ControlSocket)
// under a temporary name, gives it to uid:gid with mode 0600 and renames it
// into place: the socket a client finds is already the job user's. Errors
// name the socket.
func Listen(stateDir string, uid, gid uint32) (net.Listener, error) {
	path := filepath.Join(stateDir, state.ControlSocket)
	tmp := path + ".new"
	_ = os.Remove(tmp)
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", tmp, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	for _, step := range []func() error{
		func() error { return os.Chmod(tmp, 0o600) },
		func() error { return os.Chown(tmp, int(uid), int(gid)) },
		func() error { return os.Rename(tmp, path) },
	} {
		if err := step(); err != nil {
			l.Close()
			os.Remove(tmp)
			return nil, fmt.Errorf("control socket %s: %w", path, err)
		}
	}
	return l, nil
}

// PeerUID is the uid of the process at the other end of c (SO_PEERCRED).
func PeerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, serr
	}
	return cred.Uid, nil
}

// Attach connects to the control socket in stateDir; usable without a
// configured driver (the exec entry).
func Attach(ctx context.Context, stateDir string) (driver.Client, error) {
	var dl net.Dialer
	conn, err := dl.DialContext(ctx, "unix", filepath.Join(stateDir, state.ControlSocket))
	if err != nil {
		return nil, explain(ctx, stateDir, fmt.Errorf("connect to sandbox: %w", err))
	}
	return &client{c: agent.NewClient(conn), stateDir: stateDir}, nil
}

// client and process turn every error seen after the VMM died into a
// *VMMExitedError naming its end (explain), not the closed connection.
type client struct {
	c        *agent.Client
	stateDir string
}

func (c *client) Close() error { return c.c.Close() }

func (c *client) Exec(ctx context.Context, spec driver.ProcessSpec) (driver.Process, error) {
	req := &api.CreateProcessRequest{
		Argv: api.Bytes(spec.Argv), Env: api.Bytes(spec.Env), Cwd: []byte(spec.Cwd),
		Terminal: spec.Terminal, Rows: uint32(spec.Rows), Cols: uint32(spec.Cols),
		StdinClosed: spec.StdinClosed && !spec.Terminal,
	}
	for _, sig := range spec.PendingSignals {
		req.PendingSignals = append(req.PendingSignals, uint32(sig))
	}
	for _, f := range spec.FDs {
		req.Forwards = append(req.Forwards, &api.Forward{Fd: uint32(f.GuestFD)})
	}
	for _, l := range spec.Listeners {
		req.Forwards = append(req.Forwards, &api.Forward{Listen: l.Listen, Replace: l.Replace})
	}
	p, err := c.c.Start(ctx, req)
	if err != nil {
		return nil, explain(ctx, c.stateDir, err)
	}
	info := p.Forwards()
	for i, f := range spec.FDs {
		go p.RelayChannel(ctx, info[i].Channel, f.Host)
	}
	for i, l := range spec.Listeners {
		go p.ServeListener(ctx, uint32(len(spec.FDs)+i), l.Dial)
	}
	return process{p, c.stateDir}, nil
}

type process struct {
	p        *agent.Process
	stateDir string
}

func (p process) Relay(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) {
	p.p.Relay(ctx, stdin, stdout, stderr)
}
func (p process) Signal(ctx context.Context, sig syscall.Signal) error { return p.p.Signal(ctx, sig) }
func (p process) Resize(ctx context.Context, rows, cols uint16) error {
	return p.p.Resize(ctx, rows, cols)
}
func (p process) Path() string { return p.p.Path }
func (p process) Wait(ctx context.Context) (driver.ExitStatus, error) {
	st, err := p.p.Wait(ctx)
	return driver.ExitStatus{Code: st.Code, Signal: st.Signal, OOMKilled: st.OOMKilled}, explain(ctx, p.stateDir, err)
}

// Endpoint is a sandbox's control socket as its driver serves it
// (driver.Sandbox's Listen and Serve): created once by Listen, served by
// the driver's own serve function until the step ends.
type Endpoint struct {
	// StateDir is the step's state directory; UID and GID the job's.
	StateDir string
	UID, GID uint32
	// OnFirstClient, when set, is called once, after the first Accept
	// of a client (driver.SandboxConfig.OnFirstExec).
	OnFirstClient func()
	l             net.Listener
}

// firstListener calls first once, after its first accepted connection.
type firstListener struct {
	net.Listener
	once  sync.Once
	first func()
}

func (l *firstListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.once.Do(l.first)
	}
	return c, err
}

// Listen creates the socket (Listen); the socket a client finds is
// already the job user's.
func (e *Endpoint) Listen() error {
	l, err := Listen(e.StateDir, e.UID, e.GID)
	if err != nil {
		return err
	}
	e.l = l
	return nil
}

// Serve runs serve on the socket (made by Listen first when it is not
// yet) until ctx ends or done is closed; then the listener is closed, the
// socket removed, and Serve returns once serve did. What serve returns
// after that, or for a closed listener, is not an error.
func (e *Endpoint) Serve(ctx context.Context, done <-chan struct{}, serve func(net.Listener) error) error {
	if e.l == nil {
		if err := e.Listen(); err != nil {
			return err
		}
	}
	defer os.Remove(filepath.Join(e.StateDir, state.ControlSocket))
	returned := make(chan struct{})
	defer close(returned)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
		case <-returned:
		}
		e.l.Close()
	}()
	var l net.Listener = e.l
	if e.OnFirstClient != nil {
		l = &firstListener{Listener: e.l, first: e.OnFirstClient}
	}
	err := serve(l)
	select {
	case <-ctx.Done():
		return nil
	case <-done:
		return nil
	default:
	}
	if err == nil || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
