package launcher

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
)

// recordingClient is a driver.Client that records the spec it was given
// and the stdin its process's Relay got; the process exits 0 at once.
type recordingClient struct {
	spec  driver.ProcessSpec
	stdin io.Reader
}

func (c *recordingClient) Exec(_ context.Context, spec driver.ProcessSpec) (driver.Process, error) {
	c.spec = spec
	return recordingProcess{c}, nil
}
func (c *recordingClient) Close() error { return nil }

type recordingProcess struct{ c *recordingClient }

func (p recordingProcess) Relay(_ context.Context, stdin io.Reader, _, _ io.Writer) {
	p.c.stdin = stdin
}
func (recordingProcess) Signal(context.Context, syscall.Signal) error { return nil }
func (recordingProcess) Resize(context.Context, uint16, uint16) error { return nil }
func (recordingProcess) Wait(context.Context) (driver.ExitStatus, error) {
	return driver.ExitStatus{}, nil
}
func (recordingProcess) Path() string { return "/bin/true" }

// TestExecInNoInput: a task without input (no stdin, or /dev/null, as
// slurmstepd gives the tasks that get none) starts its process with
// stdin closed (driver.ProcessSpec.StdinClosed: no CloseStdin round trip)
// and relays no stdin; a task with an input keeps it, whatever its kind.
func TestExecInNoInput(t *testing.T) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	regular, err := os.CreateTemp(t.TempDir(), "stdin")
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	tests := []struct {
		name       string
		in         *os.File
		wantClosed bool
	}{
		{"no stdin", nil, true},
		{"/dev/null", null, true},
		{"a pipe", pr, false},
		{"a regular file (it may grow)", regular, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &recordingClient{}
			sigs := catchSignals()
			defer signal.Stop(sigs)
			if _, err := execIn(context.Background(), c, driver.ProcessSpec{Argv: []string{"true"}}, Stdio{In: tt.in}, sigs); err != nil {
				t.Fatal(err)
			}
			if c.spec.StdinClosed != tt.wantClosed {
				t.Errorf("StdinClosed = %v, want %v", c.spec.StdinClosed, tt.wantClosed)
			}
			if relayed := c.stdin != nil; relayed == tt.wantClosed {
				t.Errorf("stdin relayed: %v, want %v", relayed, !tt.wantClosed)
			}
		})
	}
}
