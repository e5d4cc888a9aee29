// Package state names the per-step runtime state of a sandbox on a node.
//
// Every step that runs in a microVM owns one directory under the runtime root
// (default /run/slurm-microvm, root-owned 0755 and writable by nobody else),
// named "<job>.<step>.<restart>.<node>" (StepID). Teardown needs nothing but the job and step
// ids: every pid and path of the sandbox is recorded here as soon as it
// exists.
//
//	spec.json     the step spec written by `slurm-microvm prepare` (root, 0644)
//	lock          the step's flock: supervisor record and stop mark are ordered
//	supervisor    pid of the detached supervisor (`slurm-microvm start`)
//	stop          written by stop (under lock) before it signals the supervisor
//	vmm.pid       pid of the VMM (QEMU) once started
//	sandbox.json  what the supervisor resolved (image digest, vCPUs, memory,
//	              phase times: launcher/inventory), root 0644
//	ready         created when the guest agent answered and the sandbox is usable
//	error         the reason the sandbox could not start (one line, user-facing)
//	control.sock  agent connection for exec clients: owned by the job's uid, 0600
//	console.log   guest serial console (kept for --microvm-debug)
//	launcher.log  supervisor log (log/slog text); the admin's copy outlives the
//	              step under [log] dir (default /var/log/slurm-microvm)
//
// and <root>/stopped/<job>.<step>.<restart>.<node>, the stop record, which outlives
// the step directory (see MarkStopped).
//
// # Who reads a step's state
//
// Only root and the job's user. The step directory is owned by root, mode
// 0700, with one POSIX ACL entry giving the job's uid search (--x) and
// nothing else (GrantSearch): the exec entry, running as the user, opens
// the names it knows (ready, error, spec.json, supervisor, control.sock, and
// the logs for --microvm-debug) by their own modes, but cannot list the
// directory or write in it; every other user, the job's own group included,
// cannot enter it. The files inside stay root-owned (0644 where the user
// reads them), so the user can change none of what root later trusts (the
// supervisor and VMM records that stop signals). The runtime root and every
// directory reused for state are checked first (CheckDir, MakeDir): owned by
// the effective uid, writable by nobody else, parents owned by root or that
// uid and sticky when others may write them; files are opened with
// O_NOFOLLOW and written through O_EXCL temporaries and rename.
//
// Design decisions (the alternative, and why not):
//   - An ACL on a 0700 directory, not mode 0711 with user-owned files: with
//     0711 every user can stat (and, by a file's own mode, read) any name in
//     it, so each of the VMM's and agent's files (vmm.log, console.log, ...)
//     would have to get its mode right forever; and files the user owns
//     could be rewritten by the user before root reads them. A per-step
//     group (0710) would need a group per step in the node's group
//     database. The ACL needs a filesystem with POSIX ACLs (tmpfs, ext4,
//     xfs); without one a step is refused with that reason, and `config
//     check` tests it.
//   - A stop record outside the step directory, not only a marker inside:
//     stop removes the step directory, and a prepare that comes after a
//     stop would recreate it. Records older than StopRecordTTL and those
//     of a job gc'ed by the epilog are removed.
//   - A non-root `slurm-microvm run` keeps its state in a new directory
//     with a random name (PrivateTempDir, under $XDG_RUNTIME_DIR when that
//     is the user's own, else under $TMPDIR or /tmp), not a predictable
//     /tmp/slurm-microvm-<uid> that another user can create first: nothing
//     but the process itself has to find it.
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

// SandboxFile is the supervisor's record of what it resolved for the step
// (launcher/inventory.Resolved), in the step directory.
const SandboxFile = "sandbox.json"

// StepID identifies one step of one job on one node. Restart is the job's
// restart count (S_SLURM_RESTART_COUNT), so a requeued job never meets the
// state of its previous run. Node is the Slurm node name (SLURMD_NODENAME):
// several slurmd on one host (Slurm's multiple-slurmd) share the runtime
// root, and each node's part of a step is its own sandbox. Node is "" for
// a step with no Slurm node (a user's `slurm-microvm run`).
type StepID struct {
	Job     uint32
	Step    uint32
	Restart uint32
	Node    string
}

// String renders the directory name "<job>.<step>.<restart>", followed by
// ".<node>" when Node is set.
func (id StepID) String() string {
	s := fmt.Sprintf("%d.%d.%d", id.Job, id.Step, id.Restart)
	if id.Node != "" {
		s += "." + id.Node
	}
	return s
}

// maxNodeName bounds a node name (Slurm's own limit is larger; a name in
// the runtime directory, a log file name and an interface alias must fit).
const maxNodeName = 64

// CheckNodeName checks a Slurm node name as it appears in the state's
// names: 1-64 bytes of letters, digits, '.', '_' and '-', starting with a
// letter or digit (hostnames, RFC 1123, plus '_', which Slurm allows).
// The error names the input and the rule.
func CheckNodeName(name string) error {
	if name == "" || len(name) > maxNodeName {
		return fmt.Errorf("node name %q: want 1-%d bytes", name, maxNodeName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if i == 0 && !alnum || !alnum && c != '.' && c != '_' && c != '-' {
			return fmt.Errorf("node name %q: byte %d (%q) is not allowed: a node name is letters, digits, '.', '_' and '-', starting with a letter or digit", name, i+1, c)
		}
	}
	return nil
}

// ParseStepID parses what String writes: "<job>.<step>.<restart>" or
// "<job>.<step>.<restart>.<node>" (the node name may hold dots).
func ParseStepID(s string) (StepID, error) {
	parts := strings.SplitN(s, ".", 4)
	if len(parts) < 3 {
		return StepID{}, fmt.Errorf("step id %q: want <job>.<step>.<restart>[.<node>]", s)
	}
	var v [3]uint32
	for i, p := range parts[:3] {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return StepID{}, fmt.Errorf("step id %q: field %d: %w", s, i+1, err)
		}
		v[i] = uint32(n)
	}
	id := StepID{Job: v[0], Step: v[1], Restart: v[2]}
	if len(parts) == 4 {
		if err := CheckNodeName(parts[3]); err != nil {
			return StepID{}, fmt.Errorf("step id %q: %w", s, err)
		}
		id.Node = parts[3]
	}
	return id, nil
}

// OfJobOnNode tells whether a name written by String is a step of job on
// node (node "": a step with no node).
func OfJobOnNode(name string, job uint32, node string) bool {
	id, err := ParseStepID(name)
	return err == nil && id.Job == job && id.Node == node
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
