package kata

import (
	"strings"
	"testing"
)

func TestSandboxID(t *testing.T) {
	long := strings.Repeat("n", 64)
	tests := []struct {
		step string
		want string // "" : a digest form
	}{
		{"7.0.0.vm", "smv-7.0.0.vm"},
		{"123.4294967294.0.node-01", "smv-123.4294967294.0.node-01"},
		{"7.0.0." + long, ""},
		{"7.0.0.node-", ""},
		{"7.0.0.a..b", ""},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		got := sandboxID(tt.step)
		if len(got) > 76 || !containerdID.MatchString(got) {
			t.Errorf("sandboxID(%q) = %q: not a containerd identifier", tt.step, got)
		}
		if tt.want != "" && got != tt.want {
			t.Errorf("sandboxID(%q) = %q, want %q", tt.step, got, tt.want)
		}
		if seen[got] {
			t.Errorf("sandboxID(%q) = %q twice", tt.step, got)
		}
		seen[got] = true
	}
}

func TestWaitResponse(t *testing.T) {
	tests := []struct {
		status    uint32
		code, sig int32
	}{{0, 0, 0}, {3, 3, 0}, {128, 128, 0}, {137, -1, 9}, {143, -1, 15}, {255, 255, 0}}
	for _, tt := range tests {
		r := waitResponse(tt.status)
		if r.ExitCode != tt.code || int32(r.Signal) != tt.sig {
			t.Errorf("waitResponse(%d) = exit %d signal %d, want %d %d", tt.status, r.ExitCode, r.Signal, tt.code, tt.sig)
		}
	}
}
