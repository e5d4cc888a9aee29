// Package state names the per-step runtime state of a sandbox on a node.
//
// Every step that runs in a microVM owns one directory under the runtime root
// (default /run/slurm-microvm), named "<job>.<step>.<restart>", owned by root,
// mode 0755. Teardown needs nothing but the job and step ids: every pid and path
// of the sandbox is recorded here as soon as it exists.
//
//	spec.json     the step spec written by `slurm-microvm prepare` (root, 0644)
//	supervisor    pid of the detached supervisor (`slurm-microvm start`)
//	vmm.pid       pid of the VMM (QEMU) once started
//	ready         created when the guest agent answered and the sandbox is usable
//	error         the reason the sandbox could not start (one line, user-facing)
//	control.sock  agent connection for exec clients: owned by the job's uid, 0600
//	console.log   guest serial console (kept for --microvm-debug)
//	launcher.log  supervisor log (log/slog text)
package state

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultRoot is the runtime root when microvm.toml sets none.
const DefaultRoot = "/run/slurm-microvm"

// File names inside a step directory.
const (
	SpecFile       = "spec.json"
	SupervisorFile = "supervisor"
	VMMPidFile     = "vmm.pid"
	ReadyFile      = "ready"
	ErrorFile      = "error"
	ControlSocket  = "control.sock"
	ConsoleLog     = "console.log"
	LauncherLog    = "launcher.log"
	// StopFile is written (by root) before the supervisor is signalled to
	// stop: signals that reach the whole step (a job's scancel under
	// proctrack/cgroup) must not end the sandbox under a workload that is
	// still handling them.
	StopFile = "stop"
)

// StepID identifies one step of one job on this node. Restart is the job's
// restart count (S_SLURM_RESTART_COUNT), so a requeued job never meets the
// state of its previous run.
type StepID struct {
	Job     uint32
	Step    uint32
	Restart uint32
}

// String renders the directory name "<job>.<step>.<restart>".
func (id StepID) String() string {
	return fmt.Sprintf("%d.%d.%d", id.Job, id.Step, id.Restart)
}

// ParseStepID parses "<job>.<step>.<restart>" as written by String.
func ParseStepID(s string) (StepID, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return StepID{}, fmt.Errorf("step id %q: want <job>.<step>.<restart>", s)
	}
	var v [3]uint32
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return StepID{}, fmt.Errorf("step id %q: field %d: %w", s, i+1, err)
		}
		v[i] = uint32(n)
	}
	return StepID{Job: v[0], Step: v[1], Restart: v[2]}, nil
}

// Dir is the runtime directory of one step.
type Dir struct {
	Root string
	ID   StepID
}

// Path is the step directory itself.
func (d Dir) Path() string { return filepath.Join(d.Root, d.ID.String()) }

// File is the path of a named file inside the step directory.
func (d Dir) File(name string) string { return filepath.Join(d.Path(), name) }
