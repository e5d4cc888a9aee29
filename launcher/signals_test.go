package launcher

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/guest"
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// serveGuest serves the real guest agent service on stateDir's control
// socket, as the supervisor's relay does for a booted microVM (processes
// run on this host, unchrooted, as nobody), and marks the sandbox ready.
func serveGuest(t *testing.T, stateDir string, grace time.Duration) {
	t.Helper()
	svc := guest.New(guest.Options{PendingSignalGrace: grace})
	srv, err := svc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(stateDir, state.ControlSocket))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); srv.Close(); svc.Close() })
	conn, err := net.Dial("unix", filepath.Join(stateDir, state.ControlSocket))
	if err != nil {
		t.Fatal(err)
	}
	c := agent.NewClient(conn)
	defer c.Close()
	if _, err := c.Setup(ctx, &api.SetupRequest{Uid: 65534, Gid: 65534, Groups: []uint32{65534}, ImageEnv: api.Bytes([]string{"PATH=/usr/bin:/bin"})}); err != nil {
		t.Fatal(err)
	}
	touch(t, stateDir, state.ReadyFile)
}

// TestExecSignalDuringBoot: a signal that reaches the exec process while
// its sandbox is not ready yet is not lost: the workload gets it once it
// has started and installed its handler (a shell's trap), and a workload
// that never handles it gets it after the grace, its default action ending
// the task as on the host.
func TestExecSignalDuringBoot(t *testing.T) {
	fixture.RequireRoot(t) // processes run as nobody
	tests := []struct {
		name       string
		script     string
		wantOut    string
		wantCode   int
		wantSignal syscall.Signal
	}{
		{"trapped", `sleep 0.3; trap 'echo got USR1; exit 0' USR1; i=0; while [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; echo no signal; exit 1`,
			"got USR1", 0, 0},
		{"default action", `sleep 8`, "", 128 + int(syscall.SIGUSR1), syscall.SIGUSR1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			dir := filepath.Join(t.TempDir(), "1.0.0")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			// The supervisor is alive (this process) but not ready.
			if err := state.WriteProc(filepath.Join(dir, state.SupervisorFile), os.Getpid()); err != nil {
				t.Fatal(err)
			}
			cfg := config.Defaults()
			cfg.Timeouts.Start.Duration = 20 * time.Second
			l := &Launcher{Config: &cfg}
			var out, errb bytes.Buffer
			type result struct {
				st  driver.ExitStatus
				err error
			}
			done := make(chan result, 1)
			go func() {
				st, err := l.Exec(ctx, dir, []string{"sh", "-c", tt.script}, []string{"HOME=/"}, Stdio{Out: &out, Err: &errb})
				done <- result{st, err}
			}()
			time.Sleep(500 * time.Millisecond) // Exec waits for the sandbox
			if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // the boot goes on
			serveGuest(t, dir, time.Second)
			var r result
			select {
			case r = <-done:
			case <-ctx.Done():
				t.Fatal("Exec did not return")
			}
			if r.err != nil {
				t.Fatalf("Exec: %v (stderr %q)", r.err, errb.String())
			}
			if !strings.Contains(out.String(), tt.wantOut) || r.st.Code != tt.wantCode || r.st.Signal != tt.wantSignal {
				t.Errorf("output %q, status %+v; want output %q, code %d, signal %v", out.String(), r.st, tt.wantOut, tt.wantCode, tt.wantSignal)
			}
		})
	}
}
