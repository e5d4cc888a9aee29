package runtime

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

func TestForState(t *testing.T) {
	cfg := config.Defaults()
	tests := []struct {
		name, record string // record "" writes none
		want, err    string
	}{
		{name: "no record: the configured driver", want: "qemu"},
		{name: "recorded qemu", record: "qemu\n", want: "qemu"},
		{name: "recorded unknown", record: "firecracker\n", err: `runtime "firecracker" is not a runtime driver (known: qemu, kata)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.record != "" {
				if err := Record(dir, strings.TrimSpace(tt.record)); err != nil {
					t.Fatal(err)
				}
			}
			d, err := ForState(&cfg, dir)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || d.Name() != tt.want {
				t.Fatalf("driver %v, %v; want %s", d, err, tt.want)
			}
		})
	}
}

// TestQEMUCleanup: the QEMU driver's Cleanup kills the VMM recorded in the
// state directory (by pid and start time) from another process's view,
// and is idempotent.
func TestQEMUCleanup(t *testing.T) {
	cfg := config.Defaults()
	d, err := New(&cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	if err := state.WriteProc(filepath.Join(dir, state.VMMPidFile), cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := d.Cleanup(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the recorded VMM is still running after Cleanup")
	}
	if err := d.Cleanup(context.Background(), dir); err != nil {
		t.Fatalf("second Cleanup: %v", err)
	}
	if err := d.Cleanup(context.Background(), filepath.Join(dir, "none")); err != nil && !os.IsNotExist(err) {
		t.Fatalf("Cleanup of a state without records: %v", err)
	}
}
