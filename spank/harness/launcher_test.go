package harness

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeLauncherScript stands in for slurm-microvm. Every call records, in a
// subshell (which leaves the script's own fd table untouched):
//   - call.<pid>: ppid, pgrp and sid from /proc/<pid>/stat, every open fd
//     with its target and flags (/proc/<pid>/fdinfo), and the environment;
//   - one line "pid<TAB>uid<TAB>arg1<TAB>arg2..." appended to calls.log.
//
// An argument "fail.img" or "666" makes it fail with exit status 3 after
// writing one line to stdout and one to stderr; "slow.img" makes it hang.
const fakeLauncherScript = `#!/bin/sh
# Fake slurm-microvm written by the spank harness tests.
dir='@DIR@'
(
	read -r pid comm state ppid pgrp sid rest < /proc/$$/stat
	echo "ppid $ppid"
	echo "pgrp $pgrp"
	echo "sid $sid"
	for f in /proc/$$/fd/*; do
		n=${f##*/}
		printf 'fd %s %s %s\n' "$n" "$(readlink "$f")" \
			"$(sed -n 's/^flags:[[:space:]]*//p' /proc/$$/fdinfo/$n)"
	done
	env | sed 's/^/env /'
) > "$dir/call.$$"
line="$$	$(id -u)"
for a in "$@"; do line="$line	$a"; done
printf '%s\n' "$line" >> "$dir/calls.log"
for a in "$@"; do
	case "$a" in
	fail.img|666)
		echo "stdout: refusing $a"
		echo "slurm-microvm: $a: not a disk image" >&2
		exit 3;;
	slow.img)
		exec sleep 30;;
	esac
done
exit 0
`

// fakeLauncher is a fake slurm-microvm in a temporary directory.
type fakeLauncher struct {
	dir    string
	path   string // launcher=
	config string // config=
}

func newFakeLauncher(t *testing.T) *fakeLauncher {
	t.Helper()
	dir := t.TempDir()
	f := &fakeLauncher{
		dir:    dir,
		path:   filepath.Join(dir, "slurm-microvm"),
		config: filepath.Join(dir, "microvm.toml"),
	}
	script := strings.ReplaceAll(fakeLauncherScript, "@DIR@", dir)
	if err := os.WriteFile(f.path, []byte(script), 0o755); err != nil {
		t.Fatalf("write fake launcher: %v", err)
	}
	return f
}

// args are the plugstack.conf arguments pointing at this fake.
func (f *fakeLauncher) args(extra ...string) []string {
	return append([]string{
		"launcher=" + f.path,
		"config=" + f.config,
	}, extra...)
}

// fdInfo is one open fd of a launcher call.
type fdInfo struct {
	fd     int
	target string
	flags  uint64 // octal in fdinfo
}

// launcherCall is one recorded run of the fake launcher.
type launcherCall struct {
	pid, uid        int
	args            []string // without argv[0]
	ppid, pgrp, sid int
	fds             []fdInfo
	env             map[string]string
}

// calls reads every call recorded so far.
func (f *fakeLauncher) calls(t *testing.T) []launcherCall {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(f.dir, "calls.log"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("read calls.log: %v", err)
	}
	var out []launcherCall
	for _, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		fields := strings.Split(line, "\t")
		if len(fields) < 2 {
			t.Fatalf("calls.log: bad line %q", line)
		}
		c := launcherCall{args: fields[2:], env: map[string]string{}}
		c.pid, _ = strconv.Atoi(fields[0])
		c.uid, _ = strconv.Atoi(fields[1])
		f.readInfo(t, &c)
		out = append(out, c)
	}
	return out
}

func (f *fakeLauncher) readInfo(t *testing.T, c *launcherCall) {
	t.Helper()
	fh, err := os.Open(filepath.Join(f.dir, fmt.Sprintf("call.%d", c.pid)))
	if err != nil {
		t.Fatalf("call info of pid %d: %v", c.pid, err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		key, rest, _ := strings.Cut(sc.Text(), " ")
		switch key {
		case "ppid":
			c.ppid, _ = strconv.Atoi(rest)
		case "pgrp":
			c.pgrp, _ = strconv.Atoi(rest)
		case "sid":
			c.sid, _ = strconv.Atoi(rest)
		case "fd":
			parts := strings.Fields(rest)
			if len(parts) < 2 {
				continue // the listing raced with a closed fd
			}
			n, _ := strconv.Atoi(parts[0])
			var flags uint64
			if len(parts) > 2 {
				flags, _ = strconv.ParseUint(parts[len(parts)-1], 8, 64)
			}
			c.fds = append(c.fds, fdInfo{fd: n, target: parts[1], flags: flags})
		case "env":
			k, v, _ := strings.Cut(rest, "=")
			c.env[k] = v
		}
	}
}

// waitCalls waits until at least n calls are recorded (detached starts).
func (f *fakeLauncher) waitCalls(t *testing.T, n int) []launcherCall {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		calls := f.calls(t)
		if len(calls) >= n {
			return calls
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %d launcher calls, have %d: %v", n, len(calls), calls)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// argvs returns the arguments of every call.
func argvs(calls []launcherCall) [][]string {
	if len(calls) == 0 {
		return nil
	}
	out := make([][]string, len(calls))
	for i, c := range calls {
		out[i] = c.args
	}
	return out
}

// oCloexec is O_CLOEXEC as /proc/<pid>/fdinfo prints flags.
const oCloexec = 0o2000000

// inheritedFds lists the fds >= 3 the call inherited from its parent: an
// fd without close-on-exec survived our execve; those with it were opened
// by the shell itself (its script).
func inheritedFds(c launcherCall) []fdInfo {
	var out []fdInfo
	for _, fd := range c.fds {
		if fd.fd > 2 && fd.flags&oCloexec == 0 {
			out = append(out, fd)
		}
	}
	return out
}

// leakFds opens a pipe without close-on-exec in this process for the rest
// of the test, as slurmstepd leaks fds (and holds the step's stdout): a
// launcher call that does not close fds >= 3 inherits it.
func leakFds(t *testing.T) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], 0); err != nil {
		t.Fatalf("pipe: %v", err)
	}
	t.Cleanup(func() {
		unix.Close(p[0])
		unix.Close(p[1])
	})
}

func stdioTargets(c launcherCall) map[int]string {
	out := map[int]string{}
	for _, fd := range c.fds {
		if fd.fd <= 2 {
			out[fd.fd] = fd.target
		}
	}
	return out
}
