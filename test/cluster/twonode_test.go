package cluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// rootNet is what the test's own (root) network namespace holds: links by
// name, addresses and routes. Two-node mode must add none of them.
func rootNet(t *testing.T) (links, addrs, routes []string) {
	t.Helper()
	ls, err := netlink.LinkList()
	if err != nil {
		t.Fatalf("list links: %v", err)
	}
	for _, l := range ls {
		links = append(links, l.Attrs().Name)
	}
	as, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatalf("list addresses: %v", err)
	}
	for _, a := range as {
		addrs = append(addrs, a.IPNet.String())
	}
	rs, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatalf("list routes: %v", err)
	}
	for _, r := range rs {
		routes = append(routes, r.String())
	}
	sort.Strings(links)
	sort.Strings(addrs)
	sort.Strings(routes)
	return links, addrs, routes
}

// localAddrs are the IPv4 addresses of the namespace whose
// /proc/net/fib_trie this is: the "|-- A" entries followed by
// "/32 host LOCAL".
func localAddrs(fibTrie string) []string {
	var out []string
	var last string
	sc := bufio.NewScanner(strings.NewReader(fibTrie))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if a, ok := strings.CutPrefix(line, "|-- "); ok {
			last = a
		} else if strings.HasPrefix(line, "/32 host LOCAL") && last != "" && !slices.Contains(out, last) {
			out = append(out, last)
		}
	}
	sort.Strings(out)
	return out
}

// TestClusterTwoNodes: Options.Nodes = 2 starts two slurmd "nodes" on this
// host, each in a network namespace of its own with its own address on a
// private bridge: a job spans both (SLURMD_NODENAME per task), a task on
// n1 has n1's address only and reaches n2's slurmd but not the host's own
// addresses, clients run as root and as the test user in the controller's
// namespace, the nodes' steps use their own cgroups (slurm_<node>) and
// TmpFS (PMIx across the two nodes), and Down leaves no namespace, and
// nothing was ever added to the root namespace.
func TestClusterTwoNodes(t *testing.T) {
	links0, addrs0, routes0 := rootNet(t)
	c := Up(t, Options{Nodes: 2})
	t.Logf("two-node cluster up in %v\n%s", c.StartupTime, c.UpOutput)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	if got := c.Nodes(); !slices.Equal(got, []string{"n1", "n2"}) || !c.TwoNode() {
		t.Fatalf("Nodes() = %q (two-node %v), want [n1 n2]", got, c.TwoNode())
	}
	nsPaths := append([]string{c.CtlNetNS()}, c.NodeNetNSPaths()...)
	for _, p := range nsPaths {
		if _, err := os.Stat(p); err != nil || !strings.HasPrefix(p, NetNSDir+"/smv-") {
			t.Errorf("network namespace %q: %v (want a file under %s/smv-*)", p, err, NetNSDir)
		}
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	srun := func(t *testing.T, userName string, args ...string) string {
		t.Helper()
		stdout, stderr, code, err := c.Srun(ctx, userName, args...)
		if err != nil || code != 0 {
			t.Fatalf("srun %q as %q: exit %d, %v: %s", args, userName, code, err, stderr)
		}
		return stdout
	}
	lines := func(s string) []string {
		l := strings.Split(strings.TrimSpace(s), "\n")
		sort.Strings(l)
		return l
	}

	t.Run("root namespace untouched", func(t *testing.T) {
		links, addrs, routes := rootNet(t)
		if !slices.Equal(links, links0) || !slices.Equal(addrs, addrs0) || !slices.Equal(routes, routes0) {
			t.Errorf("root network namespace changed by Up:\n links %q -> %q\n addrs %q -> %q\n routes %q -> %q", links0, links, addrs0, addrs, routes0, routes)
		}
	})

	t.Run("a task per node", func(t *testing.T) {
		if got, want := lines(srun(t, "", "-N2", "-n2", "-l", "printenv", "SLURMD_NODENAME")), []string{"0: n1", "1: n2"}; !slices.Equal(got, want) {
			t.Errorf("srun -N2 -n2 -l printenv SLURMD_NODENAME: %q, want %q", got, want)
		}
		if got, want := lines(srun(t, "", "-N2", "-l", "hostname")), []string{"0: " + host, "1: " + host}; !slices.Equal(got, want) {
			t.Errorf("srun -N2 -l hostname: %q, want %q", got, want)
		}
	})

	t.Run("own address", func(t *testing.T) {
		for _, n := range c.Nodes() {
			got := localAddrs(srun(t, "", "-w", n, "-N1", "-n1", "cat", "/proc/net/fib_trie"))
			if want := []string{c.NodeAddr(n), "127.0.0.1"}; !slices.Equal(got, want) {
				t.Errorf("local addresses of a task on %s: %q, want %q", n, got, want)
			}
			cmd, err := c.NodeCommand(ctx, n, "cat", "/proc/net/fib_trie")
			if err != nil {
				t.Fatal(err)
			}
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("NodeCommand %s: %v", n, err)
			}
			if got, want := localAddrs(string(out)), []string{c.NodeAddr(n), "127.0.0.1"}; !slices.Equal(got, want) {
				t.Errorf("local addresses in NodeNetNS(%s): %q, want %q", n, got, want)
			}
		}
	})

	t.Run("n1 reaches n2 and nothing outside", func(t *testing.T) {
		probe := fmt.Sprintf("exec 3<>/dev/tcp/%s/6818 && echo connected", c.NodeAddr("n2"))
		if got := strings.TrimSpace(srun(t, "", "-w", "n1", "-N1", "-n1", "bash", "-c", probe)); got != "connected" {
			t.Errorf("task on n1 connecting to n2's slurmd: %q, want connected", got)
		}
		// The host's own addresses are not routed from the node.
		for _, a := range addrs0 {
			ip, _, _ := strings.Cut(a, "/")
			if strings.Contains(ip, ":") || strings.HasPrefix(ip, "127.") {
				continue
			}
			probe := fmt.Sprintf("timeout 5 bash -c 'exec 3<>/dev/tcp/%s/22' 2>&1; echo exit=$?", ip)
			out := srun(t, "", "-w", "n1", "-N1", "-n1", "bash", "-c", probe)
			if !strings.Contains(out, "exit=1") || !strings.Contains(out, "unreachable") {
				t.Errorf("task on n1 connecting to the host's address %s: %q, want network unreachable", ip, out)
			}
		}
	})

	t.Run("node cgroups", func(t *testing.T) {
		for _, n := range c.Nodes() {
			out := srun(t, "", "-w", n, "-N1", "-n1", "cat", "/proc/self/cgroup")
			want := "/slurm_" + n + "/uid_0/job_"
			if c.CgroupVersion == 2 {
				want = "/" + n + "_slurmstepd.scope/job_"
			}
			if !strings.Contains(out, want) {
				t.Errorf("task on %s: /proc/self/cgroup has no %s:\n%s", n, want, out)
			}
		}
	})

	t.Run("pmix across nodes", func(t *testing.T) {
		// Slurm dlopens libpmix (package libpmix-dev, hack/setup-debian.sh).
		if o, e, _, _ := c.Run(ctx, "", "srun", "--mpi=list"); !strings.Contains(o+e, "pmix") {
			prereq.Missing(t, "srun --mpi=list has no pmix (install libpmix-dev with hack/setup-debian.sh): %s", o+e)
		}
		out := srun(t, "", "-N2", "-n2", "-l", "--mpi=pmix", "sh", "-c", "echo $PMIX_RANK $SLURMD_NODENAME")
		if got, want := lines(out), []string{"0: 0 n1", "1: 1 n2"}; !slices.Equal(got, want) {
			t.Errorf("srun --mpi=pmix -N2: %q, want %q", got, want)
		}
	})

	t.Run("test user", func(t *testing.T) {
		if got, want := lines(srun(t, TestUser, "-N2", "-n2", "-l", "id", "-un")), []string{"0: " + TestUser, "1: " + TestUser}; !slices.Equal(got, want) {
			t.Errorf("srun -N2 id -un as %s: %q, want %q", TestUser, got, want)
		}
		tu, err := user.Lookup(TestUser)
		if err != nil {
			t.Fatal(err)
		}
		// The node index of a one-node step inside a two-node job: Slurm
		// counts it in the step (0), not in the job (1).
		out := filepath.Join(tu.HomeDir, "twonode-%j.out")
		id, err := c.Sbatch(ctx, TestUser, "#!/bin/sh\nsrun -N1 -n1 -r1 sh -c 'echo $SLURMD_NODENAME $SLURM_NODEID $SLURM_STEP_NODELIST'\n", "-N2", "--output="+out)
		if err != nil {
			t.Fatal(err)
		}
		j, err := c.WaitJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		path := strings.ReplaceAll(out, "%j", fmt.Sprint(id))
		t.Cleanup(func() { os.Remove(path) })
		b, _ := os.ReadFile(path)
		if j.State != "COMPLETED" || strings.TrimSpace(string(b)) != "n2 0 n2" {
			t.Errorf("sbatch -N2 with srun -N1 -r1: %s, output %q, want COMPLETED and \"n2 0 n2\" (SLURM_NODEID counts in the step)", j.State, b)
		}
	})

	if err := c.Down(); err != nil {
		t.Fatal(err)
	}
	for _, p := range nsPaths {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("network namespace %s after Down: %v, want it gone", p, err)
		}
	}
	if links, addrs, routes := rootNet(t); !slices.Equal(links, links0) || !slices.Equal(addrs, addrs0) || !slices.Equal(routes, routes0) {
		t.Errorf("root network namespace after Down:\n links %q -> %q\n addrs %q -> %q\n routes %q -> %q", links0, links, addrs0, addrs, routes0, routes)
	}
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Errorf("state dir %s after Down: %v, want it gone", c.Dir, err)
	}
	for _, n := range c.Nodes() {
		if dirs, _ := filepath.Glob("/sys/fs/cgroup/*/slurm_" + n); len(dirs) > 0 {
			t.Errorf("cgroups of node %s after Down: %q, want them removed", n, dirs)
		}
	}
}

// TestClusterTwoNodesDownBackstop: when slurmctld is gone (killed, so
// down.sh cannot cancel the jobs) Down still kills the job processes on
// both nodes (cgroups slurm_n1 and slurm_n2 on v1) and removes their job
// cgroups and the namespaces.
func TestClusterTwoNodesDownBackstop(t *testing.T) {
	c := Up(t, Options{Nodes: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := filepath.Join(c.Dir, "log", "backstop-%j.out")
	id, err := c.Sbatch(ctx, "", "#!/bin/sh\nsrun -N2 -n2 -l sh -c 'echo $SLURMD_NODENAME $$; exec sleep 300'\n", "-N2", "--output="+out)
	if err != nil {
		t.Fatal(err)
	}
	path := strings.ReplaceAll(out, "%j", fmt.Sprint(id))
	pids := map[string]int{}
	for deadline := time.Now().Add(30 * time.Second); len(pids) < 2; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(path)
			t.Fatalf("job %d: no task pid from both nodes in 30 s: %q", id, b)
		}
		b, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(b), "\n") {
			var rank, pid int
			var node string
			if _, err := fmt.Sscanf(line, "%d: %s %d", &rank, &node, &pid); err == nil {
				pids[node] = pid
			}
		}
	}
	ctld := recordedPids(t, c.Dir)["slurmctld"]
	if ctld == 0 {
		t.Fatal("no slurmctld in the pids file")
	}
	if err := syscall.Kill(ctld, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	nsPaths := c.NodeNetNSPaths()
	if err := c.Down(); err != nil {
		t.Fatal(err)
	}
	for node, pid := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && f[0] != "Z" {
				t.Errorf("task of job %d on %s (pid %d) still runs after Down", id, node, pid)
			}
		}
		var dirs []string
		if c.CgroupVersion == 1 {
			dirs, _ = filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/*/slurm_%s/uid_*/job_%d", node, id))
		} else {
			dirs, _ = filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/system.slice/%s_slurmstepd.scope/job_%d", node, id))
		}
		if len(dirs) > 0 {
			t.Errorf("job cgroups of job %d on %s after Down: %q", id, node, dirs)
		}
	}
	for _, p := range nsPaths {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("network namespace %s after Down: %v, want it gone", p, err)
		}
	}
}

// TestClusterTwoNodesTwoClusters: two two-node clusters of different
// state dirs run at once (the second started by up.sh directly: Up holds
// the host's lock) with disjoint namespace names, each job on its own
// nodes, and stopping one leaves the other's namespaces and jobs alone.
func TestClusterTwoNodesTwoClusters(t *testing.T) {
	a := Up(t, Options{Nodes: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := &Cluster{Dir: BaseDir + "/e2e-second", scripts: a.scripts}
	b.Conf = filepath.Join(b.Dir, "etc", "slurm.conf")
	bash, _ := lookClean("bash")
	up := exec.CommandContext(ctx, bash, filepath.Join(a.scripts, "up.sh"), b.Dir)
	up.Env = append(os.Environ(), "PATH="+cleanPath, "NODES=2", "NODE_NAMES=b1 b2", "TEST_USER="+TestUser)
	t.Cleanup(func() {
		if err := b.Down(); err != nil {
			t.Error(err)
		}
	})
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("up.sh %s: %v\n%s", b.Dir, err, out)
	}
	if err := b.readEnv(); err != nil {
		t.Fatal(err)
	}
	aNS := append([]string{a.CtlNetNS()}, a.NodeNetNSPaths()...)
	bNS := append([]string{b.CtlNetNS()}, b.NodeNetNSPaths()...)
	for _, p := range aNS {
		if slices.Contains(bNS, p) {
			t.Errorf("both clusters use network namespace %s", p)
		}
	}
	for _, tc := range []struct {
		c    *Cluster
		want []string
	}{{a, []string{"0: n1", "1: n2"}}, {b, []string{"0: b1", "1: b2"}}} {
		stdout, stderr, code, err := tc.c.Srun(ctx, "", "-N2", "-n2", "-l", "printenv", "SLURMD_NODENAME")
		got := strings.Split(strings.TrimSpace(stdout), "\n")
		sort.Strings(got)
		if err != nil || code != 0 || !slices.Equal(got, tc.want) {
			t.Errorf("srun -N2 in %s: %q (exit %d, %v, %s), want %q", tc.c.Dir, got, code, err, stderr, tc.want)
		}
	}
	if err := b.Down(); err != nil {
		t.Fatal(err)
	}
	for _, p := range bNS {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("network namespace %s after the second cluster's Down: %v", p, err)
		}
	}
	for _, p := range aNS {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("network namespace %s of the first cluster after the second's Down: %v", p, err)
		}
	}
	if _, stderr, code, err := a.Srun(ctx, "", "-N2", "true"); err != nil || code != 0 {
		t.Errorf("srun -N2 in the first cluster after the second's Down: exit %d, %v: %s", code, err, stderr)
	}
}
