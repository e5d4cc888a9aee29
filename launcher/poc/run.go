package poc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/poc/report"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/launcher/residue"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// Options configure one poc run.
type Options struct {
	// Config is the node's microvm.toml, already loaded.
	Config *config.Config
	// Launcher is this slurm-microvm binary (its processes are watched).
	Launcher string
	// Users are the two test accounts (not root, distinct).
	Users [2]string
	// Image is what every job boots (`--microvm=IMAGE`): it needs a POSIX
	// shell with cat, dd, sleep, nproc, grep and sha256sum (busybox will do).
	Image string
	// Node is the node every job is pinned to (`-w`); the poc must run
	// on it, as root. Partition and Reservation are passed to sbatch when
	// set.
	Node, Partition, Reservation string
	// GRES is the GPU request for "all GPUs" (e.g. "gpu:2",
	// "gpu:standin:2"); "" : from the node's Gres, none: GPU checks skip.
	GRES string
	// ArrayTasks and BackToBack size the load checks (defaults 100, 20).
	ArrayTasks, BackToBack int
	// Only runs the checks whose id starts with one of these (all: nil).
	Only []string
	// Keep leaves the tenants' poc trees (job outputs) in place.
	Keep bool
	// TmpIgnore are glob patterns (path.Match) of names in /tmp and
	// /var/tmp that others make on this node while the poc runs; they are
	// not counted as left behind (the report lists them).
	TmpIgnore []string
	// Env is the environment of Slurm's commands (PATH, SLURM_CONF).
	Env []string
	// Version goes into the report.
	Version string
	// Out gets one line per check as it ends; Log the poc's own progress.
	Out io.Writer
	Log *slog.Logger
}

// run is one poc run's state.
type run struct {
	o       Options
	id      string // poc-<time>-<random>: job names, directories
	slurm   *Slurm
	tenants [2]*Tenant
	scope   residue.Scope
	unkill  time.Duration // Slurm's UnkillableStepTimeout
	rep     *report.Report
	log     *slog.Logger
	node    NodeInfo
	// jobLauncher is the launcher the plugin runs; faultsOn whether it
	// is an smv_faults build.
	jobLauncher string
	faultsOn    bool
	markers     map[string]tenantData

	mu     sync.Mutex
	jobs   []int           // every job submitted, for cleanup
	byName map[string]*job // the last job of each name
}

// checkFunc runs one check and fills c (Verdict, Reason, Evidence).
type checkFunc func(ctx context.Context, r *run, c *report.Check)

type checkDef struct {
	id, title string
	f         checkFunc
}

// checks are every check, in the order they run.
func checks() []checkDef {
	var out []checkDef
	out = append(out, isolationChecks()...)
	out = append(out, faultChecks()...)
	out = append(out, loadChecks()...)
	out = append(out, diagnosisChecks()...)
	return out
}

// CheckIDs lists every check id, in run order.
func CheckIDs() []string {
	var ids []string
	for _, c := range checks() {
		ids = append(ids, c.id)
	}
	return ids
}

// Run runs the proof and returns its report; err is for a run that could
// not begin (bad options, Slurm unreachable), not for failed checks.
// Everything the poc made (jobs, files under the users' homes) is removed
// before it returns, also when ctx is cancelled.
func Run(ctx context.Context, o Options) (*report.Report, error) {
	if o.ArrayTasks == 0 {
		o.ArrayTasks = 100
	}
	if o.BackToBack == 0 {
		o.BackToBack = 20
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("poc: run it as root on a node of the partition: it runs jobs as the two test accounts and inspects the node after each")
	}
	if o.Image == "" {
		return nil, errors.New("--image: required: an image with a POSIX shell and cat, dd, sleep, nproc, grep, sha256sum (e.g. docker://busybox)")
	}
	if o.Users[0] == "" || o.Users[1] == "" || o.Users[0] == o.Users[1] {
		return nil, fmt.Errorf("--users %s,%s: two distinct unprivileged test accounts are needed", o.Users[0], o.Users[1])
	}
	for _, p := range o.Only {
		if p == "" {
			return nil, fmt.Errorf("--checks: an empty entry would select every check; give check id prefixes, comma separated, e.g. isolation,fault.vmm")
		}
		if !slices.ContainsFunc(CheckIDs(), func(id string) bool { return strings.HasPrefix(id, p) }) {
			return nil, fmt.Errorf("--checks %q: no check id starts with it (ids: %s)", p, strings.Join(CheckIDs(), ", "))
		}
	}
	r := &run{o: o, slurm: &Slurm{Env: o.Env}, log: o.Log}
	var buf [4]byte
	_, _ = rand.Read(buf[:])
	r.id = fmt.Sprintf("poc-%d-%s", time.Now().Unix(), hex.EncodeToString(buf[:]))
	for i, name := range o.Users {
		t, err := LookupTenant(name, string(rune('A'+i)))
		if err != nil {
			return nil, err
		}
		r.tenants[i] = t
	}
	if a, b := r.tenants[0], r.tenants[1]; a.UID == b.UID || a.Home == b.Home {
		return nil, fmt.Errorf("--users %s,%s: the two accounts share a uid (%d, %d) or a home (%s, %s); the poc needs two tenants", a.Name, b.Name, a.UID, b.UID, a.Home, b.Home)
	}
	if o.GRES != "" {
		if _, _, err := gpuRequest(o.GRES); err != nil {
			return nil, err
		}
	}
	if o.Node == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--node: not given and no host name: %w", err)
		}
		o.Node, _, _ = strings.Cut(h, ".")
		r.o.Node = o.Node
	}
	node, err := r.slurm.Node(ctx, o.Node)
	if err != nil {
		return nil, fmt.Errorf("--node %s: %w", o.Node, err)
	}
	r.node = node
	if err := onThisHost(node); err != nil {
		return nil, fmt.Errorf("--node %s: %w: the poc inspects the node its jobs run on, so it runs there", o.Node, err)
	}
	if st, err := r.slurm.NodeState(ctx, o.Node); err != nil || Drained(st) {
		return nil, fmt.Errorf("--node %s: state %q (%v): the poc needs a node in service", o.Node, st, err)
	}
	uk, _ := r.slurm.ConfigValue(ctx, "UnkillableStepTimeout")
	r.unkill = parseSeconds(uk, 60*time.Second)
	cluster, _ := r.slurm.ConfigValue(ctx, "ClusterName")
	r.rep = &report.Report{
		Version: o.Version, Started: time.Now().UTC(), Cluster: cluster, Partition: o.Partition,
		Node: o.Node, Users: o.Users[:], Image: o.Image, Driver: o.Config.Driver,
		Accel: qemu.ResolveAccel(o.Config.QEMU.Accel), UnkillableStepTimeoutS: int(r.unkill / time.Second),
	}
	// The launcher the jobs run is the plugin's (plugstack.conf), which
	// need not be this binary: its processes are watched, its build
	// decides whether faults can be injected.
	if l := r.pluginLauncher(ctx); l != "" && l != r.o.Launcher {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("the jobs' launcher is %s (plugstack.conf), not this poc's binary %s", l, r.o.Launcher))
		r.jobLauncher = l
	} else {
		r.jobLauncher = r.o.Launcher
	}
	r.faultsOn, _ = hasFaults(r.jobLauncher)
	if r.faultsOn {
		r.rep.Notes = append(r.rep.Notes, "WARNING: the jobs' launcher "+r.jobLauncher+" is a test build with fault injection (smv_faults): never deploy it")
	} else {
		r.rep.Notes = append(r.rep.Notes, "the jobs' launcher is not an smv_faults build: the start-stage fault checks skip (a production binary cannot inject faults)")
	}
	r.scope = r.residueScope()
	if len(o.TmpIgnore) > 0 {
		r.rep.Notes = append(r.rep.Notes, "not counted as left behind: names in /tmp and /var/tmp matching "+strings.Join(o.TmpIgnore, ", "))
	}

	defer r.cleanup()
	if err := r.makeTrees(ctx); err != nil {
		return nil, err
	}
	for _, d := range checks() {
		if !r.selected(d.id) {
			continue
		}
		c := report.Check{ID: d.id, Group: strings.SplitN(d.id, ".", 2)[0], Title: d.title}
		if ctx.Err() != nil {
			c.Verdict, c.Reason = report.Skip, "interrupted"
			r.rep.Checks = append(r.rep.Checks, c)
			continue
		}
		t0 := time.Now()
		r.log.Info("check", "id", d.id)
		d.f(ctx, r, &c)
		if c.Verdict == "" {
			c.Verdict = report.Pass
		}
		if ctx.Err() != nil && c.Verdict == report.Fail {
			// What failed is the interruption, not the product.
			c.Verdict, c.Reason = report.Skip, "interrupted: "+c.Reason
		}
		c.DurationMS = time.Since(t0).Milliseconds()
		r.rep.Checks = append(r.rep.Checks, c)
		printCheck(o.Out, &c, r.rep.UnkillableStepTimeoutS)
	}
	r.rep.Finished = time.Now().UTC()
	return r.rep, nil
}

func printCheck(w io.Writer, c *report.Check, unkillableS int) {
	fmt.Fprintln(w, report.CheckLine(*c, unkillableS))
}

func (r *run) selected(id string) bool {
	if len(r.o.Only) == 0 {
		return true
	}
	return slices.ContainsFunc(r.o.Only, func(p string) bool { return strings.HasPrefix(id, p) })
}

// onThisHost checks that node is this machine: its NodeHostname (or
// name) is this host's short name, or its NodeAddr is one of this host's
// addresses.
func onThisHost(n NodeInfo) error {
	h, _ := os.Hostname()
	short, _, _ := strings.Cut(h, ".")
	for _, name := range []string{n.Hostname, n.Name} {
		if name != "" && (name == h || name == short) {
			return nil
		}
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.String() == n.Addr {
			return nil
		}
	}
	return fmt.Errorf("it is not this host (%s): NodeHostname %q, NodeAddr %q", h, n.Hostname, n.Addr)
}

// parseSeconds reads "60 sec" / "60" (scontrol show config) as seconds.
func parseSeconds(v string, def time.Duration) time.Duration {
	f := strings.Fields(v)
	if len(f) == 0 {
		return def
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 0 {
		return def
	}
	return time.Duration(n) * time.Second
}

// residueScope is what the poc's steps may leave on the node: the
// launcher's runtime, cache and scratch directories, the kept logs are
// not (they outlive steps by design), and the tenants' poc trees.
func (r *run) residueScope() residue.Scope {
	c := r.o.Config
	paths := []string{c.RuntimeDir, c.CacheDir}
	if c.Mounts.ScratchBase != "" {
		paths = append(paths, c.Mounts.ScratchBase)
	}
	for _, t := range r.tenants {
		paths = append(paths, r.treeOf(t))
	}
	return residue.Scope{
		Paths:      paths,
		RuntimeDir: c.RuntimeDir,
		Records:    []string{state.StoppedDir},
		TmpIgnore:  r.o.TmpIgnore,
		NoCmdlines: true,
		CacheDir:   c.CacheDir,
		Programs:   []string{filepath.Base(c.QEMU.Binary), "virtiofsd", r.o.Launcher, r.jobLauncher},
	}
}

// cleanup cancels every job the poc submitted that is still known to
// Slurm and removes the poc's trees; it runs on a fresh context so that
// an interrupted run still cleans up.
func (r *run) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r.mu.Lock()
	jobs := slices.Clone(r.jobs)
	r.mu.Unlock()
	for _, j := range jobs {
		if job, err := r.slurm.Job(ctx, j); err == nil && !terminal[job.State] {
			_ = r.slurm.Scancel(ctx, strconv.Itoa(j))
		}
	}
	for _, j := range jobs {
		if job, err := r.slurm.Job(ctx, j); err == nil && !terminal[job.State] {
			_, _ = r.slurm.WaitJob(ctx, j)
		}
	}
	for _, t := range r.tenants {
		if t != nil && r.o.Keep {
			r.log.Info("kept the poc's tree", "user", t.Name, "dir", r.treeOf(t))
		} else if t != nil {
			// As the tenant: the tree is the tenant's, root does not
			// walk it.
			_ = r.asUser(ctx, t, "", "rm", "-rf", "--", r.treeOf(t))
			_ = r.asUser(ctx, t, "", "rmdir", "--", filepath.Join(t.Home, PocDirName)) // only when empty
		}
	}
}
