package control

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// TestServeFirstClient: OnFirstClient runs once, at the first accepted
// client, however many follow (the supervisor's first_exec time).
func TestServeFirstClient(t *testing.T) {
	dir := t.TempDir()
	var calls atomic.Int32
	first := make(chan struct{})
	e := Endpoint{StateDir: dir, UID: uint32(os.Getuid()), GID: uint32(os.Getgid()),
		OnFirstClient: func() { calls.Add(1); close(first) }}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- e.Serve(ctx, make(chan struct{}), func(l net.Listener) error {
			for {
				c, err := l.Accept()
				if err != nil {
					return err
				}
				c.Close()
			}
		})
	}()
	sock := filepath.Join(dir, state.ControlSocket)
	for i := 0; i < 3; i++ {
		var c net.Conn
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if c, err = net.Dial("unix", sock); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if i == 0 {
			select {
			case <-first:
			case <-time.After(5 * time.Second):
				t.Fatal("OnFirstClient was not called after the first client")
			}
		}
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("OnFirstClient called %d times, want 1", n)
	}
}
