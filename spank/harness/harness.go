// Package harness unit-tests the C SPANK plugin in spank/ through cgo.
//
// The package compiles the plugin's C sources (plugin_X.c are symlinks to
// ../X.c, so that Go's build cache sees their content) together with
// fake_spank.c, a SPANK host that provides the spank_* and
// slurm_* functions the plugin calls with the availability rules of Slurm
// 22.05 (src/common/plugstack.c). Tests set the context, the items, the job
// environment and argv, then drive the plugin's callbacks in Slurm's order
// (init, option callbacks, init_post_opt, task_post_fork, task_init,
// task_exit, exit, job_epilog). The launcher is a shell script written by
// the test that records every call.
//
// The plugin and the fake keep process-wide C state: a Host must not be
// used from parallel tests.
package harness

/*
#cgo CFLAGS: -D_GNU_SOURCE -std=gnu11 -Wall -Werror
#include <stdlib.h>
#include "fake_spank.h"
#include "microvm.h"
*/
import "C"

import (
	"strings"
	"unsafe"
)

// Context is a SPANK context (enum spank_context).
type Context int

// SPANK contexts.
const (
	CtxLocal     Context = C.S_CTX_LOCAL
	CtxRemote    Context = C.S_CTX_REMOTE
	CtxAllocator Context = C.S_CTX_ALLOCATOR
	CtxSlurmd    Context = C.S_CTX_SLURMD
	CtxJobScript Context = C.S_CTX_JOB_SCRIPT
)

// Hook is one of the plugin's slurm_spank_* callbacks.
type Hook int

// Callbacks, in the order Slurm calls them for one step.
const (
	HookInit          Hook = C.FAKE_INIT
	HookInitPostOpt   Hook = C.FAKE_INIT_POST_OPT
	HookLocalUserInit Hook = C.FAKE_LOCAL_USER_INIT
	HookTaskPostFork  Hook = C.FAKE_TASK_POST_FORK
	HookTaskInit      Hook = C.FAKE_TASK_INIT
	HookTaskExit      Hook = C.FAKE_TASK_EXIT
	HookExit          Hook = C.FAKE_EXIT
	HookJobEpilog     Hook = C.FAKE_JOB_EPILOG
)

// Step ids Slurm reserves (slurm.h).
const (
	StepBatch       uint32 = 0xfffffffb
	StepExtern      uint32 = 0xfffffffc
	StepInteractive uint32 = 0xfffffffa
)

// Job is what the fake SPANK host tells the plugin. A nil pointer field
// makes spank_get_item fail for that item.
type Job struct {
	Context    Context
	JobID      *uint32
	StepID     *uint32
	Restart    *uint32 // S_SLURM_RESTART_COUNT
	UID, GID   *uint32
	Groups     []uint32 // S_JOB_SUPPLEMENTARY_GIDS
	Cores      *string  // S_STEP_ALLOC_CORES
	MemMB      *uint64  // S_STEP_ALLOC_MEM
	LocalTasks *uint32  // S_JOB_LOCAL_TASK_COUNT
	NNodes     *uint32  // S_JOB_NNODES
	NodeID     *uint32  // S_JOB_NODEID
	// JobMem is job_info_t.pn_min_memory as slurm_load_job reports it
	// (MEM_PER_CPU flag included); nil makes slurm_load_job fail.
	JobMem *uint64
	Argv   []string // S_JOB_ARGV
	Env    map[string]string
}

// U32 and friends take the address of a constant for Job fields.
func U32(v uint32) *uint32 { return &v }

// U64 returns &v.
func U64(v uint64) *uint64 { return &v }

// Str returns &v.
func Str(v string) *string { return &v }

// Host is the fake SPANK host with the plugin loaded in it.
type Host struct {
	// Args are the plugstack.conf arguments passed to every callback.
	Args []string
}

// NewHost forgets all state of the fake and of the plugin, then loads job.
func NewHost(job Job, args ...string) *Host {
	C.fake_reset()
	C.fake_set_context(C.int(job.Context))
	setU32 := func(item C.int, v *uint32) {
		if v != nil {
			C.fake_set_u32(item, C.uint32_t(*v))
		}
	}
	setU32(C.S_JOB_ID, job.JobID)
	setU32(C.S_JOB_STEPID, job.StepID)
	setU32(C.S_SLURM_RESTART_COUNT, job.Restart)
	setU32(C.S_JOB_UID, job.UID)
	setU32(C.S_JOB_GID, job.GID)
	setU32(C.S_JOB_LOCAL_TASK_COUNT, job.LocalTasks)
	setU32(C.S_JOB_NNODES, job.NNodes)
	setU32(C.S_JOB_NODEID, job.NodeID)
	if job.MemMB != nil {
		C.fake_set_u64(C.S_STEP_ALLOC_MEM, C.uint64_t(*job.MemMB))
	}
	if job.JobMem != nil {
		C.fake_set_job_mem(C.uint64_t(*job.JobMem), 0)
	} else {
		C.fake_set_job_mem(0, 1)
	}
	if job.Cores != nil {
		cs := C.CString(*job.Cores)
		C.fake_set_str(C.S_STEP_ALLOC_CORES, cs)
		C.free(unsafe.Pointer(cs))
	}
	if job.Groups != nil {
		gids := make([]C.uint32_t, len(job.Groups)+1)
		for i, g := range job.Groups {
			gids[i] = C.uint32_t(g)
		}
		C.fake_set_gids(&gids[0], C.int(len(job.Groups)))
	}
	if job.Argv != nil {
		argv, free := cStrings(job.Argv)
		C.fake_set_argv(C.int(len(job.Argv)), argv)
		free()
	}
	for k, v := range job.Env {
		ck, cv := C.CString(k), C.CString(v)
		C.fake_setenv(ck, cv)
		C.free(unsafe.Pointer(ck))
		C.free(unsafe.Pointer(cv))
	}
	return &Host{Args: append([]string(nil), args...)}
}

// cStrings returns a NULL-terminated C copy of ss and its release func.
func cStrings(ss []string) (**C.char, func()) {
	arr := (*[1 << 20]*C.char)(C.malloc(C.size_t(len(ss)+1) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	for i, s := range ss {
		arr[i] = C.CString(s)
	}
	arr[len(ss)] = nil
	return &arr[0], func() {
		for i := range ss {
			C.free(unsafe.Pointer(arr[i]))
		}
		C.free(unsafe.Pointer(&arr[0]))
	}
}

// Call runs callback h for local task id task (-1: no task) and returns
// its return code.
func (h *Host) Call(hook Hook, task int) int {
	argv, free := cStrings(h.Args)
	defer free()
	return int(C.fake_call(C.int(hook), C.int(task), C.int(len(h.Args)), argv))
}

// Option calls the callback of the registered option name as Slurm does
// when it parses --name=value (remote: replayed in slurmstepd). It
// returns the callback's return code, or -1000 if name is not registered.
func (h *Host) Option(name, value string, remote bool) int {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	// Freed right after the call: the plugin must keep a copy.
	cv := C.CString(value)
	defer C.free(unsafe.Pointer(cv))
	r := 0
	if remote {
		r = 1
	}
	return int(C.fake_option(cn, cv, C.int(r)))
}

// Options lists the registered options as "name" or "name=" (has_arg).
func (h *Host) Options() []string {
	var out []string
	for i := 0; i < int(C.fake_noptions()); i++ {
		name := C.GoString(C.fake_option_name(C.int(i)))
		if C.fake_option_has_arg(C.int(i)) != 0 {
			name += "="
		}
		out = append(out, name)
	}
	return out
}

// OptionHelp is one registered option as Slurm's --help shows it:
// "--Name=ArgInfo  Usage" (ArgInfo empty for an option without value).
type OptionHelp struct {
	Name, ArgInfo, Usage string
}

// Help lists the registered options with their arginfo and usage.
func (h *Host) Help() []OptionHelp {
	var out []OptionHelp
	for i := 0; i < int(C.fake_noptions()); i++ {
		o := OptionHelp{Name: C.GoString(C.fake_option_name(C.int(i))), Usage: C.GoString(C.fake_option_usage(C.int(i)))}
		if a := C.fake_option_arginfo(C.int(i)); a != nil {
			o.ArgInfo = C.GoString(a)
		}
		out = append(out, o)
	}
	return out
}

// PluginConfig is the plugin's configuration once plugstack.conf's
// arguments are loaded (struct mv_config).
type PluginConfig struct {
	Loaded                 bool
	Launcher, Exec, Config string
	TimeoutS               uint
}

// Config reads the plugin's loaded configuration.
func (h *Host) Config() PluginConfig {
	c := C.mv.cfg
	str := func(p *C.char) string {
		if p == nil {
			return ""
		}
		return C.GoString(p)
	}
	return PluginConfig{Loaded: c.loaded != 0, Launcher: str(c.launcher), Exec: str(c.exec), Config: str(c.config), TimeoutS: uint(c.timeout_s)}
}

// LoadJobCalls counts the plugin's slurm_load_job calls.
func (h *Host) LoadJobCalls() int { return int(C.fake_load_job_calls()) }

// ProcessGetenv reads the process environment as C sees it (what the
// plugin's setenv in srun wrote; Go's os.Getenv keeps its own copy).
func ProcessGetenv(name string) (string, bool) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	v := C.getenv(cn)
	if v == nil {
		return "", false
	}
	return C.GoString(v), true
}

// ProcessUnsetenv removes name from the process environment (C's view).
func ProcessUnsetenv(name string) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	C.unsetenv(cn)
}

// SetArgv replaces S_JOB_ARGV, as each forked task starts from the job's.
func (h *Host) SetArgv(argv []string) {
	cargv, free := cStrings(argv)
	defer free()
	C.fake_set_argv(C.int(len(argv)), cargv)
}

// isMultiProgData is the plugin's mv_is_multi_prog_data(argc, argv).
func isMultiProgData(argv []string) bool {
	cargv, free := cStrings(argv)
	defer free()
	return C.mv_is_multi_prog_data(C.int(len(argv)), cargv) != 0
}

// Argv is S_JOB_ARGV as the task would exec it.
func (h *Host) Argv() []string {
	n := int(C.fake_argc())
	out := make([]string, n)
	for i := range out {
		out[i] = C.GoString(C.fake_argv(C.int(i)))
	}
	return out
}

// Getenv reads the job environment (what spank_setenv wrote).
func (h *Host) Getenv(name string) (string, bool) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	v := C.fake_getenv(cn)
	if v == nil {
		return "", false
	}
	return C.GoString(v), true
}

// Log is every slurm_error/info/debug line so far, as "level: message".
func (h *Host) Log() []string {
	s := strings.TrimRight(C.GoString(C.fake_log()), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
