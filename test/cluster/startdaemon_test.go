package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStartDaemonClosesInheritedFds: up.sh's start_daemon starts a daemon
// with only stdio open, whatever fds its caller held (here fd 3 passed in
// and fd 9 opened by the script, as `flock 9` callers do): a lock fd a
// daemon kept would block every later locker for the daemon's life.
func TestStartDaemonClosesInheritedFds(t *testing.T) {
	fn := regexp.MustCompile(`(?ms)^start_daemon\(\) \{\n.*?^\}\n`).Find(upScript)
	if fn == nil {
		t.Fatal("up.sh: no start_daemon function")
	}
	state := t.TempDir()
	if err := os.Mkdir(filepath.Join(state, "log"), 0o755); err != nil {
		t.Fatal(err)
	}
	held, err := os.Create(filepath.Join(state, "held"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	script := "set -euo pipefail\nSTATE=" + state + "\ndie() { echo \"$*\" >&2; exit 1; }\n" + string(fn) +
		"exec 9>\"$STATE/held9\"\nstart_daemon sleep sleep 30\n"
	cmd := exec.Command("bash", "-c", script)
	cmd.ExtraFiles = []*os.File{held}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("start_daemon: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(state, "pids"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) < 2 || f[0] != "sleep" {
		t.Fatalf("pids: %q", b)
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	// The subshell closes the fds and then execs: wait for the exec.
	deadline := time.Now().Add(5 * time.Second)
	for {
		exe, _ := os.Readlink("/proc/" + f[1] + "/exe")
		if strings.HasSuffix(exe, "/sleep") || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	ents, err := os.ReadDir("/proc/" + f[1] + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	var extra []string
	for _, e := range ents {
		if n, _ := strconv.Atoi(e.Name()); n > 2 {
			target, _ := os.Readlink("/proc/" + f[1] + "/fd/" + e.Name())
			extra = append(extra, e.Name()+" -> "+target)
		}
	}
	if len(extra) > 0 {
		t.Errorf("daemon %d holds fds of its caller: %v", pid, extra)
	}
}
