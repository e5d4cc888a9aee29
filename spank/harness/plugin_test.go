package harness

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// The plugin and the fake host keep C globals: no test here runs parallel.

// wantOptions are the options the plugin registers, "=" marks an argument.
var wantOptions = []string{"microvm=", "microvm-debug", "microvm-mounts=", "microvm-workdir=", "microvm-mpi=", "microvm-network="}

// option is one --name[=value] as Slurm replays it to the plugin.
type option struct{ name, value string }

// logHas reports whether some log line contains every one of parts.
func logHas(log []string, parts ...string) bool {
	for _, line := range log {
		ok := true
		for _, p := range parts {
			if !strings.Contains(line, p) {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// everyLinePrefixed checks the "microvm: " prefix of all plugin messages.
func everyLinePrefixed(t *testing.T, log []string) {
	t.Helper()
	for _, line := range log {
		_, msg, _ := strings.Cut(line, ": ")
		if !strings.HasPrefix(msg, "microvm: ") {
			t.Errorf("log line without the microvm: prefix: %q", line)
		}
	}
}

// captureStderr runs fn with fd 2 redirected to a file and returns what
// was written there (the launcher's stderr passes through in srun).
func captureStderr(t *testing.T, fn func()) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved, err := unix.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Dup2(int(f.Fd()), 2); err != nil {
		t.Fatal(err)
	}
	fn()
	if err := unix.Dup2(saved, 2); err != nil {
		t.Fatal(err)
	}
	unix.Close(saved)
	data, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestOptionsRegisteredInEveryStepContext(t *testing.T) {
	for _, ctx := range []Context{CtxLocal, CtxAllocator, CtxRemote} {
		h := NewHost(Job{Context: ctx})
		if rc := h.Call(HookInit, -1); rc != 0 {
			t.Fatalf("context %d: init = %d, log %q", ctx, rc, h.Log())
		}
		if got := h.Options(); !reflect.DeepEqual(got, wantOptions) {
			t.Errorf("context %d: options %q, want %q", ctx, got, wantOptions)
		}
	}
	h := NewHost(Job{Context: CtxSlurmd})
	if rc := h.Call(HookInit, -1); rc != 0 || len(h.Options()) != 0 {
		t.Errorf("slurmd: init = %d, options %q; want 0 and none", rc, h.Options())
	}
}

func TestPlugstackArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		ctx     Context
		wantRC  int
		wantLog []string // parts of one error line
	}{
		{name: "defaults", args: nil, ctx: CtxLocal},
		{name: "all known", ctx: CtxRemote, args: []string{"launcher=/opt/mv/bin/slurm-microvm", "exec=/opt/mv/bin/x", "config=/etc/mv.toml", "timeout=20"}},
		{name: "unknown", ctx: CtxLocal, args: []string{"launcher=/a", "foo=bar"}, wantRC: -1, wantLog: []string{"error: microvm: plugstack.conf: unknown argument", `"foo=bar"`}},
		{name: "no equals", ctx: CtxRemote, args: []string{"debug"}, wantRC: -1, wantLog: []string{"unknown argument", `"debug"`}},
		{name: "relative launcher", ctx: CtxRemote, args: []string{"launcher=bin/slurm-microvm"}, wantRC: -1, wantLog: []string{"launcher=bin/slurm-microvm must be an absolute path"}},
		{name: "empty config", ctx: CtxAllocator, args: []string{"config="}, wantRC: -1, wantLog: []string{"config= needs a value"}},
		{name: "twice", ctx: CtxLocal, args: []string{"config=/a", "config=/b"}, wantRC: -1, wantLog: []string{"config= is given twice"}},
		{name: "timeout zero", ctx: CtxLocal, args: []string{"timeout=0"}, wantRC: -1, wantLog: []string{"timeout=0 must be a whole number of seconds from 1 to 86400"}},
		{name: "timeout junk", ctx: CtxLocal, args: []string{"timeout=5s"}, wantRC: -1, wantLog: []string{"timeout=5s must be"}},
		{name: "bad args fail slurmd early", ctx: CtxSlurmd, args: []string{"lancher=/x"}, wantRC: -1, wantLog: []string{`"lancher=/x"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHost(Job{Context: tt.ctx}, tt.args...)
			rc := h.Call(HookInit, -1)
			if rc != tt.wantRC {
				t.Fatalf("init = %d, want %d; log %q", rc, tt.wantRC, h.Log())
			}
			if tt.wantLog != nil && !logHas(h.Log(), tt.wantLog...) {
				t.Errorf("log %q lacks %q", h.Log(), tt.wantLog)
			}
			everyLinePrefixed(t, h.Log())
		})
	}
}

func TestOptionCallbacks(t *testing.T) {
	h := NewHost(Job{Context: CtxLocal})
	if rc := h.Call(HookInit, -1); rc != 0 {
		t.Fatalf("init = %d", rc)
	}
	for _, name := range []string{"microvm", "microvm-mounts", "microvm-workdir", "microvm-mpi"} {
		if rc := h.Option(name, "", false); rc == 0 {
			t.Errorf("--%s= accepted an empty value", name)
		}
	}
	if !logHas(h.Log(), "error: microvm: --microvm: the value must not be empty (use --microvm=IMAGE)") {
		t.Errorf("log %q lacks the empty --microvm message", h.Log())
	}
	if rc := h.Option("microvm", strings.Repeat("x", 5000), false); rc == 0 {
		t.Error("--microvm accepted a 5000-byte value")
	}
	if rc := h.Option("microvm-debug", "", false); rc != 0 {
		t.Errorf("--microvm-debug = %d", rc)
	}
	if rc := h.Option("no-such-option", "x", false); rc != -1000 {
		t.Errorf("unregistered option reached a callback: %d", rc)
	}
}

func TestLocalValidate(t *testing.T) {
	tests := []struct {
		name       string
		ctx        Context
		opts       []option
		extraArgs  []string
		noLauncher bool
		wantRC     int
		wantArgs   [][]string // after "--config CFG validate"
		wantStderr []string
		wantLog    []string
	}{
		{
			name:     "srun image",
			ctx:      CtxLocal,
			opts:     []option{{"microvm", "/images/a.img"}},
			wantArgs: [][]string{{"--image", "/images/a.img"}},
		},
		{
			name: "srun every option",
			ctx:  CtxLocal,
			opts: []option{
				{"microvm", "a.img"}, {"microvm-debug", ""}, {"microvm-mounts", "/data:/data:ro,/scratch:/s"},
				{"microvm-workdir", "/work dir"}, {"microvm-mpi", "pmix"},
			},
			wantArgs: [][]string{{"--image", "a.img", "--debug", "--mounts", "/data:/data:ro,/scratch:/s", "--workdir", "/work dir", "--mpi", "pmix"}},
		},
		{
			name:     "sbatch image",
			ctx:      CtxAllocator,
			opts:     []option{{"microvm", "docker://ubuntu:24.04"}},
			wantArgs: [][]string{{"--image", "docker://ubuntu:24.04"}},
		},
		{
			name: "no --microvm",
			ctx:  CtxLocal,
		},
		{
			name:       "refused image",
			ctx:        CtxLocal,
			opts:       []option{{"microvm", "fail.img"}},
			wantRC:     -1,
			wantArgs:   [][]string{{"--image", "fail.img"}},
			wantStderr: []string{"slurm-microvm: fail.img: not a disk image", "stdout: refusing fail.img"},
			wantLog:    []string{"error: microvm: validate:", "exited with status 3"},
		},
		{
			name:       "no launcher",
			ctx:        CtxAllocator,
			opts:       []option{{"microvm", "a.img"}},
			noLauncher: true,
			wantRC:     -1,
			wantLog:    []string{"error: microvm: validate: cannot execute", "No such file or directory"},
		},
		{
			name:      "hung launcher",
			ctx:       CtxLocal,
			opts:      []option{{"microvm", "slow.img"}},
			extraArgs: []string{"timeout=1"},
			wantRC:    -1,
			wantArgs:  [][]string{{"--image", "slow.img"}},
			wantLog:   []string{"error: microvm: validate:", "gave no answer in 1 s: killed"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("MICROVM_TEST_MARKER", "from-the-user")
			leakFds(t)
			f := newFakeLauncher(t)
			args := f.args(tt.extraArgs...)
			if tt.noLauncher {
				args[0] = "launcher=" + filepath.Join(f.dir, "missing", "slurm-microvm")
			}
			h := NewHost(Job{Context: tt.ctx}, args...)
			if rc := h.Call(HookInit, -1); rc != 0 {
				t.Fatalf("init = %d, log %q", rc, h.Log())
			}
			// Slurm may run option callbacks twice with the same value.
			for round := 0; round < 2; round++ {
				for _, o := range tt.opts {
					if rc := h.Option(o.name, o.value, false); rc != 0 {
						t.Fatalf("--%s=%s = %d", o.name, o.value, rc)
					}
				}
			}
			var rc int
			start := time.Now()
			stderr := captureStderr(t, func() { rc = h.Call(HookInitPostOpt, -1) })
			elapsed := time.Since(start)
			if rc != tt.wantRC {
				t.Fatalf("init_post_opt = %d, want %d; log %q; stderr %q", rc, tt.wantRC, h.Log(), stderr)
			}
			calls := f.calls(t)
			var want [][]string
			for _, a := range tt.wantArgs {
				want = append(want, append([]string{"--config", f.config, "validate"}, a...))
			}
			if got := argvs(calls); !reflect.DeepEqual(got, want) {
				t.Errorf("launcher calls\n got %q\nwant %q", got, want)
			}
			for _, c := range calls {
				if c.uid != os.Getuid() {
					t.Errorf("validate ran as uid %d, want the caller's %d", c.uid, os.Getuid())
				}
				if c.env["MICROVM_TEST_MARKER"] != "from-the-user" {
					t.Errorf("validate did not get the user's environment: %v", c.env)
				}
				if got := inheritedFds(c); len(got) > 0 {
					t.Errorf("validate inherited fds %v", got)
				}
				if std := stdioTargets(c); std[0] != "/dev/null" || std[1] != std[2] {
					t.Errorf("validate stdio %v: want stdin /dev/null, stdout joined to stderr", std)
				}
			}
			for _, s := range tt.wantStderr {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr %q lacks %q (launcher stderr must pass through)", stderr, s)
				}
			}
			if tt.wantLog != nil && !logHas(h.Log(), tt.wantLog...) {
				t.Errorf("log %q lacks %q", h.Log(), tt.wantLog)
			}
			if tt.wantRC != 0 && !logHas(h.Log(), "error: microvm: --microvm=", "refused by", "validate") {
				t.Errorf("log %q lacks the refusal naming the image", h.Log())
			}
			if tt.name == "hung launcher" && elapsed > 5*time.Second {
				t.Errorf("timeout=1 took %v", elapsed)
			}
			everyLinePrefixed(t, h.Log())
			t.Logf("init_post_opt: %v", elapsed)
		})
	}
}

// remoteJob is a typical step of job 42 with two tasks on this node.
func remoteJob() Job {
	return Job{
		Context:    CtxRemote,
		JobID:      U32(42),
		StepID:     U32(3),
		Restart:    U32(1),
		UID:        U32(uint32(os.Getuid())),
		GID:        U32(uint32(os.Getgid())),
		Groups:     []uint32{10, 20},
		Cores:      Str("0-3"),
		MemMB:      U64(2048),
		LocalTasks: U32(2),
		Argv:       []string{"/bin/hostname", "-s"},
		Env:        map[string]string{"SLURM_STEP_GPUS": "1,3"},
	}
}

// userName is the login name of the test's uid (what getpwuid_r says).
func userName(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/etc/passwd")
	if err != nil {
		prereq.Missing(t, "no /etc/passwd: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) > 2 && f[2] == strconv.Itoa(os.Getuid()) {
			return f[0]
		}
	}
	prereq.Missing(t, "uid %d not in /etc/passwd", os.Getuid())
	return ""
}

func TestRemoteStep(t *testing.T) {
	user := userName(t)
	uid, gid := strconv.Itoa(os.Getuid()), strconv.Itoa(os.Getgid())
	tests := []struct {
		name     string
		job      func() Job
		opts     []option
		exitSeq  []int // local task ids in task_exit order
		prepare  []string
		stepArgs []string // --job J --step S --restart R [--node N]
		state    string   // SLURM_MICROVM_STEP
		node     string   // slurmstepd's SLURMD_NODENAME ("": unset)
	}{
		{
			name: "every option",
			job: func() Job {
				j := remoteJob()
				j.Env["SLURM_STEP_NODELIST"] = "n[7-8]"
				j.NNodes, j.NodeID = U32(2), U32(0)
				return j
			},
			opts: []option{
				{"microvm", "/images/a.img"}, {"microvm-debug", ""}, {"microvm-mounts", "/data:/data:ro"},
				{"microvm-workdir", "/work"}, {"microvm-mpi", "pmix"}, {"microvm-network", "step"},
			},
			exitSeq: []int{1, 0},
			prepare: []string{"prepare", "--job", "42", "--step", "3", "--restart", "1", "--node", "n7",
				"--uid", uid, "--gid", gid, "--groups", "10,20", "--user", user,
				"--image", "/images/a.img", "--cores", "0-3", "--mem-mb", "2048",
				"--gpus", "1,3", "--tasks", "2", "--nodes", "n[7-8]", "--nnodes", "2", "--node-index", "0",
				"--debug", "--mounts", "/data:/data:ro", "--workdir", "/work", "--mpi", "pmix", "--network", "step"},
			stepArgs: []string{"--job", "42", "--step", "3", "--restart", "1", "--node", "n7"},
			state:    "42.3.1.n7",
			node:     "n7",
		},
		{
			name: "options from the step's environment (SLURM_MICROVM_*)",
			job: func() Job {
				j := remoteJob()
				j.Env["SLURM_MICROVM_IMAGE"] = "/images/env.img"
				j.Env["SLURM_MICROVM_MOUNTS"] = "/data:/in"
				j.Env["SLURM_MICROVM_WORKDIR"] = "/w"
				j.Env["SLURM_MICROVM_MPI"] = "off"
				j.Env["SLURM_MICROVM_NETWORK"] = "none"
				j.Env["SLURM_MICROVM_DEBUG"] = "yes"
				return j
			},
			exitSeq: []int{0, 1},
			prepare: []string{"prepare", "--job", "42", "--step", "3", "--restart", "1",
				"--uid", uid, "--gid", gid, "--groups", "10,20", "--user", user,
				"--image", "/images/env.img", "--cores", "0-3", "--mem-mb", "2048",
				"--gpus", "1,3", "--tasks", "2",
				"--debug", "--workdir", "/w", "--mpi", "off", "--network", "none", "--mounts-env", "/data:/in"},
			stepArgs: []string{"--job", "42", "--step", "3", "--restart", "1"},
			state:    "42.3.1",
		},
		{
			name: "the command line wins over the environment; empty is unset",
			job: func() Job {
				j := remoteJob()
				j.Env["SLURM_MICROVM_IMAGE"] = "/images/env.img"
				j.Env["SLURM_MICROVM_MOUNTS"] = "/data:/in"
				j.Env["SLURM_MICROVM_WORKDIR"] = ""
				j.Env["SLURM_MICROVM_DEBUG"] = "0"
				return j
			},
			opts:    []option{{"microvm", "/images/cli.img"}, {"microvm-mounts", "/cli"}},
			exitSeq: []int{0, 1},
			prepare: []string{"prepare", "--job", "42", "--step", "3", "--restart", "1",
				"--uid", uid, "--gid", gid, "--groups", "10,20", "--user", user,
				"--image", "/images/cli.img", "--cores", "0-3", "--mem-mb", "2048",
				"--gpus", "1,3", "--tasks", "2", "--mounts", "/cli"},
			stepArgs: []string{"--job", "42", "--step", "3", "--restart", "1"},
			state:    "42.3.1",
		},
		{
			name: "bare step, unknown restart count",
			job: func() Job {
				j := remoteJob()
				j.Restart, j.Groups, j.Cores, j.MemMB = nil, nil, nil, nil
				j.StepID = U32(0)
				j.LocalTasks = U32(3)
				j.Env = nil
				return j
			},
			opts:    []option{{"microvm", "b.img"}},
			exitSeq: []int{2, 0, 0, 1}, // task 0 reported twice: counted once
			prepare: []string{"prepare", "--job", "42", "--step", "0", "--restart", "0",
				"--uid", uid, "--gid", gid, "--groups", "", "--user", user,
				"--image", "b.img", "--cores", "", "--mem-mb", "0",
				"--gpus", "", "--tasks", "3"},
			stepArgs: []string{"--job", "42", "--step", "0", "--restart", "0"},
			state:    "42.0.0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("MICROVM_TEST_MARKER", "slurmstepd-env")
			t.Setenv("SLURMD_NODENAME", tt.node)
			t.Setenv("SLURM_CONF", "")
			leakFds(t)
			f := newFakeLauncher(t)
			job := tt.job()
			h := NewHost(job, f.args()...)
			prefix := []string{"--config", f.config}
			with := func(args ...string) []string { return append(slices.Clone(prefix), args...) }

			if rc := h.Call(HookInit, -1); rc != 0 {
				t.Fatalf("init = %d, log %q", rc, h.Log())
			}
			for round := 0; round < 2; round++ {
				for _, o := range tt.opts {
					if rc := h.Option(o.name, o.value, true); rc != 0 {
						t.Fatalf("--%s = %d", o.name, rc)
					}
				}
			}
			start := time.Now()
			if rc := h.Call(HookInitPostOpt, -1); rc != 0 {
				t.Fatalf("init_post_opt = %d, log %q", rc, h.Log())
			}
			prepareTime := time.Since(start)
			calls := f.calls(t)
			if got, want := argvs(calls), [][]string{with(tt.prepare...)}; !reflect.DeepEqual(got, want) {
				t.Fatalf("after init_post_opt\n got %q\nwant %q", got, want)
			}
			prep := calls[0]
			if prep.uid != os.Getuid() {
				t.Errorf("prepare ran as uid %d, want slurmstepd's %d", prep.uid, os.Getuid())
			}
			if _, leaked := prep.env["MICROVM_TEST_MARKER"]; leaked || prep.env["PATH"] == "" {
				t.Errorf("prepare env %v: want a clean env with PATH only", prep.env)
			}
			if got := inheritedFds(prep); len(got) > 0 {
				t.Errorf("prepare inherited fds %v", got)
			}

			// All tasks are forked, then post_fork runs for each of them.
			ntasks := len(tt.exitSeq)
			if job.LocalTasks != nil {
				ntasks = int(*job.LocalTasks)
			}
			start = time.Now()
			for task := 0; task < ntasks; task++ {
				if rc := h.Call(HookTaskPostFork, task); rc != 0 {
					t.Fatalf("task_post_fork(%d) = %d, log %q", task, rc, h.Log())
				}
			}
			postForkTime := time.Since(start)
			calls = f.waitCalls(t, 2)
			if got, want := argvs(calls), [][]string{with(tt.prepare...), with(append([]string{"start"}, tt.stepArgs...)...)}; !reflect.DeepEqual(got, want) {
				t.Fatalf("after task_post_fork\n got %q\nwant %q", got, want)
			}

			// Each task (a forked process in Slurm) swaps its own argv.
			for task := 0; task < ntasks; task++ {
				h.SetArgv(job.Argv)
				if rc := h.Call(HookTaskInit, task); rc != 0 {
					t.Fatalf("task_init(%d) = %d, log %q", task, rc, h.Log())
				}
				want := append([]string{f.path + "-exec"}, job.Argv[1:]...)
				if got := h.Argv(); !reflect.DeepEqual(got, want) {
					t.Errorf("task %d argv %q, want %q", task, got, want)
				}
				if v, _ := h.Getenv("SLURM_MICROVM_ARGV0"); v != job.Argv[0] {
					t.Errorf("SLURM_MICROVM_ARGV0 = %q, want %q", v, job.Argv[0])
				}
				if v, _ := h.Getenv("SLURM_MICROVM_STEP"); v != tt.state {
					t.Errorf("SLURM_MICROVM_STEP = %q, want %q", v, tt.state)
				}
				if v, _ := h.Getenv("SLURM_MICROVM_CONFIG"); v != f.config {
					t.Errorf("SLURM_MICROVM_CONFIG = %q, want %q", v, f.config)
				}
			}

			// stop exactly once, right after the last distinct task.
			stop := with(append([]string{"stop"}, tt.stepArgs...)...)
			seen := map[int]bool{}
			for i, task := range tt.exitSeq {
				if rc := h.Call(HookTaskExit, task); rc != 0 {
					t.Fatalf("task_exit(%d) = %d, log %q", task, rc, h.Log())
				}
				seen[task] = true
				stops := 0
				for _, c := range f.calls(t) {
					if reflect.DeepEqual(c.args, stop) {
						stops++
					}
				}
				wantStops := 0
				if len(seen) == ntasks {
					wantStops = 1
				}
				if stops != wantStops {
					t.Fatalf("after task_exit #%d (task %d): %d stop calls, want %d", i, task, stops, wantStops)
				}
			}
			if rc := h.Call(HookExit, -1); rc != 0 {
				t.Fatalf("exit = %d, log %q", rc, h.Log())
			}
			want := [][]string{with(tt.prepare...), with(append([]string{"start"}, tt.stepArgs...)...), stop, stop}
			if got := argvs(f.calls(t)); !reflect.DeepEqual(got, want) {
				t.Errorf("whole step\n got %q\nwant %q", got, want)
			}
			everyLinePrefixed(t, h.Log())
			t.Logf("prepare (sh fake) %v, task_post_fork x%d %v", prepareTime, ntasks, postForkTime)
		})
	}
}

func TestDetachedStart(t *testing.T) {
	t.Setenv("MICROVM_TEST_MARKER", "slurmstepd-env")
	leakFds(t)
	f := newFakeLauncher(t)
	h := NewHost(remoteJob(), f.args()...)
	h.Call(HookInit, -1)
	h.Option("microvm", "a.img", true)
	if rc := h.Call(HookInitPostOpt, -1); rc != 0 {
		t.Fatalf("init_post_opt = %d, log %q", rc, h.Log())
	}
	start := time.Now()
	if rc := h.Call(HookTaskPostFork, 0); rc != 0 {
		t.Fatalf("task_post_fork = %d, log %q", rc, h.Log())
	}
	returned := time.Since(start)

	// The intermediate child is reaped before task_post_fork returns.
	if z := zombieChildren(t); len(z) > 0 {
		t.Errorf("zombie children left: %v", z)
	}
	calls := f.waitCalls(t, 2)
	c := calls[1]
	if c.args[2] != "start" {
		t.Fatalf("second call %q is not start", c.args)
	}
	ourSid, err := unix.Getsid(0)
	if err != nil {
		t.Fatal(err)
	}
	if c.sid == ourSid {
		t.Errorf("start runs in the caller's session %d", ourSid)
	}
	if c.sid == c.pid {
		t.Errorf("start is a session leader (sid %d): it could acquire a tty", c.sid)
	}
	if c.pgrp != c.sid {
		t.Errorf("start pgrp %d, want its session %d", c.pgrp, c.sid)
	}
	if c.ppid == os.Getpid() {
		t.Errorf("start is still our child (ppid %d)", c.ppid)
	}
	for fd := 0; fd <= 2; fd++ {
		if got := stdioTargets(c)[fd]; got != "/dev/null" {
			t.Errorf("start fd %d -> %q, want /dev/null", fd, got)
		}
	}
	if got := inheritedFds(c); len(got) > 0 {
		t.Errorf("start inherited fds %v (the step's stdout must not stay open)", got)
	}
	if _, leaked := c.env["MICROVM_TEST_MARKER"]; leaked {
		t.Errorf("start env %v leaks slurmstepd's environment", c.env)
	}
	t.Logf("task_post_fork returned after %v; fds of start: %v", returned, c.fds)
}

func TestDetachedStartExecFailure(t *testing.T) {
	f := newFakeLauncher(t)
	h := NewHost(remoteJob(), f.args()...)
	h.Call(HookInit, -1)
	h.Option("microvm", "a.img", true)
	if rc := h.Call(HookInitPostOpt, -1); rc != 0 {
		t.Fatalf("init_post_opt = %d", rc)
	}
	// The launcher loses its x bits between prepare and start: execve in
	// the detached grandchild fails, and only the status pipe can tell.
	if err := os.Chmod(f.path, 0o644); err != nil {
		t.Fatal(err)
	}
	if rc := h.Call(HookTaskPostFork, 0); rc != -1 {
		t.Fatalf("task_post_fork = %d, want -1", rc)
	}
	if !logHas(h.Log(), "error: microvm: start: cannot execute "+f.path+": Permission denied") {
		t.Errorf("log %q lacks the execve error", h.Log())
	}
	if !logHas(h.Log(), "error: microvm: step 42.3: cannot start the sandbox supervisor") {
		t.Errorf("log %q lacks the step error", h.Log())
	}
	if z := zombieChildren(t); len(z) > 0 {
		t.Errorf("zombie children left: %v", z)
	}
}

// zombieChildren lists the pids of our children that are zombies.
func zombieChildren(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		prereq.Missing(t, "no /proc: %v", err)
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(data)
		rest := s[strings.LastIndexByte(s, ')')+2:]
		f := strings.Fields(rest)
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(os.Getpid()) {
			out = append(out, pid)
		}
	}
	return out
}

func TestHostStepsUntouched(t *testing.T) {
	tests := []struct {
		name string
		step uint32
	}{
		{"batch", StepBatch},
		{"extern", StepExtern},
		{"interactive", StepInteractive},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeLauncher(t)
			job := remoteJob()
			job.StepID = U32(tt.step)
			h := NewHost(job, f.args()...)
			h.Call(HookInit, -1)
			h.Option("microvm", "a.img", true)
			h.Option("microvm", "a.img", true)
			for _, step := range []struct {
				hook Hook
				task int
			}{
				{HookInitPostOpt, -1}, {HookTaskPostFork, 0}, {HookTaskPostFork, 1},
				{HookTaskInit, 0}, {HookTaskExit, 0}, {HookTaskExit, 1}, {HookExit, -1},
			} {
				if rc := h.Call(step.hook, step.task); rc != 0 {
					t.Fatalf("hook %d task %d = %d, log %q", step.hook, step.task, rc, h.Log())
				}
			}
			if got := h.Argv(); !reflect.DeepEqual(got, job.Argv) {
				t.Errorf("argv %q changed, want %q", got, job.Argv)
			}
			for _, k := range []string{"SLURM_MICROVM_ARGV0", "SLURM_MICROVM_STEP", "SLURM_MICROVM_CONFIG"} {
				if v, ok := h.Getenv(k); ok {
					t.Errorf("%s=%q set in a %s step", k, v, tt.name)
				}
			}
			time.Sleep(50 * time.Millisecond) // a stray detached start would show by now
			if calls := f.calls(t); len(calls) > 0 {
				t.Errorf("launcher called for the %s step: %q", tt.name, argvs(calls))
			}
		})
	}
}

func TestRemoteStepWithoutMicrovm(t *testing.T) {
	f := newFakeLauncher(t)
	job := remoteJob()
	h := NewHost(job, f.args()...)
	for _, step := range []struct {
		hook Hook
		task int
	}{
		{HookInit, -1}, {HookInitPostOpt, -1}, {HookTaskPostFork, 0}, {HookTaskInit, 0},
		{HookTaskExit, 0}, {HookTaskExit, 1}, {HookExit, -1},
	} {
		if rc := h.Call(step.hook, step.task); rc != 0 {
			t.Fatalf("hook %d = %d", step.hook, rc)
		}
	}
	if got := h.Argv(); !reflect.DeepEqual(got, job.Argv) {
		t.Errorf("argv %q changed", got)
	}
	time.Sleep(50 * time.Millisecond)
	if calls := f.calls(t); len(calls) > 0 {
		t.Errorf("launcher called without --microvm: %q", argvs(calls))
	}
	if len(h.Log()) > 0 {
		t.Errorf("plugin logged for a step without --microvm: %q", h.Log())
	}
}

func TestPrepareFailure(t *testing.T) {
	tests := []struct {
		name       string
		image      string
		uid        uint32
		wantCalls  []string // subcommands
		wantReason string   // in task_init's refusal
		wantLog    [][]string
	}{
		{
			name:       "launcher refuses",
			image:      "fail.img",
			uid:        uint32(os.Getuid()),
			wantCalls:  []string{"prepare", "stop", "stop"},
			wantReason: "cannot prepare the microVM for --microvm=fail.img: slurm-microvm: fail.img: not a disk image",
			wantLog: [][]string{
				{"error: microvm: prepare: slurm-microvm: fail.img: not a disk image"},
				{"error: microvm: prepare: stdout: refusing fail.img"},
				{"error: microvm: prepare:", "exited with status 3"},
			},
		},
		{
			name:       "unknown user",
			image:      "a.img",
			uid:        4000000,
			wantReason: "no user name for the job's uid 4000000",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeLauncher(t)
			job := remoteJob()
			job.UID = U32(tt.uid)
			h := NewHost(job, f.args()...)
			h.Call(HookInit, -1)
			h.Option("microvm", tt.image, true)
			// slurmstepd would only tell srun "Plugin initialization
			// failed" (and srun exits 0): the step goes on and every
			// task is refused with the reason, on the user's stderr.
			if rc := h.Call(HookInitPostOpt, -1); rc != 0 {
				t.Fatalf("init_post_opt = %d, want 0", rc)
			}
			for task := 0; task < 2; task++ {
				if rc := h.Call(HookTaskPostFork, task); rc != 0 {
					t.Errorf("task_post_fork = %d", rc)
				}
			}
			for task := 0; task < 2; task++ {
				h.SetArgv(job.Argv)
				if rc := h.Call(HookTaskInit, task); rc != -1 {
					t.Errorf("task_init = %d, want -1 (the task must not run on the host)", rc)
				}
				if got := h.Argv(); !reflect.DeepEqual(got, job.Argv) {
					t.Errorf("refused task's argv changed to %q", got)
				}
			}
			h.Call(HookTaskExit, 0)
			h.Call(HookTaskExit, 1)
			h.Call(HookExit, -1)
			log := h.Log()
			if !logHas(log, "error: microvm: step 42.3: task refused: "+tt.wantReason) {
				t.Errorf("log %q lacks the refusal %q", log, tt.wantReason)
			}
			for _, want := range tt.wantLog {
				if !logHas(log, want...) {
					t.Errorf("log %q lacks %q", log, want)
				}
			}
			var subs []string
			for _, c := range f.calls(t) {
				subs = append(subs, c.args[2])
			}
			if !slices.Equal(subs, tt.wantCalls) {
				t.Errorf("launcher calls %q, want %q (no start; stop after a failed prepare)", subs, tt.wantCalls)
			}
			everyLinePrefixed(t, log)
		})
	}
}

func TestValuesAreCopied(t *testing.T) {
	// Option frees its C string right after the callback: the prepare
	// argv must still carry the values; a second, different value is
	// refused and changes nothing.
	f := newFakeLauncher(t)
	h := NewHost(remoteJob(), f.args()...)
	h.Call(HookInit, -1)
	h.Option("microvm", "first.img", true)
	if rc := h.Option("microvm", "second.img", true); rc == 0 {
		t.Error("a second, different --microvm value was accepted")
	}
	h.Option("microvm-workdir", "/w", true)
	if rc := h.Call(HookInitPostOpt, -1); rc != 0 {
		t.Fatalf("init_post_opt = %d", rc)
	}
	args := f.calls(t)[0].args
	if i := slices.Index(args, "--image"); i < 0 || args[i+1] != "first.img" {
		t.Errorf("prepare %q: want --image first.img", args)
	}
	if i := slices.Index(args, "--workdir"); i < 0 || args[i+1] != "/w" {
		t.Errorf("prepare %q: want --workdir /w", args)
	}
}

func TestMultiProg(t *testing.T) {
	conf := "# MPMD\n0 /bin/hostname\n1-3 /bin/echo task %t\n"

	t.Run("remote", func(t *testing.T) {
		f := newFakeLauncher(t)
		job := remoteJob()
		job.Argv = []string{"mp.conf", conf}
		h := NewHost(job, f.args()...)
		h.Call(HookInit, -1)
		h.Option("microvm", "a.img", true)
		if rc := h.Call(HookInitPostOpt, -1); rc != 0 {
			t.Fatalf("init_post_opt = %d", rc)
		}
		if rc := h.Call(HookTaskPostFork, 0); rc != 0 {
			t.Fatalf("task_post_fork = %d", rc)
		}
		if rc := h.Call(HookTaskInit, 0); rc != -1 {
			t.Fatalf("task_init = %d, want -1", rc)
		}
		if !logHas(h.Log(), "error: microvm: --multi-prog is not supported with --microvm yet") {
			t.Errorf("log %q lacks the --multi-prog message", h.Log())
		}
		h.Call(HookTaskExit, 0)
		h.Call(HookTaskExit, 1)
		h.Call(HookExit, -1)
		time.Sleep(50 * time.Millisecond)
		if calls := f.calls(t); len(calls) > 0 {
			t.Errorf("no microVM for a refused --multi-prog step, got calls %q", argvs(calls))
		}
	})

	t.Run("srun", func(t *testing.T) {
		dir := t.TempDir()
		oneLine := filepath.Join(dir, "one.conf")
		if err := os.WriteFile(oneLine, []byte("* /bin/hostname"), 0o644); err != nil {
			t.Fatal(err)
		}
		fifo := filepath.Join(dir, "fifo") // a command named like a FIFO must not block srun
		if err := unix.Mkfifo(fifo, 0o644); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			argv   []string
			wantRC int
		}{
			{[]string{"mp.conf", conf}, -1},
			{[]string{oneLine, "* /bin/hostname"}, -1}, // no newline: the file itself tells
			{[]string{"/bin/echo", "1 2"}, 0},
			{[]string{"/bin/hostname"}, 0},
			{[]string{fifo, "x"}, 0},
		}
		for _, tt := range tests {
			f := newFakeLauncher(t)
			h := NewHost(Job{Context: CtxLocal, Argv: tt.argv}, f.args()...)
			h.Call(HookInit, -1)
			h.Option("microvm", "a.img", false)
			if rc := h.Call(HookLocalUserInit, -1); rc != tt.wantRC {
				t.Errorf("argv %q: local_user_init = %d, want %d; log %q", tt.argv, rc, tt.wantRC, h.Log())
			}
		}
	})
}

func TestIsMultiProgData(t *testing.T) {
	tests := []struct {
		argv []string
		want bool
	}{
		{[]string{"c", "0 a\n"}, true},
		{[]string{"c", "  # comment\n\n0-1,3 a b\n*\tc\n"}, true},
		{[]string{"c", "0 a \\\n  continued line\n1 b\n"}, true},
		{[]string{"c", "0 a\n1\n"}, false}, // a line without program
		{[]string{"c", "0 a\nx b\n"}, false},
		{[]string{"/bin/echo", "1 2"}, false},
		{[]string{"/bin/sh", "-c", "0 x\n"}, false},
		{[]string{"c", "#only\n"}, false},
		{[]string{"c"}, false},
	}
	for _, tt := range tests {
		if got := isMultiProgData(tt.argv); got != tt.want {
			t.Errorf("isMultiProgData(%q) = %v, want %v", tt.argv, got, tt.want)
		}
	}
}

func TestJobEpilog(t *testing.T) {
	tests := []struct {
		name    string
		jobID   *uint32
		env     string // SLURM_JOB_ID
		wantRC  int
		wantJob string
		wantLog []string
	}{
		{name: "S_JOB_ID", jobID: U32(77), env: "1", wantJob: "77"},
		{name: "SLURM_JOB_ID", env: "78", wantJob: "78"},
		{name: "no job id", env: "x", wantRC: -1, wantLog: []string{"error: microvm: job epilog: no job id"}},
		{name: "gc fails", jobID: U32(666), wantRC: -1, wantJob: "666", wantLog: []string{"error: microvm: job 666: gc failed"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("SLURM_JOB_ID", tt.env)
			f := newFakeLauncher(t)
			// No slurm_spank_init in the job script context.
			h := NewHost(Job{Context: CtxJobScript, JobID: tt.jobID, UID: U32(0), GID: U32(0)}, f.args()...)
			if rc := h.Call(HookJobEpilog, -1); rc != tt.wantRC {
				t.Fatalf("job_epilog = %d, want %d; log %q", rc, tt.wantRC, h.Log())
			}
			var want [][]string
			if tt.wantJob != "" {
				want = [][]string{{"--config", f.config, "gc", "--job", tt.wantJob}}
			}
			if got := argvs(f.calls(t)); !reflect.DeepEqual(got, want) {
				t.Errorf("calls %q, want %q", got, want)
			}
			if tt.wantLog != nil && !logHas(h.Log(), tt.wantLog...) {
				t.Errorf("log %q lacks %q", h.Log(), tt.wantLog)
			}
		})
	}
	h := NewHost(Job{Context: CtxJobScript, JobID: U32(1)}, "bogus=1")
	if rc := h.Call(HookJobEpilog, -1); rc != -1 || !logHas(h.Log(), `"bogus=1"`) {
		t.Errorf("job_epilog with a bad plugstack arg = %d, log %q", rc, h.Log())
	}
}

// BenchmarkSyncCall measures one synchronous launcher call as the plugin
// makes it (fork, execve, waitpid with the polling backoff), with /bin/true
// as the launcher: the plugin's own cost per prepare/stop/gc.
func BenchmarkSyncCall(b *testing.B) {
	if _, err := os.Stat("/bin/true"); err != nil {
		prereq.Missing(b, "no /bin/true")
	}
	for i := 0; i < b.N; i++ {
		h := NewHost(Job{Context: CtxJobScript, JobID: U32(1)}, "launcher=/bin/true")
		if rc := h.Call(HookJobEpilog, -1); rc != 0 {
			b.Fatalf("job_epilog = %d, log %q", rc, h.Log())
		}
	}
}
