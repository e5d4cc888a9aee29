package cluster

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/poc"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

//go:embed up.sh
var upScript []byte

//go:embed down.sh
var downScript []byte

const (
	// BaseDir holds the state directories of test clusters and the lock.
	BaseDir = "/run/slurm-microvm-test"
	// DefaultDir is the state directory Up uses when Options.Dir is empty.
	// It is fixed on purpose: up.sh stops whatever a previous run recorded
	// there, so daemons left by a test binary killed on timeout do not block
	// the next run.
	DefaultDir = BaseDir + "/e2e"
	// LockFile is flocked (exclusive) by Up for the life of the cluster.
	LockFile = BaseDir + "/e2e.lock"
	// TestUser is the unprivileged user up.sh creates (useradd -m) for
	// end-to-end tests.
	TestUser = "microvmtest"
	// DefaultCommandTimeout bounds Run, Srun, Sbatch, Squeue, Scancel and
	// WaitJob when their context has no deadline.
	DefaultCommandTimeout = 2 * time.Minute
	// cleanPath is the PATH of every command run against the cluster.
	cleanPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// prerequisites are the commands up.sh and the helpers need; CI installs
// them with hack/setup-debian.sh (packages slurm-wlm, munge, iproute2, passwd,
// util-linux).
var prerequisites = []string{
	"bash", "munged", "munge", "unmunge", "slurmctld", "slurmd", "srun", "sbatch",
	"squeue", "scancel", "scontrol", "sinfo", "useradd", "setsid", "ss",
}

// twoNodePrerequisites are what Options.Nodes == 2 needs besides
// prerequisites (packages iproute2, util-linux, coreutils).
var twoNodePrerequisites = []string{"ip", "nsenter", "setpriv", "md5sum"}

// ociPrerequisites are what Options.OCIRuntime needs besides
// prerequisites (packages runc and crun; the bench and its test switch
// between the two).
var ociPrerequisites = []string{"runc", "crun", "mount", "umount"}

// accountingPrerequisites are what Options.Accounting needs besides
// prerequisites (packages mariadb-server and slurmdbd).
var accountingPrerequisites = []string{
	"mariadbd", "mariadb-install-db", "mariadb", "slurmdbd", "sacctmgr", "sacct", "sshare",
}

// Options tune Up. The zero value is a plain cluster in DefaultDir.
type Options struct {
	// Dir is the state directory: absolute, short (the munge socket path
	// must fit in 100 bytes), its parents searchable by everyone (so not
	// under t.TempDir(), which is 0700). Empty means DefaultDir.
	Dir string
	// FakeGPUs, when > 0, creates /dev/fakegpu0..N-1 (char 195:i) and
	// declares Gres=gpu:fake:N.
	FakeGPUs int
	// StandinGPUs, when > 0, creates StandinGPUs more such devices
	// (/dev/fakegpuN..) and declares them Gres=gpu:standin:M: the e2e
	// build of the launcher boots their steps without VFIO.
	StandinGPUs int
	// PlugstackLine is written as plugstack.conf (may hold several lines),
	// e.g. "required /usr/lib/slurm-microvm/spank_microvm.so".
	PlugstackLine string
	// ConfExtra lines are appended to slurm.conf; they must not repeat a key
	// up.sh writes.
	ConfExtra string
	// Env holds extra NAME=value settings for up.sh (SLURMCTLD_PORT,
	// SLURMD_PORT, SLURM_DEBUG, REAL_MEMORY, NODE_NAME,
	// SELECT_TYPE_PARAMETERS).
	Env []string
	// StartTimeout bounds the wait for the node to be idle; 0 means 60 s.
	StartTimeout time.Duration
	// LockTimeout bounds the wait for another test's cluster to go away;
	// 0 means 5 min.
	LockTimeout time.Duration
	// Nodes is the number of slurmd "nodes": 0 or 1 is the one-node
	// cluster (NodeAddr=127.0.0.1, in the caller's network namespace); 2
	// is two-node mode (up.sh NODES=2): two slurmd (multiple-slurmd) in
	// network namespaces of their own on a private bridge, slurmctld and
	// every client in a third. See doc.go.
	Nodes int
	// NodeNames are the two node names in two-node mode (default n1, n2);
	// lower-case letters and digits, at most 16 bytes. Ignored with one
	// node (NODE_NAME in Env names that one).
	NodeNames []string
	// Accounting starts a private MariaDB (datadir, socket and pid file
	// under Dir/db, no TCP) and slurmdbd (port 6819 on loopback, or
	// SLURMDBD_PORT in Env), registers the cluster, and configures
	// AccountingStorageType=accounting_storage/slurmdbd with
	// AccountingStorageTRES=gres/gpu and
	// AccountingStorageEnforce=associations,limits,qos (up.sh ACCOUNTING=1).
	// Only root, and users given an association with sacctmgr, may then
	// submit jobs. Down stops both and drops the database with Dir.
	Accounting bool
	// OCIRuntime, "runc" or "crun", turns on Slurm's own containers
	// (`srun --container=BUNDLE`): up.sh writes OCIConf(OCIRuntime) as
	// Dir/etc/oci.conf and prepares the host for the test user's
	// rootless runtime (up.sh OCI_CONF; see doc.go). Empty: no oci.conf,
	// and Slurm ignores --container. SetOCIRuntime switches it later.
	OCIRuntime string
}

// ociRuntimes are the runtimes OCIConf knows, each with the form of its
// `run` operation in Slurm's oci.conf examples (Slurm 22.05 containers
// guide, "oci.conf example for runc/crun using run (recommended over
// using create/start)"): runc takes the bundle after the id, crun before.
var ociRuntimes = map[string]string{
	"runc": "run %n.%u.%j.%s.%t -b %b",
	"crun": "run --bundle %b %n.%u.%j.%s.%t",
}

// OCIConf is the oci.conf Slurm 22.05's containers guide gives for runtime
// ("runc" or "crun") with its run operation: rootless, its state under
// the step user's /run/user/<uid>/, each container named
// node.user.job.step.task. One change, forced: the guide writes that
// directory /run/user/%U/, but Slurm 22.05.8's slurmstepd has no %U (it
// dies with "fatal: _generate_pattern: unexpected replacement character:
// U", seen on this cluster; %U came with 23.02), so it is
// /run/user/$(id -u %u)/: Slurm runs every pattern with /bin/sh -c and %u
// is the step user's name, so it is the same directory whether the user
// (RunTimeRun) or slurmstepd as root (the query, kill and delete of the
// clean-up) runs it. Slurm 22.05 knows ContainerPath, CreateEnvFile and
// the RunTime* patterns only (EnvExclude, RunTimeEnvExclude and
// IgnoreFileConfigJson of later guides came later); every step's
// slurmstepd reads the file anew. Errors: an unknown runtime.
func OCIConf(runtime string) (string, error) {
	run, ok := ociRuntimes[runtime]
	if !ok {
		return "", fmt.Errorf("cluster: OCI runtime %q: want runc or crun", runtime)
	}
	base := runtime + " --rootless=true --root=/run/user/$(id -u %u)/"
	return fmt.Sprintf(`# Written by slurm-microvm test/cluster: Slurm 22.05's example for %[1]s
# using run, with /run/user/$(id -u %%u)/ for /run/user/%%U/ (22.05.8 has no %%U).
RunTimeQuery="%[2]s state %%n.%%u.%%j.%%s.%%t"
RunTimeKill="%[2]s kill -a %%n.%%u.%%j.%%s.%%t"
RunTimeDelete="%[2]s delete --force %%n.%%u.%%j.%%s.%%t"
RunTimeRun="%[2]s %[3]s"
`, runtime, base, run), nil
}

// SetOCIRuntime replaces Dir/etc/oci.conf by OCIConf(runtime), renamed
// into place: the next step's slurmstepd reads it (each step's does),
// with no restart of slurmd. Errors: an unknown runtime, a cluster
// started without Options.OCIRuntime (its host is not prepared), or the
// write.
func (c *Cluster) SetOCIRuntime(runtime string) error {
	conf, err := OCIConf(runtime)
	if err != nil {
		return err
	}
	path := filepath.Join(c.Dir, "etc", "oci.conf")
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("cluster: set the OCI runtime to %s: %w (start the cluster with Options.OCIRuntime)", runtime, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(conf), 0o644); err != nil {
		return fmt.Errorf("cluster: set the OCI runtime to %s: %w", runtime, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("cluster: set the OCI runtime to %s: %w", runtime, err)
	}
	return nil
}

// Cluster is a running test cluster. Its methods are safe for concurrent use.
type Cluster struct {
	// Dir is the state directory; Conf is Dir/etc/slurm.conf.
	Dir, Conf string
	// Node is the node name (hostname -s unless NODE_NAME was given); in
	// two-node mode the first node (see Nodes).
	Node string
	// CgroupVersion is 1 or 2, as up.sh configured cgroup.conf.
	CgroupVersion int
	// Accounting tells whether slurmdbd and MariaDB run (Options.Accounting).
	Accounting bool
	// StartupTime is the wall time of up.sh: munge key, munged, (MariaDB
	// with its install-db, slurmdbd, the cluster's record,) slurmctld,
	// slurmd, until sinfo shows the node idle.
	StartupTime time.Duration
	// UpOutput is what up.sh printed.
	UpOutput string

	scripts string
	// Two-node mode only (empty otherwise): the node names in order, the
	// controller's namespace and address, and each node's.
	nodes   []string
	ctlNS   string
	ctlAddr string
	nodeNS  map[string]string
	addr    map[string]string
}

// NetNSDir is where up.sh's network namespaces are (ip netns add).
const NetNSDir = "/run/netns"

// Up starts a cluster for t and registers its teardown with t.Cleanup (on
// failure the tails of the daemon logs are logged first). It skips t when not
// root; when a prerequisite command is missing it skips t, or fails it when
// the environment says CI=true (CI installs them with hack/setup-debian.sh).
// Any failure of up.sh fails t with up.sh's output, which ends with the
// daemons' logs.
func Up(t testing.TB, opts Options) *Cluster {
	t.Helper()
	prereq.Root(t, "cluster: slurmd, munged, cgroups; run the tests as root")
	var missing []string
	if opts.Nodes < 0 || opts.Nodes > 2 {
		t.Fatalf("cluster: Options.Nodes = %d: want 0 or 1 (one node) or 2 (two-node mode)", opts.Nodes)
	}
	if opts.Nodes == 2 && len(opts.NodeNames) != 0 && len(opts.NodeNames) != 2 {
		t.Fatalf("cluster: Options.NodeNames %q: want none (n1, n2) or two names", opts.NodeNames)
	}
	need := append([]string{}, prerequisites...)
	var ociConf string
	if opts.OCIRuntime != "" {
		var err error
		if ociConf, err = OCIConf(opts.OCIRuntime); err != nil {
			t.Fatalf("cluster: Options.OCIRuntime: %v", err)
		}
		need = append(need, ociPrerequisites...)
	}
	if opts.Accounting {
		need = append(need, accountingPrerequisites...)
	}
	if opts.Nodes == 2 {
		need = append(need, twoNodePrerequisites...)
	}
	for _, p := range need {
		if _, ok := lookClean(p); !ok {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("cluster: missing %s (install with hack/setup-debian.sh)", strings.Join(missing, ", "))
		prereq.Missing(t, "%s", msg)
	}
	dir := opts.Dir
	if dir == "" {
		dir = DefaultDir
	}
	if !filepath.IsAbs(dir) {
		t.Fatalf("cluster: Options.Dir %q must be absolute", dir)
	}
	// srun run as TestUser reads slurm.conf and the munge socket under dir.
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o001 == 0 {
			t.Fatalf("cluster: Options.Dir %q: %s is not searchable by other users (mode %v); the test user needs it", dir, p, fi.Mode().Perm())
		}
		if p == "/" {
			break
		}
	}
	startTimeout := opts.StartTimeout
	if startTimeout <= 0 {
		startTimeout = 60 * time.Second
	}
	lockTimeout := opts.LockTimeout
	if lockTimeout <= 0 {
		lockTimeout = 5 * time.Minute
	}

	unlock, err := lock(t, lockTimeout)
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	t.Cleanup(unlock) // cleanups run last-in first-out: after Down
	scripts := t.TempDir()
	for name, body := range map[string][]byte{"up.sh": upScript, "down.sh": downScript} {
		if err := os.WriteFile(filepath.Join(scripts, name), body, 0o755); err != nil {
			t.Fatalf("cluster: write %s: %v", name, err)
		}
	}
	c := &Cluster{Dir: dir, Conf: filepath.Join(dir, "etc", "slurm.conf"), scripts: scripts}
	t.Cleanup(func() {
		if t.Failed() {
			logs := []string{"slurmctld.log"}
			if len(c.nodes) == 0 {
				logs = append(logs, "slurmd.log")
			}
			for _, n := range c.nodes {
				logs = append(logs, "slurmd-"+n+".log")
			}
			if opts.Accounting {
				logs = append(logs, "slurmdbd.log", "mariadbd.out")
			}
			for _, name := range logs {
				t.Logf("cluster: last lines of %s:\n%s", name, c.LogTail(name, 40))
			}
		}
		if err := c.Down(); err != nil {
			t.Errorf("cluster: %v", err)
		}
	})

	// The daemons inherit this: no SLURM_* of an enclosing job or cluster.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"PATH="+cleanPath, // sbin too, whatever PATH the test runs with
		"FAKE_GPUS="+strconv.Itoa(opts.FakeGPUs),
		"STANDIN_GPUS="+strconv.Itoa(opts.StandinGPUs),
		"PLUGSTACK_LINE="+opts.PlugstackLine,
		"SLURM_CONF_EXTRA="+opts.ConfExtra,
		"UP_TIMEOUT="+strconv.Itoa(int(startTimeout.Seconds())),
		"TEST_USER="+TestUser,
		"ACCOUNTING="+map[bool]string{false: "0", true: "1"}[opts.Accounting],
		"OCI_CONF="+ociConf,
	)
	if opts.Nodes == 2 {
		env = append(env, "NODES=2")
		if len(opts.NodeNames) == 2 {
			env = append(env, "NODE_NAMES="+strings.Join(opts.NodeNames, " "))
		}
	}
	env = append(env, opts.Env...)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout+30*time.Second)
	defer cancel()
	bash, _ := lookClean("bash")
	cmd := exec.CommandContext(ctx, bash, filepath.Join(scripts, "up.sh"), dir)
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	c.StartupTime = time.Since(start)
	c.UpOutput = string(out)
	if err != nil {
		t.Fatalf("cluster: up.sh %s: %v\n%s", dir, err, out)
	}
	if err := c.readEnv(); err != nil {
		t.Fatalf("cluster: %v", err)
	}
	return c
}

// lookClean finds name (without a slash) in cleanPath, the PATH every command
// against the cluster runs with, whatever PATH the test process has (sudo and
// CI shells often lack the sbin directories). Names with a slash, and names
// not found, come back unchanged with false.
func lookClean(name string) (string, bool) {
	if strings.Contains(name, "/") {
		return name, false
	}
	for _, dir := range filepath.SplitList(cleanPath) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return name, false
}

// readEnv fills Node, CgroupVersion and Accounting from Dir/env, and in
// two-node mode the nodes and namespaces from Dir/net.
func (c *Cluster) readEnv() error {
	b, err := os.ReadFile(filepath.Join(c.Dir, "env"))
	if err != nil {
		return fmt.Errorf("read cluster env: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			continue
		}
		switch k {
		case "SLURM_MICROVM_TEST_NODE":
			c.Node = v
		case "SLURM_MICROVM_TEST_CGROUP":
			c.CgroupVersion, _ = strconv.Atoi(strings.TrimPrefix(v, "v"))
		case "SLURM_MICROVM_TEST_ACCOUNTING":
			c.Accounting = v == "1"
		}
	}
	if c.Node == "" || c.CgroupVersion == 0 {
		return fmt.Errorf("read cluster env %s: no node name or cgroup version", c.Dir)
	}
	return c.readNet()
}

// readNet reads Dir/net ("KIND NETNS ADDR NODE" lines, up.sh NODES=2);
// no such file is the one-node cluster.
func (c *Cluster) readNet() error {
	b, err := os.ReadFile(filepath.Join(c.Dir, "net"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read cluster network: %w", err)
	}
	c.nodeNS, c.addr = map[string]string{}, map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			return fmt.Errorf("read cluster network %s: bad line %q, want KIND NETNS ADDR NODE", filepath.Join(c.Dir, "net"), line)
		}
		switch f[0] {
		case "ctl":
			c.ctlNS, c.ctlAddr = filepath.Join(NetNSDir, f[1]), f[2]
		case "node":
			c.nodes = append(c.nodes, f[3])
			c.nodeNS[f[3]] = filepath.Join(NetNSDir, f[1])
			c.addr[f[3]] = f[2]
		}
	}
	if c.ctlNS == "" || len(c.nodes) != 2 {
		return fmt.Errorf("read cluster network %s: want a ctl line and two node lines", filepath.Join(c.Dir, "net"))
	}
	return nil
}

// Nodes are the cluster's node names in slurm.conf order: [Node] for the
// one-node cluster, two names in two-node mode.
func (c *Cluster) Nodes() []string {
	if len(c.nodes) == 0 {
		return []string{c.Node}
	}
	return append([]string(nil), c.nodes...)
}

// TwoNode tells whether the cluster runs in two-node mode (Options.Nodes).
func (c *Cluster) TwoNode() bool { return len(c.nodes) != 0 }

// NodeNetNS is the path of node's network namespace (under NetNSDir) in
// two-node mode, where its slurmd, and so its steps, run; "" for the
// one-node cluster (the caller's namespace) or an unknown node.
func (c *Cluster) NodeNetNS(node string) string { return c.nodeNS[node] }

// NodeNetNSPaths are NodeNetNS of every node, in Nodes order; none for the
// one-node cluster.
func (c *Cluster) NodeNetNSPaths() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, c.nodeNS[n])
	}
	return out
}

// CtlNetNS is the controller's network namespace in two-node mode
// (slurmctld, slurmdbd, and every command Command prepares); "" otherwise.
func (c *Cluster) CtlNetNS() string { return c.ctlNS }

// NodeAddr is node's address (Slurm's NodeAddr): 127.0.0.1 for the
// one-node cluster, its own address on the private bridge in two-node mode
// (10.250.0.11, .12; up.sh FABRIC_NET); "" for an unknown node.
func (c *Cluster) NodeAddr(node string) string {
	if len(c.nodes) == 0 {
		if node == c.Node {
			return "127.0.0.1"
		}
		return ""
	}
	return c.addr[node]
}

// CtlAddr is slurmctld's address: 127.0.0.1, or 10.250.0.1 in two-node
// mode.
func (c *Cluster) CtlAddr() string {
	if c.ctlAddr == "" {
		return "127.0.0.1"
	}
	return c.ctlAddr
}

// NodeCommand prepares name args... as root in node's network namespace
// (nsenter --net), as a step's supervisor on that node sees the network:
// its links, addresses, routes and nftables. For the one-node cluster it
// is a plain command in the caller's namespace. The caller may adjust
// Env, Dir and stdio before starting it. Errors: an unknown node.
func (c *Cluster) NodeCommand(ctx context.Context, node, name string, args ...string) (*exec.Cmd, error) {
	if node != c.Node && c.nodeNS[node] == "" {
		return nil, fmt.Errorf("run %s on node %q: no such node (nodes: %s)", name, node, strings.Join(c.Nodes(), ", "))
	}
	path, _ := lookClean(name)
	var cmd *exec.Cmd
	if ns := c.nodeNS[node]; ns != "" {
		nsenter, _ := lookClean("nsenter")
		cmd = exec.CommandContext(ctx, nsenter, append([]string{"--net=" + ns, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Env = append(c.Env(), "HOME=/root", "USER=root", "LOGNAME=root")
	cmd.Dir = c.Dir
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	return cmd, nil
}

// lock takes LockFile exclusively, polling until timeout; the returned func
// releases it.
func lock(t testing.TB, timeout time.Duration) (func(), error) {
	if err := os.MkdirAll(BaseDir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", BaseDir, err)
	}
	f, err := os.OpenFile(LockFile, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", LockFile, err)
	}
	deadline := time.Now().Add(timeout)
	logged := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing the fd drops the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("flock %s: %w", LockFile, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("another test cluster held %s for %v", LockFile, timeout)
		}
		if !logged {
			t.Logf("cluster: waiting for another test's cluster (%s)", LockFile)
			logged = true
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Down stops the cluster (down.sh: cancel jobs, stop the daemons by recorded
// pid, remove Dir). Idempotent; Up's cleanup calls it.
func (c *Cluster) Down() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bash, _ := lookClean("bash")
	cmd := exec.CommandContext(ctx, bash, filepath.Join(c.scripts, "down.sh"), c.Dir)
	cmd.Env = append(os.Environ(), "PATH="+cleanPath)
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("down.sh %s: %w\n%s", c.Dir, err, out)
	}
	return nil
}

// LogTail returns the last n lines of Dir/log/name (e.g. "slurmd.log"), or
// a note saying why it cannot.
func (c *Cluster) LogTail(name string, n int) string {
	b, err := os.ReadFile(filepath.Join(c.Dir, "log", name))
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Env is the environment of commands run against the cluster: a clean PATH,
// SLURM_CONF, and nothing inherited (a SLURM_JOB_ID from an enclosing job
// would make srun join that job).
func (c *Cluster) Env() []string {
	return []string{"PATH=" + cleanPath, "SLURM_CONF=" + c.Conf, "LANG=C.UTF-8"}
}

// Command prepares name args... against the cluster (name without a slash
// is looked up in a fixed PATH that includes the sbin directories), run as
// userName ("" or
// "root": root, in Dir; otherwise that user with its groups, HOME, and its
// home directory as working directory, like a login). The caller may adjust
// Env, Dir and stdio before starting it. When ctx ends the command gets
// SIGTERM (srun then cancels its step) and SIGKILL 10 s later.
//
// In two-node mode the command runs in the controller's network namespace,
// where slurmctld listens and where slurmd reaches srun back: it is
// `nsenter --net=CTL -- name args...` for root and `nsenter --net=CTL --
// setpriv --reuid --regid --groups -- name args...` for a user (nsenter
// needs root; setpriv then takes the same ids a user's command gets
// otherwise). Both exec, so the process started is name's, with its pid.
func (c *Cluster) Command(ctx context.Context, userName, name string, args ...string) (*exec.Cmd, error) {
	path, _ := lookClean(name)
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = c.Env()
	cmd.Dir = c.Dir
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	var prefix []string
	if c.ctlNS != "" {
		nsenter, _ := lookClean("nsenter")
		prefix = []string{nsenter, "--net=" + c.ctlNS, "--"}
	}
	if userName == "" || userName == "root" {
		cmd.Env = append(cmd.Env, "HOME=/root", "USER=root", "LOGNAME=root")
		wrap(cmd, prefix)
		return cmd, nil
	}
	u, err := user.Lookup(userName)
	if err != nil {
		return nil, fmt.Errorf("run %s as %s: %w", name, userName, err)
	}
	cred, err := credential(u)
	if err != nil {
		return nil, fmt.Errorf("run %s as %s: %w", name, userName, err)
	}
	if prefix != nil {
		setpriv, _ := lookClean("setpriv")
		groups := "--clear-groups"
		if len(cred.Groups) > 0 {
			ids := make([]string, len(cred.Groups))
			for i, g := range cred.Groups {
				ids[i] = strconv.FormatUint(uint64(g), 10)
			}
			groups = "--groups=" + strings.Join(ids, ",")
		}
		prefix = append(prefix, setpriv, fmt.Sprintf("--reuid=%d", cred.Uid), fmt.Sprintf("--regid=%d", cred.Gid), groups, "--")
		wrap(cmd, prefix)
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Dir = u.HomeDir
	cmd.Env = append(cmd.Env, "HOME="+u.HomeDir, "USER="+u.Username, "LOGNAME="+u.Username)
	return cmd, nil
}

// wrap makes cmd run prefix... cmd.Path cmd.Args[1:] (no prefix: as is).
func wrap(cmd *exec.Cmd, prefix []string) {
	if len(prefix) == 0 {
		return
	}
	cmd.Args = append(append(append([]string{}, prefix...), cmd.Path), cmd.Args[1:]...)
	cmd.Path = prefix[0]
}

// credential is u's uid, primary gid and supplementary groups (what
// initgroups(3) would set, as setpriv --init-groups does).
func credential(u *user.User) (*syscall.Credential, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("gid %q: %w", u.Gid, err)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("groups of %s: %w", u.Username, err)
	}
	groups := make([]uint32, 0, len(ids))
	for _, s := range ids {
		g, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("group id %q: %w", s, err)
		}
		groups = append(groups, uint32(g))
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}, nil
}

// withDefaultTimeout bounds ctx by DefaultCommandTimeout if it has no
// deadline.
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultCommandTimeout)
}

// Run runs name args... as userName (see Command) and returns its output and
// exit status. A non-zero exit is not an error: err is set only when the
// command could not be started or was stopped because ctx ended (bounded by
// DefaultCommandTimeout when ctx has no deadline); exitCode is -1 when it
// was killed by a signal.
func (c *Cluster) Run(ctx context.Context, userName, name string, args ...string) (stdout, stderr string, exitCode int, err error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	cmd, err := c.Command(ctx, userName, name, args...)
	if err != nil {
		return "", "", -1, err
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	stdout, stderr = o.String(), e.String()
	if ctx.Err() != nil {
		return stdout, stderr, -1, fmt.Errorf("%s %s as %q: %w (stderr: %s)", name, strings.Join(args, " "), userName, ctx.Err(), strings.TrimSpace(stderr))
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return stdout, stderr, ee.ExitCode(), nil
	}
	if err != nil {
		return stdout, stderr, -1, fmt.Errorf("%s %s as %q: %w", name, strings.Join(args, " "), userName, err)
	}
	return stdout, stderr, 0, nil
}

// Srun runs `srun args...` as userName; see Run for the results.
func (c *Cluster) Srun(ctx context.Context, userName string, args ...string) (stdout, stderr string, exitCode int, err error) {
	return c.Run(ctx, userName, "srun", args...)
}

// Sbatch submits script (its text, fed on stdin) with `sbatch --parsable
// args...` as userName and returns the job id. Without --output the job's
// output goes to slurm-<id>.out in the user's home (root: Dir).
func (c *Cluster) Sbatch(ctx context.Context, userName, script string, args ...string) (int, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	cmd, err := c.Command(ctx, userName, "sbatch", append([]string{"--parsable"}, args...)...)
	if err != nil {
		return 0, err
	}
	cmd.Stdin = strings.NewReader(script)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("sbatch %s as %q: %w: %s", strings.Join(args, " "), userName, err, strings.TrimSpace(e.String()))
	}
	idText, _, _ := strings.Cut(strings.TrimSpace(o.String()), ";") // "id" or "id;cluster"
	id, err := strconv.Atoi(idText)
	if err != nil {
		return 0, fmt.Errorf("sbatch %s as %q: job id from %q: %w", strings.Join(args, " "), userName, o.String(), err)
	}
	return id, nil
}

// Scancel runs `scancel args...` as root; a non-zero exit is an error.
func (c *Cluster) Scancel(ctx context.Context, args ...string) error {
	_, stderr, code, err := c.Run(ctx, "", "scancel", args...)
	if err == nil && code != 0 {
		err = fmt.Errorf("scancel %s: exit %d: %s", strings.Join(args, " "), code, strings.TrimSpace(stderr))
	}
	return err
}

// Squeue runs `squeue args...` as root and returns its stdout; a non-zero
// exit is an error.
func (c *Cluster) Squeue(ctx context.Context, args ...string) (string, error) {
	stdout, stderr, code, err := c.Run(ctx, "", "squeue", args...)
	if err == nil && code != 0 {
		err = fmt.Errorf("squeue %s: exit %d: %s", strings.Join(args, " "), code, strings.TrimSpace(stderr))
	}
	return stdout, err
}

// Job is what slurmctld says about a job (`scontrol show job -o`), as
// the poc reads it (poc.Job). It is kept for MinJobAge (300 s) after the
// job ends.
type Job = poc.Job

// Job reads job id's state from slurmctld.
func (c *Cluster) Job(ctx context.Context, id int) (Job, error) {
	stdout, stderr, code, err := c.Run(ctx, "", "scontrol", "show", "job", "-o", strconv.Itoa(id))
	if err == nil && code != 0 {
		err = fmt.Errorf("scontrol show job %d: exit %d: %s", id, code, strings.TrimSpace(stderr))
	}
	if err != nil {
		return Job{}, err
	}
	return poc.ParseJob(id, stdout)
}

// WaitJob polls job id every 100 ms until it reaches a terminal state
// (COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, ...) and returns it;
// bounded by ctx, or DefaultCommandTimeout when ctx has no deadline.
func (c *Cluster) WaitJob(ctx context.Context, id int) (Job, error) {
	return c.WaitJobState(ctx, id)
}

// WaitJobState polls job id every 100 ms until its state is one of states
// (none: any terminal state) and returns it. It fails early when the job
// reaches a terminal state not in states.
func (c *Cluster) WaitJobState(ctx context.Context, id int, states ...string) (Job, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return poc.PollJob(ctx, id, 100*time.Millisecond, func(ctx context.Context) (Job, error) { return c.Job(ctx, id) }, states...)
}
