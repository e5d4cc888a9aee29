package harness

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
)

// parseOptions turns "--microvm=a --microvm-debug" into options (values
// hold no spaces in these tables).
func parseOptions(t *testing.T, line string) []option {
	t.Helper()
	var out []option
	for _, f := range strings.Fields(line) {
		name, value, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		if !strings.HasPrefix(f, "--") {
			t.Fatalf("bad option %q in test table", f)
		}
		out = append(out, option{name, value})
	}
	return out
}

// runOptions feeds opts to a fresh plugin in ctx as Slurm does (init, the
// option callbacks, init_post_opt) and returns the first non-zero return
// code, with the log.
func runOptions(t *testing.T, ctx Context, opts []option) (int, []string) {
	t.Helper()
	f := newFakeLauncher(t)
	h := NewHost(Job{Context: ctx}, f.args()...)
	if rc := h.Call(HookInit, -1); rc != 0 {
		t.Fatalf("init = %d, log %q", rc, h.Log())
	}
	for _, o := range opts {
		if rc := h.Option(o.name, o.value, false); rc != 0 {
			return rc, h.Log()
		}
	}
	return h.Call(HookInitPostOpt, -1), h.Log()
}

// Invalid combinations of the --microvm* options, two lines a case (as
// pyxis' invalid_args.bats): the command line, then a part of the error.
// Each is refused by srun, sbatch and salloc before the job is queued.
var invalidOptions = []struct{ line, want string }{
	{"--microvm-mounts=/data",
		"--microvm-mounts needs --microvm=IMAGE: without an image the step would run on the host"},
	{"--microvm-workdir=/w",
		"add --microvm=IMAGE or drop --microvm-workdir"},
	{"--microvm-mpi=off",
		"--microvm-mpi needs --microvm=IMAGE"},
	{"--microvm-debug",
		"--microvm-debug needs --microvm=IMAGE"},
	{"--microvm-debug --microvm-mounts=/a --microvm-mpi=host",
		"--microvm-debug, --microvm-mounts, --microvm-mpi need --microvm=IMAGE"},
	{"--microvm=a.img --microvm=b.img",
		`--microvm is given twice with different values ("a.img", then "b.img"): give it once`},
	{"--microvm=a.img --microvm-mounts=/a --microvm-mounts=/b",
		`--microvm-mounts is given twice with different values ("/a", then "/b")`},
	{"--microvm=a.img --microvm-workdir=/a --microvm-workdir=/a/",
		`--microvm-workdir is given twice with different values`},
	{"--microvm-mpi=auto --microvm=a.img --microvm-mpi=off",
		`--microvm-mpi is given twice with different values ("auto", then "off")`},
	{"--microvm=",
		"--microvm: the value must not be empty (use --microvm=IMAGE)"},
	{"--microvm=a.img --microvm-mounts=",
		"--microvm-mounts: the value must not be empty"},
	{"--microvm=/i/a\x1b[2Kb.img",
		"--microvm: the value holds a control character (byte 0x1b at offset 4): images, paths and modes are printable text"},
	{"--microvm=a.img --microvm-workdir=/w\x7f",
		"--microvm-workdir: the value holds a control character (byte 0x7f at offset 2)"},
}

func TestInvalidOptionCombinations(t *testing.T) {
	for _, tt := range invalidOptions {
		for _, ctx := range []Context{CtxLocal, CtxAllocator} {
			rc, log := runOptions(t, ctx, parseOptions(t, tt.line))
			if rc == 0 {
				t.Errorf("context %d: %s accepted, want refused with %q; log %q", ctx, tt.line, tt.want, log)
				continue
			}
			if !logHas(log, "error: microvm: ", tt.want) {
				t.Errorf("context %d: %s: log %q lacks %q", ctx, tt.line, log, tt.want)
			}
			everyLinePrefixed(t, log)
		}
	}
}

// Slurm replays options (job options, then the environment): the same
// value twice stays accepted.
var validOptions = []string{
	"--microvm=a.img --microvm=a.img",
	"--microvm=a.img --microvm-debug --microvm-debug",
	"--microvm=a.img --microvm-mounts=/a --microvm-mpi=off --microvm-mounts=/a --microvm-mpi=off --microvm=a.img",
	"--microvm-workdir=/w --microvm=a.img",
	"",
}

func TestValidOptionCombinations(t *testing.T) {
	for _, line := range validOptions {
		for _, ctx := range []Context{CtxLocal, CtxAllocator} {
			if rc, log := runOptions(t, ctx, parseOptions(t, line)); rc != 0 {
				t.Errorf("context %d: %q refused (%d); log %q", ctx, line, rc, log)
			}
		}
	}
}

// A step that reaches slurmstepd with --microvm-* but no image (a submit
// host without the plugin's check) never runs its tasks on the host.
func TestRemoteOrphanOptionsRefuseTasks(t *testing.T) {
	f := newFakeLauncher(t)
	job := remoteJob()
	h := NewHost(job, f.args()...)
	if rc := h.Call(HookInit, -1); rc != 0 {
		t.Fatalf("init = %d", rc)
	}
	for i := 0; i < 2; i++ {
		if rc := h.Option("microvm-mounts", "/data", true); rc != 0 {
			t.Fatalf("--microvm-mounts = %d", rc)
		}
	}
	if rc := h.Call(HookInitPostOpt, -1); rc != 0 {
		t.Fatalf("init_post_opt = %d, log %q", rc, h.Log())
	}
	if rc := h.Call(HookTaskInit, 0); rc == 0 {
		t.Errorf("task_init accepted a task of a step with --microvm-mounts and no --microvm: argv %q", h.Argv())
	}
	if !logHas(h.Log(), "task refused: --microvm-mounts needs --microvm=IMAGE") {
		t.Errorf("log %q lacks the refusal", h.Log())
	}
	for _, hook := range []Hook{HookTaskExit, HookExit} {
		h.Call(hook, 0)
	}
	if calls := f.calls(t); len(calls) > 0 {
		t.Errorf("launcher called: %q", argvs(calls))
	}
}

// srun --help shows every option under one "[microvm]" heading with the
// accepted forms of its value.
func TestOptionHelp(t *testing.T) {
	h := NewHost(Job{Context: CtxLocal})
	if rc := h.Call(HookInit, -1); rc != 0 {
		t.Fatalf("init = %d", rc)
	}
	want := map[string]string{
		"microvm":         "[docker://]REGISTRY/IMAGE[:TAG]|PATH",
		"microvm-debug":   "",
		"microvm-mounts":  "SRC[:DST[:FLAGS]],...",
		"microvm-workdir": "DIR",
		"microvm-mpi":     strings.Join(launcher.MPIModes, "|"),
		"microvm-network": strings.Join(config.NetworkModes, "|"),
	}
	help := h.Help()
	if len(help) != len(want) {
		t.Errorf("%d options registered, want %d: %+v", len(help), len(want), help)
	}
	for _, o := range help {
		w, ok := want[o.Name]
		if !ok {
			t.Errorf("unexpected option --%s", o.Name)
			continue
		}
		if o.ArgInfo != w {
			t.Errorf("--%s arginfo %q, want %q", o.Name, o.ArgInfo, w)
		}
		if !strings.HasPrefix(o.Usage, "[microvm] ") {
			t.Errorf("--%s usage %q lacks the [microvm] heading", o.Name, o.Usage)
		}
		if o.Name != "microvm" && !strings.Contains(o.Usage, "needs --microvm") {
			t.Errorf("--%s usage %q does not say it needs --microvm", o.Name, o.Usage)
		}
	}
}

// plugstackConf reads ../../etc/plugstack.conf: the arguments of its
// plugin line, and every KEY=VALUE its comments document.
func plugstackConf(t *testing.T) (so string, line []string, documented []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(spankDir, "..", "etc", "plugstack.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 0:
		case strings.HasPrefix(f[0], "#"):
			for _, w := range f[1:] {
				if k, _, ok := strings.Cut(w, "="); ok && k != "" && strings.Trim(k, "abcdefghijklmnopqrstuvwxyz_") == "" {
					documented = append(documented, w)
				}
			}
		case f[0] == "required" || f[0] == "optional":
			if so != "" {
				t.Fatalf("plugstack.conf has two plugin lines")
			}
			if len(f) < 2 {
				t.Fatalf("plugstack.conf: %q names no plugin", l)
			}
			so, line = f[1], f[2:]
		default:
			t.Fatalf("plugstack.conf: unexpected line %q", l)
		}
	}
	if so == "" {
		t.Fatal("plugstack.conf has no plugin line")
	}
	return so, line, documented
}

// etc/plugstack.conf is installed with `required`: an argument the plugin
// refuses there fails every job on the node. The plugin line, and every
// argument its comments document, load in every context.
func TestPlugstackConfLoads(t *testing.T) {
	_, line, documented := plugstackConf(t)
	if len(documented) == 0 {
		t.Fatal("plugstack.conf documents no argument")
	}
	cases := map[string][]string{"the plugin line": line, "every documented argument": documented}
	for _, d := range documented {
		cases[d] = []string{d}
	}
	for name, args := range cases {
		for _, ctx := range []Context{CtxLocal, CtxAllocator, CtxRemote, CtxSlurmd} {
			h := NewHost(Job{Context: ctx}, args...)
			if rc := h.Call(HookInit, -1); rc != 0 {
				t.Errorf("%s %q, context %d: init = %d, log %q", name, args, ctx, rc, h.Log())
			}
		}
	}

	// The documented values are the defaults: loading them changes nothing.
	h := NewHost(Job{Context: CtxLocal})
	h.Call(HookInit, -1)
	defaults := h.Config()
	h = NewHost(Job{Context: CtxLocal}, documented...)
	h.Call(HookInit, -1)
	if got := h.Config(); got != defaults {
		t.Errorf("documented arguments %q give %+v, the defaults are %+v", documented, got, defaults)
	}

	// Every argument the plugin knows is documented.
	h = NewHost(Job{Context: CtxLocal}, "no-such-argument")
	h.Call(HookInit, -1)
	var known []string
	for _, l := range h.Log() {
		if _, list, ok := strings.Cut(l, "(known: "); ok {
			for _, k := range strings.Split(strings.TrimSuffix(list, ")"), ", ") {
				known = append(known, strings.TrimSuffix(k, "="))
			}
		}
	}
	var keys []string
	for _, d := range documented {
		k, _, _ := strings.Cut(d, "=")
		keys = append(keys, k)
	}
	slices.Sort(keys)
	slices.Sort(known)
	if len(known) == 0 || !slices.Equal(keys, known) {
		t.Errorf("plugstack.conf documents %q, the plugin knows %q", keys, known)
	}
}

// The SLURM_MICROVM_* fallbacks in srun, sbatch and salloc (as pyxis'
// PYXIS_*): used when the option is not given, checked like the option,
// named in errors by the variable; the command line wins.
func TestEnvironmentFallbacks(t *testing.T) {
	for _, tt := range []struct {
		name     string
		env      map[string]string
		line     string
		validate []string // the validate call's arguments after --config; nil: refused
		want     string   // part of the error when refused
	}{
		// SLURM_MICROVM_MOUNTS is the launcher's to read (validate's
		// environment): never turned into --mounts here.
		{name: "image and options", env: map[string]string{"SLURM_MICROVM_IMAGE": "/i/a.img", "SLURM_MICROVM_MOUNTS": "/data", "SLURM_MICROVM_MPI": "off", "SLURM_MICROVM_DEBUG": "1"},
			validate: []string{"validate", "--image", "/i/a.img", "--debug", "--mpi", "off"}},
		{name: "command line wins", env: map[string]string{"SLURM_MICROVM_IMAGE": "/i/a.img", "SLURM_MICROVM_WORKDIR": "/env"}, line: "--microvm=/i/b.img --microvm-workdir=/cli",
			validate: []string{"validate", "--image", "/i/b.img", "--workdir", "/cli"}},
		{name: "image on the command line, options from the environment", env: map[string]string{"SLURM_MICROVM_NETWORK": "step"}, line: "--microvm=/i/b.img",
			validate: []string{"validate", "--image", "/i/b.img", "--network", "step"}},
		{name: "empty is unset", env: map[string]string{"SLURM_MICROVM_IMAGE": "", "SLURM_MICROVM_MOUNTS": ""}},
		{name: "debug off", env: map[string]string{"SLURM_MICROVM_IMAGE": "/i/a.img", "SLURM_MICROVM_DEBUG": "false"},
			validate: []string{"validate", "--image", "/i/a.img"}},
		{name: "bad debug value", env: map[string]string{"SLURM_MICROVM_IMAGE": "/i/a.img", "SLURM_MICROVM_DEBUG": "maybe"},
			want: "SLURM_MICROVM_DEBUG=maybe: want 1 or 0"},
		{name: "a control character", env: map[string]string{"SLURM_MICROVM_IMAGE": "/i/a.img\nfake row"},
			want: "SLURM_MICROVM_IMAGE: the value holds a control character (byte 0x0a at offset 8)"},
		{name: "too long", env: map[string]string{"SLURM_MICROVM_IMAGE": "/" + strings.Repeat("a", 5000)},
			want: "SLURM_MICROVM_IMAGE: the value is longer than 4096 bytes"},
		// A profile's variables do not turn host steps into errors.
		{name: "options without an image are ignored", env: map[string]string{"SLURM_MICROVM_MOUNTS": "/data", "SLURM_MICROVM_MPI": "bogus", "SLURM_MICROVM_DEBUG": "maybe"}},
	} {
		for _, ctx := range []Context{CtxLocal, CtxAllocator} {
			t.Run(tt.name, func(t *testing.T) {
				for _, v := range []string{"IMAGE", "MOUNTS", "WORKDIR", "MPI", "NETWORK", "DEBUG"} {
					t.Setenv("SLURM_MICROVM_"+v, "")
					os.Unsetenv("SLURM_MICROVM_" + v)
				}
				for k, v := range tt.env {
					t.Setenv(k, v)
				}
				f := newFakeLauncher(t)
				h := NewHost(Job{Context: ctx}, f.args()...)
				if rc := h.Call(HookInit, -1); rc != 0 {
					t.Fatalf("init = %d, log %q", rc, h.Log())
				}
				for _, o := range parseOptions(t, tt.line) {
					if rc := h.Option(o.name, o.value, false); rc != 0 {
						t.Fatalf("--%s = %d", o.name, rc)
					}
				}
				rc := h.Call(HookInitPostOpt, -1)
				calls := f.calls(t)
				if tt.want != "" {
					if rc == 0 || !logHas(h.Log(), "error: microvm: ", tt.want) {
						t.Fatalf("context %d: rc %d, log %q; want refused with %q", ctx, rc, h.Log(), tt.want)
					}
					if len(calls) > 0 {
						t.Errorf("launcher called: %q", argvs(calls))
					}
					return
				}
				if rc != 0 {
					t.Fatalf("context %d: init_post_opt = %d, log %q", ctx, rc, h.Log())
				}
				var want [][]string
				if tt.validate != nil {
					want = [][]string{append([]string{"--config", f.config}, tt.validate...)}
				}
				if got := argvs(calls); !reflect.DeepEqual(got, want) {
					t.Errorf("context %d: launcher calls %q, want %q", ctx, got, want)
				}
			})
		}
	}
}

// Slurm calls init_post_opt once per component of a heterogeneous job
// (srun's option loop, sbatch, salloc): the variables are noted once, and
// an "off" SLURM_MICROVM_DEBUG, which sets nothing and so is read again
// each time, does not grow the note. Before, 14 components overran it
// into the step's state, whose pointers the exit hook then freed.
func TestEnvironmentFallbacksPerComponent(t *testing.T) {
	for _, v := range []string{"IMAGE", "MOUNTS", "WORKDIR", "MPI", "NETWORK", "DEBUG"} {
		t.Setenv("SLURM_MICROVM_"+v, "")
		os.Unsetenv("SLURM_MICROVM_" + v)
	}
	t.Setenv("SLURM_MICROVM_IMAGE", "fail.img")
	t.Setenv("SLURM_MICROVM_MPI", "off")
	t.Setenv("SLURM_MICROVM_DEBUG", "0")
	f := newFakeLauncher(t)
	h := NewHost(Job{Context: CtxLocal}, f.args()...)
	if rc := h.Call(HookInit, -1); rc != 0 {
		t.Fatalf("init = %d, log %q", rc, h.Log())
	}
	for c := 0; c < 20; c++ {
		if rc := h.Call(HookInitPostOpt, -1); rc == 0 {
			t.Fatalf("component %d: fail.img accepted", c)
		}
	}
	h.Call(HookExit, -1)
	const want = "options taken from the environment: SLURM_MICROVM_IMAGE, SLURM_MICROVM_MPI"
	log := h.Log()
	if !logHas(log, want) {
		t.Fatalf("log %q lacks %q", log, want)
	}
	for _, l := range log {
		if strings.Count(l, "SLURM_MICROVM_") > 2 {
			t.Errorf("a variable noted twice: %q", l)
		}
	}
}
