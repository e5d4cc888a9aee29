package guest

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOOMProbeCgroup: the process's cgroup's memory.events decides, for
// any way the process ended (a shell whose child was killed exits 137).
func TestOOMProbeCgroup(t *testing.T) {
	killed := unix.WaitStatus(unix.SIGKILL)
	exited := unix.WaitStatus(137 << 8)
	tests := []struct {
		name   string
		events string
		ws     unix.WaitStatus
		want   bool
	}{
		{"killed by the OOM killer", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n", killed, true},
		{"a child killed, the shell exited", "oom 1\noom_kill 1\n", exited, true},
		{"kill -9, no OOM", "oom 0\noom_kill 0\n", killed, false},
		{"exited, no OOM", "oom_kill 0\n", unix.WaitStatus(0), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "task-1")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "memory.events"), []byte(tt.events), 0o644); err != nil {
				t.Fatal(err)
			}
			p := &oomProbe{dir: dir, vmstat: ^uint64(0)}
			if got := p.killed(tt.ws); got != tt.want {
				t.Errorf("killed = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCounter(t *testing.T) {
	b := []byte("nr_free_pages 100\noom_kill 7\npgfault 9\n")
	if n, ok := counter(b, "oom_kill"); !ok || n != 7 {
		t.Errorf("oom_kill = %d, %v; want 7", n, ok)
	}
	if _, ok := counter(b, "oom"); ok {
		t.Error("found oom, which is not a line of its own")
	}
}
