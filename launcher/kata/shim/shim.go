package shim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/slurm-microvm/slurm-microvm/launcher/kata/taskapi"
)

// Options start one shim.
type Options struct {
	// Binary is the shim binary (containerd-shim-kata-v2, or
	// containerd-shim-runc-v2 in tests); a name without "/" is looked up
	// in PATH.
	Binary string
	// ID names the sandbox container (containerd identifier rules:
	// letters, digits and ._- between them, at most 76 characters).
	ID string
	// Namespace is the containerd namespace the shim runs in (same rules);
	// it is part of the shim's socket name and of runc's state path.
	Namespace string
	// Bundle is the absolute path of the OCI bundle: Bundle/config.json
	// (written by the caller before Start: the shim reads it at start).
	// Its last element must be ID: a shim's `delete` (Cleanup) finds the
	// bundle as <dir of its working directory>/<id> (containerd's
	// runtime/v2 layout, .../<namespace>/<id>).
	Bundle string
	// StateDir is an absolute directory private to the step (root-owned,
	// 0700): the events socket and the shim's -address live there. It
	// must be unique to the sandbox: the shim names its socket after
	// address, namespace and id (see doc.go). Its path must leave room for
	// a unix socket name (at most 107 bytes with "/containerd.sock.ttrpc").
	StateDir string
	// Env is added to the shim's environment (KATA_CONF_FILE=...); see
	// Start for what else it gets.
	Env []string
	// Logger receives the shim's log (its <bundle>/log FIFO) and this
	// package's messages; nil discards them. Debug enables the shim's
	// -debug.
	Logger *slog.Logger
}

// Record is what Cleanup needs to remove a shim from another process (stop
// or gc after a launcher crash). The driver persists it (JSON) in the
// step's state before it uses the shim.
type Record struct {
	// Binary is the shim binary's absolute path.
	Binary string `json:"binary"`
	// ID, Namespace and Bundle are Options'.
	ID        string `json:"id"`
	Namespace string `json:"namespace"`
	Bundle    string `json:"bundle"`
	// Address is the -address the shim got (a path under StateDir, not
	// served; it names the shim's socket).
	Address string `json:"address"`
	// Events is the socket of the events server (TTRPC_ADDRESS).
	Events string `json:"events"`
	// Socket is the unix socket the shim serves the task API on.
	Socket string `json:"socket"`
	// DebugSocket is the second socket a shim built on containerd 2.x
	// serves when started with -debug (debugSocket); "" without -debug.
	DebugSocket string `json:"debug_socket,omitempty"`
	// Version is the task API version the shim serves (2 or 3).
	Version int `json:"version"`
	// Pid is the serving shim's pid and StartTime its start time (clock
	// ticks after boot, /proc/<pid>/stat field 22), which tells the shim
	// from a later process that reused the pid.
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

// Shim is one running shim that this process started and reaps.
type Shim struct {
	rec    Record
	log    *slog.Logger
	conn   *ttrpc.Client
	client *client
	events *events
	logf   *os.File
	logEnd chan struct{}
	exited chan struct{} // closed when the shim has exited and been reaped
	once   sync.Once
}

// Service returns the task API of the shim's sandbox container.
func (s *Shim) Service() taskapi.Service { return &service{s: s, c: s.client} }

// Pid returns the serving shim's pid.
func (s *Shim) Pid() int { return s.rec.Pid }

// Record returns what Cleanup needs; persist it before using the shim.
func (s *Shim) Record() Record { return s.rec }

// Exited is closed once the shim process has exited (and been reaped).
func (s *Shim) Exited() <-chan struct{} { return s.exited }

// identifier is containerd's rule for ids and namespaces
// (pkg/identifiers).
var identifier = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$`)

const maxIdentifier = 76

// maxSocketPath is the longest unix socket path (sun_path is 108 bytes
// with its NUL).
const maxSocketPath = 107

// defaultPath is the shim's PATH unless Options.Env sets one: the shim
// finds its helpers (runc, the VMM) there, so it is not the launcher's
// PATH, which a job may influence.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func (o *Options) check() error {
	for _, f := range []struct{ what, v string }{{"ID", o.ID}, {"Namespace", o.Namespace}} {
		if len(f.v) > maxIdentifier || !identifier.MatchString(f.v) {
			return fmt.Errorf("shim %s %q: must be letters and digits, with single . _ or - between them, at most %d characters (containerd identifiers)", f.what, f.v, maxIdentifier)
		}
	}
	if !filepath.IsAbs(o.Bundle) || filepath.Base(o.Bundle) != o.ID {
		return fmt.Errorf("shim bundle %q: must be an absolute path ending in the id %q (a shim's delete finds the bundle as <parent>/<id>)", o.Bundle, o.ID)
	}
	if _, err := os.Stat(filepath.Join(o.Bundle, "config.json")); err != nil {
		return fmt.Errorf("shim bundle %s: write config.json before Start (the shim reads it at start): %w", o.Bundle, err)
	}
	if !filepath.IsAbs(o.StateDir) {
		return fmt.Errorf("shim state directory %q: must be an absolute path", o.StateDir)
	}
	if fi, err := os.Stat(o.StateDir); err != nil || !fi.IsDir() {
		return fmt.Errorf("shim state directory %s: must be an existing directory (the step's private state): %v", o.StateDir, err)
	}
	if n := len(eventsPath(o.StateDir)); n > maxSocketPath {
		return fmt.Errorf("shim state directory %s: too long for a unix socket in it (%d bytes, at most %d): use a shorter state directory", o.StateDir, n, maxSocketPath)
	}
	if o.Binary == "" {
		return errors.New("shim binary: empty (set the path of containerd-shim-kata-v2)")
	}
	return nil
}

// shimSocketDir is where shims built on containerd's shim library put
// their sockets (containerd defaults.DefaultStateDir + "/s").
const shimSocketDir = "/run/containerd/s"

// debugSocket is the path of the debug socket a containerd 2.x shim
// serves with -debug: sha256 of <address>/<namespace>/<id>/debug under
// shimSocketDir (containerd pkg/shim CreateSocketAddress). The shim
// removes it when it exits cleanly, not when it is killed.
func debugSocket(address, namespace, id string) string {
	d := sha256.Sum256([]byte(filepath.Join(address, namespace, id, "debug")))
	return filepath.Join(shimSocketDir, hex.EncodeToString(d[:]))
}

func addressPath(stateDir string) string { return filepath.Join(stateDir, "containerd.sock") }
func eventsPath(stateDir string) string  { return addressPath(stateDir) + ".ttrpc" }

// Start starts the shim for one sandbox and connects to its task API. It
// runs, in Bundle,
//
//	<Binary> -namespace <Namespace> -address <StateDir>/containerd.sock -id <ID> [-debug] start
//
// as containerd does (core/runtime/v2/command.go), with containerd 2.4's
// bootstrap parameters on stdin (shims built on 2.4+ need them, older ones
// ignore them) and the environment PATH (defaultPath),
// TTRPC_ADDRESS=<StateDir>/containerd.sock.ttrpc (an events server this
// package serves), GRPC_ADDRESS, NAMESPACE, then Options.Env. The
// launcher's own environment is not passed. -publish-binary is not passed:
// shims publish to TTRPC_ADDRESS.
//
// Before, it creates and opens <Bundle>/log (a FIFO the shim writes its log
// to, drained into Logger: the shim dies when no one holds it). After, it
// checks that the shim that answers is the one it started: its parent is
// this process and it has no container named ID yet (see doc.go).
//
// The process must be a child subreaper (BecomeSubreaper), else Start
// returns an error naming it. On error after the shim started, Start
// removes it (Cleanup). The shim outlives ctx: ctx bounds Start only.
func Start(ctx context.Context, o Options) (*Shim, error) {
	log := orDiscard(o.Logger)
	if err := o.check(); err != nil {
		return nil, err
	}
	if ok, err := isSubreaper(); err != nil {
		return nil, err
	} else if !ok {
		return nil, errors.New("start a shim: this process is not a child subreaper, so the daemonized shim would go to PID 1 unreaped: call shim.BecomeSubreaper first (once, process-wide)")
	}
	bin := o.Binary
	if !strings.Contains(bin, "/") {
		p, err := exec.LookPath(bin)
		if err != nil {
			return nil, fmt.Errorf("shim binary %q: not found in PATH: %w", bin, err)
		}
		bin = p
	}
	bin, err := filepath.Abs(bin)
	if err != nil {
		return nil, fmt.Errorf("shim binary %q: %w", o.Binary, err)
	}
	rec := Record{
		Binary:    bin,
		ID:        o.ID,
		Namespace: o.Namespace,
		Bundle:    o.Bundle,
		Address:   addressPath(o.StateDir),
		Events:    eventsPath(o.StateDir),
	}
	s := &Shim{rec: rec, log: log.With("shim", o.ID), exited: make(chan struct{})}
	ok := false
	defer func() {
		if !ok && s.rec.Pid == 0 {
			// Not known to be a shim this Start started: leave it, but
			// remove its socket if no one serves it (it died at start).
			s.release()
			_ = os.Remove(filepath.Join(o.Bundle, "log"))
			for _, p := range []string{s.rec.Socket, s.rec.DebugSocket} {
				if c, err := net.DialTimeout("unix", p, time.Second); p != "" && err != nil {
					_ = os.Remove(p)
				} else if err == nil {
					c.Close()
				}
			}
		} else if !ok {
			s.release()
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := Cleanup(cctx, s.rec, log); err != nil {
				log.Warn("remove the shim that failed to start", "err", err)
			}
		}
	}()

	if s.events, err = serveEvents(rec.Events, s.log); err != nil {
		return nil, err
	}
	if err := s.openLog(); err != nil {
		return nil, err
	}
	debug := log.Enabled(ctx, slog.LevelDebug)
	if debug {
		s.rec.DebugSocket = debugSocket(rec.Address, o.Namespace, o.ID)
	}
	params, err := bootstrapParams(o.ID, o.Namespace, rec.Address, rec.Events, debug)
	if err != nil {
		return nil, err
	}
	since, err := bootTicks()
	if err != nil {
		return nil, err
	}
	// Empty stdin first: shims built on containerd 1.x parse stdin as
	// runtime options and fail on bootstrap parameters ("type with url
	// <id>: not found"); shims built on 2.4+ refuse an empty stdin before
	// they fork (errDeprecatedBootstrapAPI) and get the parameters.
	out, err := s.run(ctx, "start", debug, nil, o.Env)
	if err != nil && strings.Contains(err.Error(), bootstrapRequired) {
		s.log.Debug("the shim wants bootstrap parameters on stdin", "err", err)
		out, err = s.run(ctx, "start", debug, bytes.NewReader(params), o.Env)
	}
	if err != nil {
		return nil, err
	}
	b, err := parseBootstrap(out)
	if err != nil {
		return nil, fmt.Errorf("start shim %s: %w", bin, err)
	}
	s.rec.Socket, s.rec.Version = b.Socket, b.Version
	conn, err := net.Dial("unix", b.Socket)
	if err != nil {
		return nil, fmt.Errorf("connect to shim %s at %s: %w", o.ID, b.Socket, err)
	}
	s.conn = ttrpc.NewClient(conn)
	s.client = newClient(s.conn, b.Version, o.ID)
	if err := s.verify(ctx, since); err != nil {
		return nil, err
	}
	ok = true
	s.log.Debug("shim started", "pid", s.rec.Pid, "socket", s.rec.Socket, "task_api", b.Version)
	return s, nil
}

// run runs `<binary> <flags> action` in the bundle and returns its stdout.
func (s *Shim) run(ctx context.Context, action string, debug bool, stdin io.Reader, env []string) ([]byte, error) {
	return runShim(ctx, s.rec, action, debug, stdin, env)
}

func runShim(ctx context.Context, r Record, action string, debug bool, stdin io.Reader, env []string) ([]byte, error) {
	args := []string{"-namespace", r.Namespace, "-address", r.Address, "-id", r.ID}
	if action == "delete" {
		args = append(args, "-bundle", r.Bundle)
	}
	if debug {
		args = append(args, "-debug")
	}
	args = append(args, action)
	cmd := exec.CommandContext(ctx, r.Binary, args...)
	cmd.Dir = r.Bundle
	cmd.Stdin = stdin
	cmd.Env = append([]string{defaultPath,
		"TTRPC_ADDRESS=" + r.Events,
		"GRPC_ADDRESS=" + r.Address,
		"NAMESPACE=" + r.Namespace,
	}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("run %s %s: %w: %s", r.Binary, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// shutdown asks the shim to exit and waits for it (see service.Shutdown).
func (s *Shim) shutdown(ctx context.Context) error {
	var err error
	if s.client != nil {
		err = s.client.call(ctx, "Shutdown", &task.ShutdownRequest{ID: s.rec.ID}, &emptypb.Empty{})
		if err != nil && !closedErr(err) {
			err = fmt.Errorf("shut down the shim of %s: %w", s.rec.ID, err)
		} else {
			err = nil
		}
	}
	if err == nil {
		t := time.NewTimer(shutdownWait)
		defer t.Stop()
		select {
		case <-s.exited:
		case <-ctx.Done():
			err = fmt.Errorf("shim %s (pid %d) did not exit after Shutdown: %w (delete its container first, or Cleanup)", s.rec.ID, s.rec.Pid, ctx.Err())
		case <-t.C:
			err = fmt.Errorf("shim %s (pid %d) did not exit %v after Shutdown (delete its container first, or Cleanup)", s.rec.ID, s.rec.Pid, shutdownWait)
		}
	}
	if err != nil {
		return err
	}
	s.release()
	for _, p := range []string{s.rec.Socket, s.rec.DebugSocket, filepath.Join(s.rec.Bundle, "log")} {
		if p != "" {
			_ = os.Remove(p)
		}
	}
	return nil
}

// release closes this process's ends: the connection, the events server
// and the log FIFO. It leaves the shim process alone.
func (s *Shim) release() {
	s.once.Do(func() {
		if s.conn != nil {
			s.conn.Close()
		}
		if s.events != nil {
			s.events.close()
		}
		if s.logf != nil {
			s.logf.Close()
			<-s.logEnd
		}
	})
}

// orDiscard is log, or a logger that discards when log is nil.
func orDiscard(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return log
}
