package launcher

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
)

// TestExitLike re-runs this test binary, which ends itself through ExitLike,
// and checks that it died the way the guest process did.
func TestExitLike(t *testing.T) {
	if v := os.Getenv("EXITLIKE_SIGNAL"); v != "" {
		n, _ := strconv.Atoi(v)
		code, _ := strconv.Atoi(os.Getenv("EXITLIKE_CODE"))
		ExitLike(driver.ExitStatus{Code: code, Signal: syscall.Signal(n)})
		os.Exit(99)
	}
	tests := []struct {
		sig      syscall.Signal
		code     int
		wantSig  syscall.Signal
		wantCode int
	}{
		{0, 0, 0, 0},
		{0, 7, 0, 7},
		{syscall.SIGTERM, 143, syscall.SIGTERM, -1},
		{syscall.SIGKILL, 137, syscall.SIGKILL, -1},
		{syscall.SIGSEGV, 139, syscall.SIGSEGV, -1}, // Go would dump a crash
		{syscall.SIGABRT, 134, syscall.SIGABRT, -1},
		{syscall.SIGBUS, 135, syscall.SIGBUS, -1},
		{syscall.SIGQUIT, 131, syscall.SIGQUIT, -1},
		{syscall.SIGUSR1, 138, syscall.SIGUSR1, -1}, // Go would ignore it
		{syscall.SIGINT, 130, syscall.SIGINT, -1},
		{syscall.SIGWINCH, 156, 0, 156}, // default: ignore, so 128+S
	}
	for _, tt := range tests {
		cmd := exec.Command(os.Args[0], "-test.run=^TestExitLike$")
		cmd.Env = append(os.Environ(), "EXITLIKE_SIGNAL="+strconv.Itoa(int(tt.sig)), "EXITLIKE_CODE="+strconv.Itoa(tt.code))
		_ = cmd.Run()
		ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
		if tt.wantSig != 0 {
			if !ws.Signaled() || ws.Signal() != tt.wantSig {
				t.Errorf("signal %v: ended %v, want killed by %v", tt.sig, ws, tt.wantSig)
			}
			continue
		}
		if ws.Signaled() || ws.ExitStatus() != tt.wantCode {
			t.Errorf("signal %v code %d: ended %v, want exit %d", tt.sig, tt.code, ws, tt.wantCode)
		}
	}
}
