// Package agent is the host side of the guest agent API: a ttrpc client for
// the service in launcher/agent/guest and the relay of a process's stdio,
// signals and exit status between a host process (the task Slurm started)
// and its twin inside the microVM.
package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
)

// chunk is the size of one stdio transfer (64 KiB).
const chunk = 64 << 10

// ErrCommandNotFound is returned by Start when argv[0] names no executable
// in the image; a shell reports that with exit status 127.
var ErrCommandNotFound = driver.ErrCommandNotFound

// Client talks to one guest agent over one connection.
type Client struct {
	api.AgentService
	c *ttrpc.Client
}

// NewClient wraps conn (one agent stream) in a ttrpc client.
func NewClient(conn net.Conn) *Client {
	c := ttrpc.NewClient(conn)
	return &Client{AgentService: api.NewAgentClient(c), c: c}
}

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }

// ExitStatus is how a process ended: Signal != 0 when it was killed by a
// signal, else Code is its exit code.
type ExitStatus struct {
	Code   int
	Signal syscall.Signal
	// OOMKilled: the guest's OOM killer killed the process or one of
	// its children (api.WaitResponse.oom_killed).
	OOMKilled bool
	// GuestRun is the process's run in the guest, from its start to the
	// agent's reaping it, on the guest's clock (api.WaitResponse.run_ns);
	// 0 when the agent does not measure it.
	GuestRun time.Duration
}

func (s ExitStatus) String() string {
	if s.Signal != 0 {
		return "killed by signal " + s.Signal.String()
	}
	return fmt.Sprintf("exit code %d", s.Code)
}

// Process is a process running in the guest.
type Process struct {
	c    *Client
	ID   string
	Pid  uint32
	Path string
	tty  bool
	// stdinClosed: the agent started the process with its stdin at end
	// of file (api.CreateProcessRequest.stdin_closed), so Relay has
	// nothing to send or close.
	stdinClosed bool
	// GuestCreate is the agent's share of Start, from the request's
	// arrival to the process's start, on the guest's clock
	// (api.CreateProcessResponse.create_ns); 0 when not measured.
	GuestCreate time.Duration

	forwards []*api.ForwardInfo

	outputs sync.WaitGroup
	errMu   sync.Mutex
	err     error
}

// Start creates a process in the guest. A command missing from the image
// gives an error wrapping ErrCommandNotFound.
func (c *Client) Start(ctx context.Context, req *api.CreateProcessRequest) (*Process, error) {
	if req.HostTimeNs == 0 {
		// The guest sets its clock to the host's before the process
		// starts (guest.Service.syncClock).
		req.HostTimeNs = time.Now().UnixNano()
	}
	resp, err := c.CreateProcess(ctx, req)
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return nil, fmt.Errorf("%w: %s", ErrCommandNotFound, status.Convert(err).Message())
		}
		return nil, fmt.Errorf("create process %q: %s", req.Argv[0], status.Convert(err).Message())
	}
	return &Process{
		c: c, ID: resp.Id, Pid: resp.Pid, Path: string(resp.Path), tty: req.Terminal, forwards: resp.Forwards,
		stdinClosed: resp.StdinClosed, GuestCreate: time.Duration(resp.CreateNs),
	}, nil
}

func (p *Process) setErr(err error) {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	if p.err == nil {
		p.err = err
	}
}

// Relay copies stdin into the process and its stdout and stderr out, until
// the process's output ends. stdin may be nil (no input: the process sees
// EOF at once). A process started with stdin_closed has its stdin at EOF
// already: stdin is then not read. Wait returns after the output is
// drained.
func (p *Process) Relay(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) {
	switch {
	case p.stdinClosed:
	case stdin == nil:
		// An agent that did not honour stdin_closed (or was not asked).
		_, _ = p.c.CloseStdin(ctx, &api.ProcessRequest{Id: p.ID})
	default:
		go p.copyStdin(ctx, stdin)
	}
	p.outputs.Add(1)
	go p.copyOutput(ctx, api.Stream_STDOUT, stdout)
	if !p.tty {
		p.outputs.Add(1)
		go p.copyOutput(ctx, api.Stream_STDERR, stderr)
	}
}

func (p *Process) copyStdin(ctx context.Context, r io.Reader) {
	buf := make([]byte, chunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := p.c.WriteStdin(ctx, &api.WriteStdinRequest{Id: p.ID, Data: buf[:n]}); werr != nil {
				return // the process closed its stdin or is gone
			}
		}
		if err != nil {
			_, _ = p.c.CloseStdin(ctx, &api.ProcessRequest{Id: p.ID})
			return
		}
	}
}

func (p *Process) copyOutput(ctx context.Context, stream api.Stream, w io.Writer) {
	defer p.outputs.Done()
	for {
		resp, err := p.c.ReadOutput(ctx, &api.ReadOutputRequest{Id: p.ID, Stream: stream, Len: chunk})
		if err != nil {
			if ctx.Err() == nil {
				p.setErr(fmt.Errorf("read %s of process %s: %w", stream, p.ID, err))
			}
			return
		}
		if len(resp.Data) > 0 && w != nil {
			if _, err := w.Write(resp.Data); err != nil {
				w = nil // the reader went away; keep draining the guest
			}
		}
		if resp.Eof {
			return
		}
	}
}

// Signal delivers sig to the process.
func (p *Process) Signal(ctx context.Context, sig syscall.Signal) error {
	if _, err := p.c.Signal(ctx, &api.SignalRequest{Id: p.ID, Signal: uint32(sig)}); err != nil {
		return fmt.Errorf("signal %s to process %s: %w", sig, p.ID, err)
	}
	return nil
}

// Resize sets the terminal size of a process started with a terminal.
func (p *Process) Resize(ctx context.Context, rows, cols uint16) error {
	_, err := p.c.ResizeTTY(ctx, &api.ResizeTTYRequest{Id: p.ID, Rows: uint32(rows), Cols: uint32(cols)})
	return err
}

// Wait waits for the process to end and for its output to be relayed.
func (p *Process) Wait(ctx context.Context) (ExitStatus, error) {
	resp, err := p.c.Wait(ctx, &api.ProcessRequest{Id: p.ID})
	if err != nil {
		return ExitStatus{}, fmt.Errorf("wait for process %s: %w", p.ID, err)
	}
	p.outputs.Wait()
	p.errMu.Lock()
	rerr := p.err
	p.errMu.Unlock()
	run := time.Duration(resp.RunNs)
	if resp.Signal != 0 {
		return ExitStatus{Code: 128 + int(resp.Signal), Signal: syscall.Signal(resp.Signal), OOMKilled: resp.OomKilled, GuestRun: run}, rerr
	}
	return ExitStatus{Code: int(resp.ExitCode), OOMKilled: resp.OomKilled, GuestRun: run}, rerr
}

// Forwards are the guest side of the request's forwards, in request order.
func (p *Process) Forwards() []*api.ForwardInfo { return p.forwards }

// RelayChannel copies bytes both ways between conn (the host end, e.g. the
// task's inherited PMI_FD) and the guest channel id, until both directions
// reached EOF or ctx ends. It closes conn.
func (p *Process) RelayChannel(ctx context.Context, id string, conn io.ReadWriteCloser) {
	done := make(chan struct{}, 2)
	go func() { // host -> guest
		defer func() { done <- struct{}{} }()
		buf := make([]byte, chunk)
		for {
			n, err := conn.Read(buf)
			if n > 0 {
				if _, werr := p.c.ChannelWrite(ctx, &api.ChannelWriteRequest{Id: id, Data: buf[:n]}); werr != nil {
					return
				}
			}
			if err != nil {
				_, _ = p.c.ChannelClose(ctx, &api.ChannelCloseRequest{Id: id})
				return
			}
		}
	}()
	go func() { // guest -> host
		defer func() { done <- struct{}{} }()
		for {
			resp, err := p.c.ChannelRead(ctx, &api.ChannelReadRequest{Id: id, Len: chunk})
			if err != nil {
				return
			}
			if len(resp.Data) > 0 {
				if _, err := conn.Write(resp.Data); err != nil {
					return
				}
			}
			if resp.Eof {
				if hc, ok := conn.(interface{ CloseWrite() error }); ok {
					_ = hc.CloseWrite()
				}
				return
			}
		}
	}()
	<-done
	<-done
	conn.Close()
}

// ServeListener accepts the guest connections of listener forward index and
// relays each to a host connection from dial, until the process exits or
// ctx ends.
func (p *Process) ServeListener(ctx context.Context, index uint32, dial func(context.Context) (net.Conn, error)) {
	for {
		ch, err := p.c.AcceptChannel(ctx, &api.AcceptChannelRequest{Id: p.ID, Forward: index})
		if err != nil {
			return
		}
		conn, err := dial(ctx)
		if err != nil {
			p.setErr(fmt.Errorf("forward %d: connect on the host: %w", index, err))
			_, _ = p.c.ChannelClose(ctx, &api.ChannelCloseRequest{Id: ch.Id})
			continue
		}
		go p.RelayChannel(ctx, ch.Id, conn)
	}
}
