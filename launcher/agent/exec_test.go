package agent_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/guest"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// readAll reads stream of process id through ReadOutput until its end.
func readAll(t *testing.T, ctx context.Context, c *agent.Client, id string, stream api.Stream) string {
	t.Helper()
	var b strings.Builder
	for {
		r, err := c.ReadOutput(ctx, &api.ReadOutputRequest{Id: id, Stream: stream, Len: 64 << 10})
		if err != nil {
			t.Fatalf("read %s of process %s: %v", stream, id, err)
		}
		b.Write(r.Data)
		if r.Eof {
			return b.String()
		}
	}
}

// TestStdinClosed: a process started with stdin_closed reads end of file
// at once, with no CloseStdin call (one round trip less per exec: the
// host's Relay makes none), and later stdin calls find it closed as
// after CloseStdin. A terminal is never started so.
func TestStdinClosed(t *testing.T) {
	prereq.Root(t, "the agent runs processes as the task's uid")
	c := dial(t, startAgent(t, 65534, 65534))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.CreateProcess(ctx, &api.CreateProcessRequest{Argv: api.Bytes([]string{"sh", "-c", "cat; echo end"}), StdinClosed: true})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.StdinClosed {
		t.Error("the answer does not say stdin_closed was honoured")
	}
	// Without CloseStdin: cat must see end of file by itself.
	w, err := c.Wait(ctx, &api.ProcessRequest{Id: resp.Id})
	if err != nil {
		t.Fatalf("wait (cat still reading a stdin nobody closed?): %v", err)
	}
	if out := readAll(t, ctx, c, resp.Id, api.Stream_STDOUT); out != "end\n" || w.ExitCode != 0 {
		t.Errorf("stdout %q exit %d, want \"end\\n\" 0", out, w.ExitCode)
	}
	if _, err := c.WriteStdin(ctx, &api.WriteStdinRequest{Id: resp.Id, Data: []byte("x")}); err == nil {
		t.Error("WriteStdin to a closed stdin succeeded")
	}
	if _, err := c.CloseStdin(ctx, &api.ProcessRequest{Id: resp.Id}); err != nil {
		t.Errorf("CloseStdin of a closed stdin: %v", err)
	}

	tty, err := c.CreateProcess(ctx, &api.CreateProcessRequest{Argv: api.Bytes([]string{"sh", "-c", "test -t 0"}), Terminal: true, StdinClosed: true})
	if err != nil {
		t.Fatal(err)
	}
	if tty.StdinClosed {
		t.Error("a terminal's stdin was closed: its end of input is a character, not a state")
	}
	if _, err := c.CloseStdin(ctx, &api.ProcessRequest{Id: tty.Id}); err != nil {
		t.Fatal(err)
	}
	readAll(t, ctx, c, tty.Id, api.Stream_STDOUT)
	if w, err := c.Wait(ctx, &api.ProcessRequest{Id: tty.Id}); err != nil || w.ExitCode != 0 {
		t.Errorf("terminal process: %v %v, want exit 0 (stdin a terminal)", w, err)
	}
}

// oldAgent is an agent that does not know stdin_closed (an older one, or
// a server of the same API that does not implement it): the request's
// field is lost on its way, as protobuf drops a field it does not know.
type oldAgent struct{ *guest.Service }

func (o oldAgent) CreateProcess(ctx context.Context, req *api.CreateProcessRequest) (*api.CreateProcessResponse, error) {
	req.StdinClosed = false
	return o.Service.CreateProcess(ctx, req)
}

// TestStdinClosedFallback: against an agent that does not honour
// stdin_closed, Relay closes the stdin itself, so the process still ends.
func TestStdinClosedFallback(t *testing.T) {
	prereq.Root(t, "the agent runs processes as the task's uid")
	svc := guest.New(guest.Options{})
	t.Cleanup(svc.Close)
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	api.RegisterAgentService(srv, oldAgent{svc})
	l, err := net.Listen("unix", filepath.Join(t.TempDir(), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(context.Background(), l) }()
	t.Cleanup(func() { srv.Close() })
	conn, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := agent.NewClient(conn)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.Setup(ctx, &api.SetupRequest{Uid: 65534, Gid: 65534, ImageEnv: api.Bytes([]string{"PATH=/usr/bin:/bin"})}); err != nil {
		t.Fatal(err)
	}
	p, err := c.Start(ctx, &api.CreateProcessRequest{Argv: api.Bytes([]string{"sh", "-c", "cat; echo end"}), StdinClosed: true})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	p.Relay(ctx, nil, &out, nil)
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 || out.String() != "end\n" {
		t.Errorf("status %v, %v, stdout %q: want exit 0 and \"end\\n\" (Relay must close the stdin itself)", st, err, out.String())
	}
}

// TestOutputAtExit: what a process writes right before it exits is all
// relayed, whether a background child keeps the output open (ReadOutput
// ends once the process is gone and the pipe is drained, woken by the
// exit rather than by a poll) or the process closed its output long
// before it exited; and the exit status is exact in each case.
func TestOutputAtExit(t *testing.T) {
	prereq.Root(t, "the agent runs processes as the task's uid")
	c := dial(t, startAgent(t, 65534, 65534))
	const n = 1000000 // more than a pipe holds: part of it is still buffered at the exit
	tests := []struct {
		name     string
		script   string
		wantOut  string
		wantErr  string
		wantCode int
		wantSig  syscall.Signal
	}{
		{"last bytes before exit, background child holds the pipes", "sleep 3 & yes 0123456789 | head -c 1000000; printf tail >&2; exit 7", strings.Repeat("0123456789\n", n/11+1)[:n], "tail", 7, 0},
		{"no newline before exit", "sleep 3 & printf partial; exit 0", "partial", "", 0, 0},
		{"output closed early", "printf early; exec >&- 2>&-; sleep 0.5; exit 4", "early", "", 4, 0},
		{"killed after writing", "printf last; kill -KILL $$", "last", "", 128 + 9, syscall.SIGKILL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, st := runIn(t, c, "", "sh", "-c", tt.script)
			if out != tt.wantOut {
				t.Errorf("stdout: %d bytes %.40q, want %d bytes %.40q", len(out), out, len(tt.wantOut), tt.wantOut)
			}
			if errOut != tt.wantErr {
				t.Errorf("stderr %q, want %q", errOut, tt.wantErr)
			}
			if st.Code != tt.wantCode || st.Signal != tt.wantSig {
				t.Errorf("status %v, want code %d signal %d", st, tt.wantCode, tt.wantSig)
			}
		})
	}
}

// TestReadOutputCancel: a ReadOutput blocked on a running process's
// silent output ends with its request's context (the end wakes the read;
// nothing polls), and a later read on the stream ends with the process.
// (What a cancelled read takes from the pipe before it ends is its own
// answer's, which nobody receives: the host cancels reads only when it
// gives up on the process.)
func TestReadOutputCancel(t *testing.T) {
	prereq.Root(t, "the agent runs processes as the task's uid")
	c := dial(t, startAgent(t, 65534, 65534))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.CreateProcess(ctx, &api.CreateProcessRequest{Argv: api.Bytes([]string{"sleep", "30"})})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = c.ReadOutput(rctx, &api.ReadOutputRequest{Id: resp.Id, Stream: api.Stream_STDOUT})
	rcancel()
	if err == nil || (status.Code(err) != codes.DeadlineExceeded && !errors.Is(err, context.DeadlineExceeded)) {
		t.Fatalf("ReadOutput of a silent process with its context ended: %v, want deadline exceeded", err)
	}
	if _, err := c.Signal(ctx, &api.SignalRequest{Id: resp.Id, Signal: uint32(syscall.SIGTERM)}); err != nil {
		t.Fatal(err)
	}
	if out := readAll(t, ctx, c, resp.Id, api.Stream_STDOUT); out != "" {
		t.Errorf("stdout %q, want none", out)
	}
	if w, err := c.Wait(ctx, &api.ProcessRequest{Id: resp.Id}); err != nil || w.Signal != uint32(syscall.SIGTERM) {
		t.Errorf("wait: %v %v, want killed by SIGTERM", w, err)
	}
}
