package inventory

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// The phases of a sandbox (see the package documentation for how each is
// read from the state directory).
const (
	PhasePreparing = "preparing"
	PhaseBooting   = "booting"
	PhaseRunning   = "running"
	PhaseStopping  = "stopping"
	PhaseFailed    = "failed"
)

// Resolved is what the supervisor resolved for a step, kept in
// state.SandboxFile: ps shows it, metrics and logs use the same names.
type Resolved struct {
	// ImageDigest is the digest of the image as converted (sha256:...).
	ImageDigest string `json:"image_digest,omitempty"`
	// Driver is the runtime driver that started the sandbox.
	Driver string `json:"driver,omitempty"`
	// VCPUs and MemoryMiB are what the guest was given (MiB).
	VCPUs     int    `json:"vcpus,omitempty"`
	MemoryMiB uint64 `json:"memory_mib,omitempty"`
	// PhasesMS holds each start phase's duration in whole milliseconds,
	// by the names the supervisor logs (launcher.Phase*).
	PhasesMS map[string]int64 `json:"phases_ms,omitempty"`
}

// WriteResolved records r in the step directory d (root 0644, written
// through a temporary and rename). Errors name the file.
func WriteResolved(d state.Dir, r Resolved) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("record sandbox of step %s: %w", d.ID, err)
	}
	if err := state.WriteFileAtomic(d.File(state.SandboxFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("record sandbox of step %s: %w", d.ID, err)
	}
	return nil
}

// Sandbox is one step's sandbox as ps lists it. Field names are stable.
type Sandbox struct {
	// ID is the step directory's name, <job>.<step>.<restart>[.<node>].
	ID      string `json:"id"`
	Job     uint32 `json:"job"`
	Step    uint32 `json:"step"`
	Restart uint32 `json:"restart"`
	Node    string `json:"node"`
	UID     uint32 `json:"uid"`
	User    string `json:"user"`
	// Image is the --microvm value as given; ImageDigest the digest it
	// resolved to ("" until the supervisor resolved it).
	Image       string `json:"image"`
	ImageDigest string `json:"image_digest"`
	// VCPUs and MemoryMiB are the guest's (MiB); before the supervisor
	// recorded them, what the spec asked for (0: not known yet).
	VCPUs     int    `json:"vcpus"`
	MemoryMiB uint64 `json:"memory_mib"`
	Phase     string `json:"phase"`
	// StartedAt is when the supervisor recorded itself (else when the
	// spec was written); UptimeS the whole seconds since then.
	StartedAt     time.Time `json:"started_at"`
	UptimeS       int64     `json:"uptime_s"`
	SupervisorPid int       `json:"supervisor_pid"`
	// VMMPid is 0 until the VMM started.
	VMMPid int `json:"vmm_pid"`
	// Error is the step's error file (one line), "" when none.
	Error string `json:"error,omitempty"`
}

// Record is one sandbox in full (`slurm-microvm inspect`): the Sandbox,
// the state directory, the supervisor's record and the step spec as
// written by prepare.
type Record struct {
	Sandbox
	StateDir string           `json:"state_dir"`
	Driver   string           `json:"driver,omitempty"`
	PhasesMS map[string]int64 `json:"phases_ms,omitempty"`
	Spec     json.RawMessage  `json:"spec"`
}

// stepSpec is the part of launcher.Spec (spec.json) this package reads.
type stepSpec struct {
	UID    uint32 `json:"uid"`
	User   string `json:"user"`
	Image  string `json:"image"`
	MemMiB uint64 `json:"mem_mib"`
	CPUs   int    `json:"cpus"`
}

// ErrPermission wraps a state directory the caller may not read.
var ErrPermission = errors.New("the sandboxes' state is root's (runtime root 0711, each step 0700): run this as root")

// List returns every sandbox with state under root, sorted by job, step,
// restart and node; now sets the uptimes. A runtime root that does not
// exist holds none. A directory that vanishes while it is read (a step
// that ended) is left out; one that cannot be read is an error naming it
// (ErrPermission when it is the caller's permission).
func List(root string, now time.Time) ([]Sandbox, error) {
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, readErr(root, err)
	}
	var out []Sandbox
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		id, err := state.ParseStepID(e.Name())
		if err != nil {
			continue // "stopped" and anything not a step's
		}
		r, err := Read(state.Dir{Root: root, ID: id}, now)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r.Sandbox)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Job != b.Job {
			return a.Job < b.Job
		}
		if a.Step != b.Step {
			return a.Step < b.Step
		}
		if a.Restart != b.Restart {
			return a.Restart < b.Restart
		}
		return a.Node < b.Node
	})
	return out, nil
}

func readErr(path string, err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("read %s: %w", path, ErrPermission)
	}
	return fmt.Errorf("read sandbox state %s: %w", path, err)
}

// Read returns the full record of the step in d. A step directory without
// a spec is fs.ErrNotExist (wrapped): prepare has not written it yet, or
// stop removed it.
func Read(d state.Dir, now time.Time) (*Record, error) {
	specB, err := os.ReadFile(d.File(state.SpecFile))
	if err != nil {
		return nil, readErr(d.File(state.SpecFile), err)
	}
	var sp stepSpec
	if err := json.Unmarshal(specB, &sp); err != nil {
		return nil, fmt.Errorf("parse %s: %w", d.File(state.SpecFile), err)
	}
	r := &Record{
		Sandbox: Sandbox{
			ID: d.ID.String(), Job: d.ID.Job, Step: d.ID.Step, Restart: d.ID.Restart, Node: d.ID.Node,
			UID: sp.UID, User: sp.User, Image: sp.Image, VCPUs: sp.CPUs, MemoryMiB: sp.MemMiB,
		},
		StateDir: d.Path(),
		Spec:     json.RawMessage(specB),
	}
	if fi, err := os.Stat(d.File(state.SpecFile)); err == nil {
		r.StartedAt = fi.ModTime()
	}
	if b, err := os.ReadFile(d.File(state.SandboxFile)); err == nil {
		var res Resolved
		if err := json.Unmarshal(b, &res); err != nil {
			return nil, fmt.Errorf("parse %s: %w", d.File(state.SandboxFile), err)
		}
		r.ImageDigest, r.Driver, r.PhasesMS = res.ImageDigest, res.Driver, res.PhasesMS
		if res.VCPUs > 0 {
			r.VCPUs = res.VCPUs
		}
		if res.MemoryMiB > 0 {
			r.MemoryMiB = res.MemoryMiB
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, readErr(d.File(state.SandboxFile), err)
	}
	if b, err := os.ReadFile(d.File(state.ErrorFile)); err == nil {
		r.Error = strings.TrimSpace(string(b))
	}
	sup, supErr := state.ReadProc(d.File(state.SupervisorFile))
	if supErr == nil {
		r.SupervisorPid = sup.Pid
		if fi, err := os.Stat(d.File(state.SupervisorFile)); err == nil {
			r.StartedAt = fi.ModTime()
		}
	}
	// A VMM that is gone shows as 0 (its record stays until stop).
	if vmm, err := state.ReadProc(d.File(state.VMMPidFile)); err == nil && vmm.Alive() {
		r.VMMPid = vmm.Pid
	}
	exists := func(name string) bool { _, err := os.Lstat(d.File(name)); return err == nil }
	switch {
	case d.Stopped():
		r.Phase = PhaseStopping
	case r.Error != "" || supErr == nil && !sup.Alive():
		r.Phase = PhaseFailed
	case exists(state.ReadyFile):
		r.Phase = PhaseRunning
	case supErr == nil:
		r.Phase = PhaseBooting
	default:
		r.Phase = PhasePreparing
	}
	if !r.StartedAt.IsZero() && now.After(r.StartedAt) {
		r.UptimeS = int64(now.Sub(r.StartedAt) / time.Second)
	}
	if _, err := os.Lstat(d.Path()); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("step %s: %w", d.ID, fs.ErrNotExist)
	}
	return r, nil
}

// Find returns the state directory of the step that a user names as
// JOB.STEP[.RESTART] (node: the Slurm node name, "" for any). Without a
// restart the highest one is taken. Errors name the input: a malformed id,
// no such step on this node, or several nodes' steps (multiple-slurmd)
// when node is "".
func Find(root, arg, node string) (state.Dir, error) {
	parts := strings.Split(arg, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return state.Dir{}, fmt.Errorf("step %q: want JOB.STEP or JOB.STEP.RESTART (e.g. 1234.0)", arg)
	}
	var v [3]uint64
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return state.Dir{}, fmt.Errorf("step %q: %q is not a number: want JOB.STEP or JOB.STEP.RESTART (e.g. 1234.0)", arg, p)
		}
		v[i] = n
	}
	if node != "" {
		if err := state.CheckNodeName(node); err != nil {
			return state.Dir{}, fmt.Errorf("--node: %w", err)
		}
	}
	ents, err := os.ReadDir(root)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return state.Dir{}, readErr(root, err)
	}
	var found []state.StepID
	for _, e := range ents {
		id, err := state.ParseStepID(e.Name())
		if err != nil || !e.IsDir() || uint64(id.Job) != v[0] || uint64(id.Step) != v[1] {
			continue
		}
		if len(parts) == 3 && uint64(id.Restart) != v[2] {
			continue
		}
		if node != "" && id.Node != node {
			continue
		}
		found = append(found, id)
	}
	if len(found) == 0 {
		where := "on this node"
		if node != "" {
			where = "on node " + node
		}
		return state.Dir{}, fmt.Errorf("step %s: no sandbox %s (under %s; `slurm-microvm ps` lists them)", arg, where, root)
	}
	sort.Slice(found, func(i, j int) bool { return found[i].Restart > found[j].Restart })
	var nodes []string
	for _, id := range found {
		if id.Restart == found[0].Restart {
			nodes = append(nodes, id.Node)
		}
	}
	if len(nodes) > 1 {
		return state.Dir{}, fmt.Errorf("step %s: a sandbox on each of the nodes %s: name one with --node", arg, strings.Join(nodes, ", "))
	}
	return state.Dir{Root: root, ID: found[0]}, nil
}

// Running counts the sandboxes under root that are booting or running,
// leaving out the step except (its own supervisor, which is ending).
func Running(root string, except state.StepID) (int, error) {
	list, err := List(root, time.Now())
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range list {
		if s.ID == except.String() {
			continue
		}
		if s.Phase == PhaseRunning || s.Phase == PhaseBooting {
			n++
		}
	}
	return n, nil
}
