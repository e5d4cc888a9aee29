package poc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"os/user"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Tenant is one of the two test accounts the poc runs jobs as.
type Tenant struct {
	Name  string
	UID   uint32
	GID   uint32
	Home  string
	cred  *syscall.Credential
	Label string // "A" or "B" in the report
}

// LookupTenant resolves name (a local account, not root) with its groups
// as initgroups(3) would set them. Errors name the account.
func LookupTenant(name, label string) (*Tenant, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("--users: %q is not a local account of this node (the poc runs its jobs as two existing unprivileged test accounts): %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("--users: %s: uid %q: %w", name, u.Uid, err)
	}
	if uid == 0 {
		return nil, fmt.Errorf("--users: %s has uid 0: the poc runs its jobs as two unprivileged test accounts", name)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("--users: %s: gid %q: %w", name, u.Gid, err)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("--users: groups of %s: %w", name, err)
	}
	var groups []uint32
	for _, s := range ids {
		g, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--users: %s: group id %q: %w", name, s, err)
		}
		groups = append(groups, uint32(g))
	}
	if u.HomeDir == "" || u.HomeDir == "/" {
		return nil, fmt.Errorf("--users: %s has no home directory: the poc keeps its files under each account's home", name)
	}
	return &Tenant{Name: name, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir, Label: label,
		cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}}, nil
}

// Slurm runs Slurm's commands for the poc: as root (scontrol, scancel,
// sinfo) or as a tenant (sbatch), with a fixed environment.
type Slurm struct {
	// Env is the environment of every command (PATH, SLURM_CONF, ...).
	Env []string
}

// Run runs name args... as t (nil: the caller, root) and returns stdout,
// stderr and the exit code; err only when it could not run or ctx ended.
func (s *Slurm) Run(ctx context.Context, t *Tenant, stdin, name string, args ...string) (string, string, int, error) {
	return s.RunEnv(ctx, t, nil, stdin, name, args...)
}

// RunEnv is Run with env added to the command's environment (sbatch
// propagates it to the job: Slurm sbatch(1) --export, default ALL).
func (s *Slurm) RunEnv(ctx context.Context, t *Tenant, env []string, stdin, name string, args ...string) (string, string, int, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(append([]string{}, s.Env...), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if t != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: t.cred}
		cmd.Dir = t.Home
		cmd.Env = append(cmd.Env, "HOME="+t.Home, "USER="+t.Name, "LOGNAME="+t.Name)
	}
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return o.String(), e.String(), -1, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), ctx.Err())
	case errors.As(err, &ee):
		return o.String(), e.String(), ee.ExitCode(), nil
	case err != nil:
		return o.String(), e.String(), -1, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return o.String(), e.String(), 0, nil
}

// root runs a root command whose non-zero exit is an error.
func (s *Slurm) root(ctx context.Context, name string, args ...string) (string, error) {
	out, errOut, code, err := s.Run(ctx, nil, "", name, args...)
	if err == nil && code != 0 {
		err = fmt.Errorf("%s %s: exit %d: %s", name, strings.Join(args, " "), code, strings.TrimSpace(errOut))
	}
	return out, err
}

// Sbatch submits script as t with `sbatch --parsable args...`, env added
// to its environment, and returns the job id.
func (s *Slurm) Sbatch(ctx context.Context, t *Tenant, env []string, script string, args ...string) (int, error) {
	out, errOut, code, err := s.RunEnv(ctx, t, env, script, "sbatch", append([]string{"--parsable"}, args...)...)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errOut))
	}
	if err != nil {
		return 0, fmt.Errorf("sbatch as %s: %w", t.Name, err)
	}
	idText, _, _ := strings.Cut(strings.TrimSpace(out), ";")
	id, err := strconv.Atoi(idText)
	if err != nil {
		return 0, fmt.Errorf("sbatch as %s: job id from %q: %w", t.Name, out, err)
	}
	return id, nil
}

// Job is what slurmctld says of a job (`scontrol show job -o`), kept for
// MinJobAge (default 300 s) after it ends.
type Job struct {
	ID int
	// State is the base JobState: PENDING, RUNNING, COMPLETED, FAILED,
	// CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, ...
	State string
	// ExitCode is "status:signal" of the batch script or the job's first
	// failing step, e.g. "0:0", "3:0", "0:9".
	ExitCode string
	// Reason is Slurm's pending or failure reason ("None" when none).
	Reason string
	// StdOut is the batch job's output file.
	StdOut   string
	Restarts int
	// Raw is the record's line.
	Raw string
}

var jobField = regexp.MustCompile(`(?:^|\s)(JobState|ExitCode|Reason|StdOut|Restarts)=(\S*)`)

// terminal are the states a job never leaves (squeue(1) JOB STATE CODES,
// without the transient COMPLETING).
var terminal = map[string]bool{
	"COMPLETED": true, "FAILED": true, "CANCELLED": true, "TIMEOUT": true,
	"OUT_OF_MEMORY": true, "NODE_FAIL": true, "PREEMPTED": true,
	"BOOT_FAIL": true, "DEADLINE": true, "REVOKED": true,
}

// Terminal reports whether a job in state never leaves it.
func Terminal(state string) bool { return terminal[state] }

// ParseJob reads job id's record from `scontrol show job -o ID` output
// (its first line: an array job's first task); an error when it has no
// JobState.
func ParseJob(id int, out string) (Job, error) {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	j := Job{ID: id, Raw: line}
	for _, m := range jobField.FindAllStringSubmatch(line, -1) {
		switch m[1] {
		case "JobState":
			j.State = m[2]
		case "ExitCode":
			j.ExitCode = m[2]
		case "Reason":
			j.Reason = m[2]
		case "StdOut":
			j.StdOut = m[2]
		case "Restarts":
			j.Restarts, _ = strconv.Atoi(m[2])
		}
	}
	if j.State == "" {
		return j, fmt.Errorf("scontrol show job %d: no JobState in %q", id, line)
	}
	return j, nil
}

// Job reads job id.
func (s *Slurm) Job(ctx context.Context, id int) (Job, error) {
	out, err := s.root(ctx, "scontrol", "show", "job", "-o", strconv.Itoa(id))
	if err != nil {
		return Job{}, err
	}
	return ParseJob(id, out)
}

// WaitJob polls job id until its state is one of states (none: any
// terminal state), bounded by ctx.
func (s *Slurm) WaitJob(ctx context.Context, id int, states ...string) (Job, error) {
	return PollJob(ctx, id, 200*time.Millisecond, func(ctx context.Context) (Job, error) { return s.Job(ctx, id) }, states...)
}

// PollJob calls read every poll until the job's state is one of states
// (none: any terminal state) and returns it; it fails early when the job
// ends in a state not in states, and when ctx ends.
func PollJob(ctx context.Context, id int, poll time.Duration, read func(context.Context) (Job, error), states ...string) (Job, error) {
	want := func(st string) bool {
		if len(states) == 0 {
			return terminal[st]
		}
		return slices.Contains(states, st)
	}
	var last Job
	for {
		j, err := read(ctx)
		if err != nil {
			return last, fmt.Errorf("wait for job %d: %w", id, err)
		}
		last = j
		if want(j.State) {
			return j, nil
		}
		if terminal[j.State] {
			return j, fmt.Errorf("wait for job %d to be %v: it ended %s (exit %s, reason %s)", id, states, j.State, j.ExitCode, j.Reason)
		}
		select {
		case <-ctx.Done():
			return j, fmt.Errorf("wait for job %d (last state %s): %w", id, j.State, ctx.Err())
		case <-time.After(poll):
		}
	}
}

// Scancel runs scancel args... as root.
func (s *Slurm) Scancel(ctx context.Context, args ...string) error {
	_, err := s.root(ctx, "scancel", args...)
	return err
}

// NodeState is the node's state as sinfo prints it (%T, e.g. "idle",
// "mixed", "drained").
func (s *Slurm) NodeState(ctx context.Context, node string) (string, error) {
	out, err := s.root(ctx, "sinfo", "-h", "-N", "-n", node, "-o", "%T")
	if err != nil {
		return "", err
	}
	st, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	return st, nil
}

// Drained reports whether a node state (sinfo %T) takes the node out of
// service: drained, draining, down, fail (Slurm sinfo(1) NODE STATE CODES).
func Drained(state string) bool {
	st := strings.TrimRight(strings.ToLower(state), "*~#!%$@^-")
	for _, bad := range []string{"drain", "down", "fail"} {
		if strings.Contains(st, bad) {
			return true
		}
	}
	return false
}

// ConfigValue reads one key of `scontrol show config` ("" when absent).
func (s *Slurm) ConfigValue(ctx context.Context, key string) (string, error) {
	out, err := s.root(ctx, "scontrol", "show", "config")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, "=")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), nil
		}
	}
	return "", nil
}

// NodeInfo is what the poc needs of its node (`scontrol show node -o`).
type NodeInfo struct {
	Name     string
	Hostname string // NodeHostname
	Addr     string // NodeAddr
	CPUs     int
	MemMiB   int    // RealMemory
	Gres     string // e.g. "gpu:fake:2,gpu:standin:2"
}

var nodeField = regexp.MustCompile(`(?:^|\s)(NodeName|NodeHostName|NodeAddr|CPUTot|RealMemory|Gres)=(\S*)`)

// Node reads node name's record.
func (s *Slurm) Node(ctx context.Context, name string) (NodeInfo, error) {
	out, err := s.root(ctx, "scontrol", "show", "node", "-o", name)
	if err != nil {
		return NodeInfo{}, err
	}
	var n NodeInfo
	for _, m := range nodeField.FindAllStringSubmatch(out, -1) {
		switch m[1] {
		case "NodeName":
			n.Name = m[2]
		case "NodeHostName":
			n.Hostname = m[2]
		case "NodeAddr":
			n.Addr = m[2]
		case "CPUTot":
			n.CPUs, _ = strconv.Atoi(m[2])
		case "RealMemory":
			n.MemMiB, _ = strconv.Atoi(m[2])
		case "Gres":
			if m[2] != "(null)" {
				n.Gres = m[2]
			}
		}
	}
	if n.Name == "" {
		return n, fmt.Errorf("scontrol show node %s: no such node", name)
	}
	return n, nil
}

// StepPids lists the pids of job's step (`scontrol listpids JOB.STEP`,
// run on the node).
func (s *Slurm) StepPids(ctx context.Context, job, step int) ([]int, error) {
	out, err := s.root(ctx, "scontrol", "listpids", fmt.Sprintf("%d.%d", job, step))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, line := range strings.Split(out, "\n")[1:] {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if p, err := strconv.Atoi(f[0]); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}
