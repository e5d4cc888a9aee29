// Package pmi rewrites a Slurm task's PMI environment for a rank that runs
// inside a microVM, and tells whether a step's ranks can reach PMI at all.
//
// Slurm gives each task either PMIx (srun --mpi=pmix: a PMIx server in
// slurmstepd, reached through PMIX_SERVER_URI*) or PMI-2 (srun --mpi=pmi2:
// an inherited socket whose number is in PMI_FD). Both endpoints live on
// the host. The exec process relays them over the agent channel; the agent
// gives the rank a local endpoint in the guest, and the functions here
// compute the rank's environment for that endpoint. They are pure: no I/O,
// the input slice is never modified.
//
// Facts these rules encode (measured with Slurm 22.05, PMIx 4.2, Open MPI
// 4.1, MPICH 4.0 and a byte relay between namespaces):
//   - PMIx: the task's five PMIX_SERVER_URI2, URI21, URI3, URI4 and URI41
//     hold the same "pmix-server.<pid>;tcp4://127.0.0.1:<port>", and PMIx
//     4.2 clients read only URI41: all five are rewritten to the guest
//     listener, keeping the "<name>;" prefix (the server's nspace.rank the
//     client greets). PMIX_NAMESPACE and PMIX_RANK stay. The shared-memory
//     data store (gds ds12/ds21) lives in host files the guest cannot map:
//     PMIX_MCA_gds=hash makes the client ask the server instead, and the
//     PMIX_DSTORE_* paths are dropped. PMIX_SERVER_TMPDIR and
//     PMIX_SYSTEM_TMPDIR name host directories: rewritten to a guest
//     directory when one is given, else dropped.
//   - PMI-2: PMI_FD becomes the guest's descriptor number. PMI_RANK and
//     PMI_SIZE are mandatory: without them MPICH silently runs every rank
//     as a singleton and exits 0.
package pmi

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Kind is the PMI flavour Slurm set up for a task.
type Kind string

// The kinds.
const (
	KindNone Kind = "none"
	KindPMIx Kind = "pmix"
	KindPMI2 Kind = "pmi2"
)

// URIVars are the PMIx server URI variables a PMIx server exports, one per
// protocol generation; PMIx 4.2 clients read URI41, older ones the others.
var URIVars = []string{"PMIX_SERVER_URI2", "PMIX_SERVER_URI21", "PMIX_SERVER_URI3", "PMIX_SERVER_URI4", "PMIX_SERVER_URI41"}

// Errors, matched with errors.Is.
var (
	// ErrNoPMI: a step with more than one task has no PMI in its
	// environment; its ranks would each start as a singleton.
	ErrNoPMI = errors.New("no PMI reaches the ranks")
	// ErrBadEnv: the PMI variables Slurm set are incomplete or malformed.
	ErrBadEnv = errors.New("malformed PMI environment")
)

// Info describes the PMI of one task, read from its environment.
type Info struct {
	Kind Kind
	// PMIx: the server's name ("pmix-server.1234" before ';'), and its
	// address on the host (Network "tcp4"/"tcp6"/"tcp", Address
	// "127.0.0.1:41235") as the relay must dial it.
	ServerName string
	Network    string
	Address    string
	// PMI-2: the host descriptor number (PMI_FD), rank and size.
	FD         int
	Rank, Size int
}

// lookup returns the value of key in env (the last one wins, as in
// os/exec) and whether it is set.
func lookup(env []string, key string) (string, bool) {
	v, ok := "", false
	for _, kv := range env {
		if k, val, found := strings.Cut(kv, "="); found && k == key {
			v, ok = val, true
		}
	}
	return v, ok
}

// Detect reads which PMI Slurm gave a task. PMIx wins when both are
// present (Slurm sets only one). It fails with ErrBadEnv when the
// variables of the detected kind are incomplete: PMIx without
// PMIX_NAMESPACE/PMIX_RANK or with an unparsable URI, PMI-2 without
// PMI_RANK/PMI_SIZE or with a non-numeric PMI_FD.
func Detect(env []string) (Info, error) {
	if uri, ok := pmixURI(env); ok {
		info := Info{Kind: KindPMIx}
		if _, ok := lookup(env, "PMIX_NAMESPACE"); !ok {
			return info, fmt.Errorf("%w: PMIX_SERVER_URI* is set but PMIX_NAMESPACE is not", ErrBadEnv)
		}
		if _, ok := lookup(env, "PMIX_RANK"); !ok {
			return info, fmt.Errorf("%w: PMIX_SERVER_URI* is set but PMIX_RANK is not", ErrBadEnv)
		}
		name, network, addr, err := ParseServerURI(uri)
		if err != nil {
			return info, err
		}
		info.ServerName, info.Network, info.Address = name, network, addr
		return info, nil
	}
	if fdS, ok := lookup(env, "PMI_FD"); ok {
		info := Info{Kind: KindPMI2}
		fd, err := strconv.Atoi(fdS)
		if err != nil || fd < 0 {
			return info, fmt.Errorf("%w: PMI_FD=%q is not a descriptor number", ErrBadEnv, fdS)
		}
		info.FD = fd
		if info.Rank, err = intVar(env, "PMI_RANK"); err != nil {
			return info, err
		}
		if info.Size, err = intVar(env, "PMI_SIZE"); err != nil {
			return info, err
		}
		return info, nil
	}
	return Info{Kind: KindNone}, nil
}

func intVar(env []string, key string) (int, error) {
	s, ok := lookup(env, key)
	if !ok {
		return 0, fmt.Errorf("%w: PMI_FD is set but %s is not (without it every rank runs as a singleton)", ErrBadEnv, key)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: %s=%q is not a non-negative number", ErrBadEnv, key, s)
	}
	return n, nil
}

// pmixURI returns the newest server URI set (URI41 first).
func pmixURI(env []string) (string, bool) {
	for i := len(URIVars) - 1; i >= 0; i-- {
		if v, ok := lookup(env, URIVars[i]); ok && v != "" {
			return v, true
		}
	}
	return "", false
}

// ParseServerURI splits a PMIx server URI "pmix-server.1234;tcp4://127.0.0.1:41235"
// into the server name, the network for net.Dial ("tcp4", "tcp6") and the
// address. Only TCP URIs can be relayed (a PMIx usock path would be a host
// file).
func ParseServerURI(uri string) (name, network, addr string, err error) {
	name, rest, ok := strings.Cut(uri, ";")
	if !ok || name == "" {
		return "", "", "", fmt.Errorf("%w: PMIx server URI %q has no \"<name>;\" prefix", ErrBadEnv, uri)
	}
	u, perr := url.Parse(rest)
	if perr != nil || u.Host == "" {
		return "", "", "", fmt.Errorf("%w: PMIx server URI %q: %q is not scheme://host:port", ErrBadEnv, uri, rest)
	}
	switch u.Scheme {
	case "tcp4", "tcp6", "tcp":
	default:
		return "", "", "", fmt.Errorf("%w: PMIx server URI %q: scheme %q cannot be relayed (want tcp4 or tcp6)", ErrBadEnv, uri, u.Scheme)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return "", "", "", fmt.Errorf("%w: PMIx server URI %q: %v", ErrBadEnv, uri, err)
	}
	return name, u.Scheme, u.Host, nil
}

// PMIxGuest is the guest side of a PMIx relay.
type PMIxGuest struct {
	// URI is the guest listener as a PMIx URI without the name prefix:
	// "tcp4://127.0.0.1:38001".
	URI string
	// TmpDir replaces PMIX_SERVER_TMPDIR and PMIX_SYSTEM_TMPDIR (a guest
	// directory the rank can write); empty drops them.
	TmpDir string
}

// RewritePMIx returns env with the PMIx variables rewritten for a rank in
// the guest (see the package doc): every PMIX_SERVER_URI* points to g.URI
// with its "<name>;" prefix kept, PMIX_MCA_gds=hash, PMIX_DSTORE_* dropped,
// the tmpdirs rewritten or dropped, everything else (PMIX_NAMESPACE,
// PMIX_RANK, ...) kept in place. It fails with ErrBadEnv when a URI
// variable is malformed or g.URI is not a tcp URI.
func RewritePMIx(env []string, g PMIxGuest) ([]string, error) {
	if _, _, _, err := ParseServerURI("guest;" + g.URI); err != nil {
		return nil, fmt.Errorf("guest PMIx listener: %w", err)
	}
	isURI := map[string]bool{}
	for _, k := range URIVars {
		isURI[k] = true
	}
	out := make([]string, 0, len(env)+1)
	gdsSet := false
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case isURI[k]:
			name, _, ok := strings.Cut(v, ";")
			if !ok || name == "" {
				return nil, fmt.Errorf("%w: %s=%q has no \"<name>;\" prefix", ErrBadEnv, k, v)
			}
			out = append(out, k+"="+name+";"+g.URI)
		case strings.HasPrefix(k, "PMIX_DSTORE_"):
			// host shared-memory store: unreachable from the guest
		case k == "PMIX_SERVER_TMPDIR" || k == "PMIX_SYSTEM_TMPDIR":
			if g.TmpDir != "" {
				out = append(out, k+"="+g.TmpDir)
			}
		case k == "PMIX_MCA_gds":
			if !gdsSet {
				out = append(out, "PMIX_MCA_gds=hash")
				gdsSet = true
			}
		default:
			out = append(out, kv)
		}
	}
	if !gdsSet {
		out = append(out, "PMIX_MCA_gds=hash")
	}
	return out, nil
}

// RewritePMI2 returns env with PMI_FD set to guestFD, the rank's
// descriptor in the guest. PMI_RANK and PMI_SIZE must be present and
// numeric (ErrBadEnv otherwise).
func RewritePMI2(env []string, guestFD int) ([]string, error) {
	if guestFD < 0 {
		return nil, fmt.Errorf("%w: guest PMI_FD %d is negative", ErrBadEnv, guestFD)
	}
	if _, ok := lookup(env, "PMI_FD"); !ok {
		return nil, fmt.Errorf("%w: PMI_FD is not set (the step was not started with srun --mpi=pmi2)", ErrBadEnv)
	}
	if _, err := intVar(env, "PMI_RANK"); err != nil {
		return nil, err
	}
	if _, err := intVar(env, "PMI_SIZE"); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == "PMI_FD" {
			out = append(out, "PMI_FD="+strconv.Itoa(guestFD))
			continue
		}
		out = append(out, kv)
	}
	return out, nil
}

// Require fails with ErrNoPMI when a step of ntasks tasks (SLURM_NTASKS,
// all nodes) has no PMI in the task environment env, so the launcher can
// refuse before starting N singletons; a malformed PMI environment fails
// with ErrBadEnv. One task needs no PMI (an MPI singleton runs alone).
func Require(ntasks int, env []string) (Info, error) {
	info, err := Detect(env)
	if err != nil {
		return info, err
	}
	if info.Kind == KindNone && ntasks > 1 {
		return info, fmt.Errorf("%w: the step has %d tasks but neither PMIX_SERVER_URI* nor PMI_FD is set, so each rank would run as a singleton: start it with srun --mpi=pmix (Open MPI) or --mpi=pmi2 (MPICH)", ErrNoPMI, ntasks)
	}
	return info, nil
}

// StepTasks returns the step's total task count from the task environment
// (SLURM_STEP_NUM_TASKS, else SLURM_NTASKS), 0 when neither is a number.
func StepTasks(env []string) int {
	for _, k := range []string{"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"} {
		if s, ok := lookup(env, k); ok {
			if n, err := strconv.Atoi(s); err == nil && n >= 0 {
				return n
			}
		}
	}
	return 0
}
