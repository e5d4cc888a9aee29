package agent_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/guest"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/transport"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// startAgent serves the guest service on one end of a socketpair through the
// same yamux transport the VM uses, and returns a session for the host end.
// Processes run on this host without chroot, as uid/gid.
func startAgent(t *testing.T, uid, gid uint32) *transport.Session {
	t.Helper()
	// Non-blocking, so os.NewFile puts the ends in the poller and Close
	// ends a pending Read: with blocking ends, yamux's Close waits for a
	// read that nothing ends and the cleanup hangs now and then.
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	hostEnd := os.NewFile(uintptr(fds[0]), "host")
	guestEnd := os.NewFile(uintptr(fds[1]), "guest")
	l, err := transport.Listen(guestEnd)
	if err != nil {
		t.Fatal(err)
	}
	svc := guest.New(guest.Options{})
	srv, err := svc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = srv.Serve(ctx, l) }()
	sess, err := transport.NewHostSession(hostEnd, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sess.Close()
		cancel()
		srv.Close()
		svc.Close()
	})
	c := dial(t, sess)
	if _, err := c.Setup(context.Background(), &api.SetupRequest{Uid: uid, Gid: gid, Groups: []uint32{gid}, ImageEnv: api.Bytes([]string{"PATH=/usr/bin:/bin"})}); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if _, err := c.Setup(context.Background(), &api.SetupRequest{Uid: 0}); err == nil {
		t.Fatal("second Setup accepted: the identity must be fixed once")
	}
	return sess
}

func dial(t *testing.T, s *transport.Session) *agent.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := s.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := agent.NewClient(conn)
	t.Cleanup(func() { c.Close() })
	return c
}

func runIn(t *testing.T, c *agent.Client, stdin string, argv ...string) (string, string, agent.ExitStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := c.Start(ctx, &api.CreateProcessRequest{Argv: api.Bytes(argv), Env: api.Bytes([]string{"PATH=/nonexistent", "FOO=bar"})})
	if err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	var out, errb bytes.Buffer
	var in *strings.Reader
	if stdin != "" {
		in = strings.NewReader(stdin)
		p.Relay(ctx, in, &out, &errb)
	} else {
		p.Relay(ctx, nil, &out, &errb)
	}
	st, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("wait %v: %v", argv, err)
	}
	return out.String(), errb.String(), st
}

func TestProcesses(t *testing.T) {
	prereq.Root(t, "runs processes as another uid")
	sess := startAgent(t, 65534, 65534)
	c := dial(t, sess)
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB through stdin and back
	tests := []struct {
		name     string
		argv     []string
		stdin    string
		wantOut  string
		wantErr  string
		wantCode int
		wantSig  syscall.Signal
	}{
		{name: "stdout", argv: []string{"echo", "hello"}, wantOut: "hello\n"},
		{name: "stderr", argv: []string{"sh", "-c", "echo oops >&2"}, wantErr: "oops\n"},
		{name: "exit code", argv: []string{"sh", "-c", "exit 7"}, wantCode: 7},
		{name: "killed by signal", argv: []string{"sh", "-c", "kill -TERM $$"}, wantCode: 128 + 15, wantSig: syscall.SIGTERM},
		{name: "stdin", argv: []string{"cat"}, stdin: "hi\n", wantOut: "hi\n"},
		{name: "large stdin", argv: []string{"cat"}, stdin: big, wantOut: big},
		{name: "identity", argv: []string{"id", "-u"}, wantOut: "65534\n"},
		{name: "image PATH replaces host PATH", argv: []string{"sh", "-c", "echo $PATH $FOO"}, wantOut: "/usr/bin:/bin bar\n"},
		{name: "background child keeps stdout", argv: []string{"sh", "-c", "sleep 5 & echo done"}, wantOut: "done\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			out, errOut, st := runIn(t, c, tt.stdin, tt.argv...)
			if out != tt.wantOut {
				t.Errorf("stdout = %.80q, want %.80q", out, tt.wantOut)
			}
			if errOut != tt.wantErr {
				t.Errorf("stderr = %q, want %q", errOut, tt.wantErr)
			}
			if st.Code != tt.wantCode || st.Signal != tt.wantSig {
				t.Errorf("status = %v, want code %d signal %d", st, tt.wantCode, tt.wantSig)
			}
			if time.Since(start) > 4*time.Second {
				t.Errorf("took %v: output of an exited task must not wait for its background children", time.Since(start))
			}
		})
	}
}

func TestCommandNotFound(t *testing.T) {
	prereq.Root(t, "the agent runs processes as the task's uid")
	c := dial(t, startAgent(t, 65534, 65534))
	_, err := c.Start(context.Background(), &api.CreateProcessRequest{Argv: api.Bytes([]string{"no-such-command-xyz"})})
	if !errors.Is(err, agent.ErrCommandNotFound) {
		t.Fatalf("err = %v, want ErrCommandNotFound", err)
	}
}

// TestNonUTF8 carries bytes that are not UTF-8 in argv, an environment
// value and the working directory exactly, and names such a command in a
// clear error instead of failing the call with a protocol error.
func TestNonUTF8(t *testing.T) {
	prereq.Root(t, "the agent runs the workload as uid 65534")
	c := dial(t, startAgent(t, 65534, 65534))
	base, err := os.MkdirTemp("", "agent-nonutf8-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	dir := base + "/w\xff\xfe"
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := c.Start(ctx, &api.CreateProcessRequest{
		Argv: api.Bytes([]string{"sh", "-c", `printf '%s|%s|%s' "$1" "$V" "$(pwd)" | od -An -tx1 | tr -d ' \n'`, "sh", "a\xff\xfe"}),
		Env:  api.Bytes([]string{"V=\xff\xfe"}),
		Cwd:  []byte(dir),
	})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	var out, errb bytes.Buffer
	p.Relay(ctx, nil, &out, &errb)
	if st, err := p.Wait(ctx); err != nil || st.Code != 0 {
		t.Fatalf("wait: %v, %v (stderr %q)", st, err, errb.String())
	}
	want := hex.EncodeToString([]byte("a\xff\xfe|\xff\xfe|" + dir))
	if out.String() != want {
		t.Errorf("the process saw %s, want %s", out.String(), want)
	}
	_, err = c.Start(ctx, &api.CreateProcessRequest{Argv: api.Bytes([]string{"no-such-\xff"})})
	if !errors.Is(err, agent.ErrCommandNotFound) || !strings.Contains(err.Error(), `no-such-\xff`) {
		t.Errorf("missing command with a non-UTF-8 name: err %v, want ErrCommandNotFound naming no-such-\\xff", err)
	}
}

// startUntilReady starts `sh -c script` in the agent, relays its stdout
// to a pipe and waits for its first line, "ready". The pipe's read end
// is closed when t ends; the caller closes the write end.
func startUntilReady(t *testing.T, ctx context.Context, c *agent.Client, script string) (*agent.Process, *os.File, *os.File) {
	t.Helper()
	p, err := c.Start(ctx, &api.CreateProcessRequest{Argv: api.Bytes([]string{"sh", "-c", script})})
	if err != nil {
		t.Fatal(err)
	}
	pr, pw, _ := os.Pipe()
	t.Cleanup(func() { pr.Close() })
	p.Relay(ctx, nil, pw, os.Stderr)
	buf := make([]byte, 6)
	if _, err := pr.Read(buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("read ready: %q %v", buf, err)
	}
	return p, pr, pw
}

func TestSignalForwarding(t *testing.T) {
	prereq.Root(t, "the agent runs processes as the task's uid")
	c := dial(t, startAgent(t, 65534, 65534))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, pr, pw := startUntilReady(t, ctx, c, "trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.1; done")
	if err := p.Signal(ctx, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait(ctx)
	pw.Close()
	if err != nil {
		t.Fatal(err)
	}
	rest := make([]byte, 64)
	n, _ := pr.Read(rest)
	if st.Code != 3 || !strings.Contains(string(rest[:n]), "got-term") {
		t.Fatalf("status %v, output %q: the trap must run and exit 3", st, rest[:n])
	}
}

// TestSignalReachesTheTaskGroup: a forwarded signal reaches every process
// of the task, as Slurm's container signal does on the host: the shell's
// foreground sleep ends at once, so its trap runs now rather than when
// the sleep would have ended.
func TestSignalReachesTheTaskGroup(t *testing.T) {
	prereq.Root(t, "the agent runs processes as the task's uid")
	c := dial(t, startAgent(t, 65534, 65534))
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	p, _, pw := startUntilReady(t, ctx, c, "trap 'echo got-term; exit 3' TERM; echo ready; sleep 30; echo slept")
	time.Sleep(200 * time.Millisecond) // the sleep has started
	t0 := time.Now()
	if err := p.Signal(ctx, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st, err := p.Wait(ctx)
	pw.Close()
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 10*time.Second || st.Code != 3 {
		t.Errorf("status %v after %s: the trap must run at once (the task's sleep gets the signal too)", st, took)
	}
}

// TestShutdownLetsTrapsRun: Shutdown sends TERM before it kills, so a
// workload's trap still runs (a batch script's srun kills its tasks on the
// host right after scancel's TERM reaches them); one that ignores TERM is
// killed after ShutdownTermGrace.
func TestShutdownLetsTrapsRun(t *testing.T) {
	prereq.Root(t, "the agent runs processes as the task's uid")
	c := dial(t, startAgent(t, 65534, 65534))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // the task's uid writes there
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	marker := filepath.Join(dir, "trapped")
	trap, err := c.Start(ctx, &api.CreateProcessRequest{Argv: api.Bytes([]string{"sh", "-c", "trap 'echo yes > " + marker + "; exit 0' TERM; while :; do sleep 0.1; done"})})
	if err != nil {
		t.Fatal(err)
	}
	stubborn, err := c.Start(ctx, &api.CreateProcessRequest{Argv: api.Bytes([]string{"sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"})})
	if err != nil {
		t.Fatal(err)
	}
	trap.Relay(ctx, nil, io.Discard, io.Discard)
	stubborn.Relay(ctx, nil, io.Discard, io.Discard)
	time.Sleep(300 * time.Millisecond) // both have set their traps
	t0 := time.Now()
	if _, err := c.Shutdown(ctx, &api.Empty{}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	if b, err := os.ReadFile(marker); err != nil || string(b) != "yes\n" {
		t.Errorf("the TERM trap did not run before the kill: %q, %v", b, err)
	}
	if took < guest.ShutdownTermGrace/2 || took > guest.ShutdownTermGrace+5*time.Second {
		t.Errorf("Shutdown took %s with a process ignoring TERM; want about ShutdownTermGrace (%s)", took, guest.ShutdownTermGrace)
	}
}

func TestTerminal(t *testing.T) {
	prereq.Root(t, "the agent runs processes as the task's uid")
	c := dial(t, startAgent(t, 65534, 65534))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := c.Start(ctx, &api.CreateProcessRequest{Argv: api.Bytes([]string{"sh", "-c", "test -t 0 && test -t 1 && stty size"}), Terminal: true, Rows: 33, Cols: 101})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	p.Relay(ctx, nil, &out, nil)
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 0 {
		t.Fatalf("status %v err %v output %q", st, err, out.String())
	}
	if !strings.Contains(out.String(), "33 101") {
		t.Fatalf("output %q, want the terminal size 33 101", out.String())
	}
}

// TestForwards relays an inherited fd (as PMI2's PMI_FD) and a loopback
// listener (as PMIx's server URI) between host ends and a guest process.
func TestForwards(t *testing.T) {
	prereq.Root(t, "the agent runs processes as the task's uid")
	c := dial(t, startAgent(t, 65534, 65534))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// The "server" on the host: an echo with a prefix.
	hostL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostL.Close()
	go func() {
		for {
			conn, err := hostL.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				b := make([]byte, 64)
				n, _ := conn.Read(b)
				conn.Write(append([]byte("host-got:"), b[:n]...))
			}()
		}
	}()
	hostAddr := hostL.Addr().String()
	// The fd end on the host: the other side of a socketpair.
	fds, _ := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	hostFD := os.NewFile(uintptr(fds[0]), "pmi-host")
	peer := os.NewFile(uintptr(fds[1]), "pmi-peer")
	defer peer.Close()

	bb, err := exec.LookPath("busybox")
	if err != nil {
		prereq.Missing(t, "busybox-static is missing (its nc is the test's client)")
	}
	script := `read line <&5; echo "fd-got:$line"; echo "$URI"; a=${URI#tcp://}; ` +
		`echo hello | ` + bb + ` nc ${a%:*} ${a##*:}`
	p, err := c.Start(ctx, &api.CreateProcessRequest{
		Argv: api.Bytes([]string{"sh", "-c", script}),
		Env:  api.Bytes([]string{"URI=tcp://" + hostAddr}),
		Forwards: []*api.Forward{
			{Fd: 5},
			{Listen: "127.0.0.1:0", Replace: hostAddr},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	fw := p.Forwards()
	if len(fw) != 2 || fw[0].Channel == "" || fw[1].Address == "" || fw[1].Address == hostAddr {
		t.Fatalf("forward info %v", fw)
	}
	go p.RelayChannel(ctx, fw[0].Channel, hostFD)
	go p.ServeListener(ctx, 1, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", hostAddr)
	})
	if _, err := peer.Write([]byte("pmi-cmd\n")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	p.Relay(ctx, nil, &out, os.Stderr)
	st, err := p.Wait(ctx)
	if err != nil || st.Code != 0 {
		t.Fatalf("status %v err %v", st, err)
	}
	got := out.String()
	if !strings.Contains(got, "fd-got:pmi-cmd") {
		t.Errorf("output %q: the fd forward did not carry the host's bytes", got)
	}
	if !strings.Contains(got, "tcp://"+fw[1].Address) {
		t.Errorf("output %q: URI not rewritten to the guest listener %s", got, fw[1].Address)
	}
	if !strings.Contains(got, "host-got:hello") {
		t.Errorf("output %q: the listener forward did not reach the host server", got)
	}
}
