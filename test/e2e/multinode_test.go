package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/mpi/mpitest"
	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// TestE2EMultiNode runs steps across the two-node test cluster (two slurmd
// in network namespaces of their own on one private bridge, see package
// test/cluster): one microVM per node, joined by the step network and
// fenced from everything else. After every subtest nothing of a step is
// left on either node (harness.Env.Run: state, processes, and the step
// network's links and nftables tables in both nodes' namespaces).
func TestE2EMultiNode(t *testing.T) {
	e := harness.SetupWith(t, func(o *cluster.Options) {
		o.Nodes = 2
		o.FakeGPUs, o.StandinGPUs = 0, 0
	})
	nodes := e.C.Nodes()
	if len(nodes) != 2 {
		t.Fatalf("two-node cluster has nodes %q", nodes)
	}

	e.Run(t, "hostname on two nodes", func(t *testing.T) {
		out, errOut, code := e.Srun(t, "", "-N2", "--microvm="+e.Image, "hostname")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		got := strings.Fields(out)
		slices.Sort(got)
		if !slices.Equal(got, nodes) {
			t.Fatalf("hostnames %q, want %q (one per node)", got, nodes)
		}
	})

	e.Run(t, "guest network: addresses, hosts and peers", func(t *testing.T) {
		// Documented scheme (launcher/network): node i of the step gets
		// subnet base + 2 + i; /etc/hosts names every node of the step.
		// Each task pings the other node's guest, retrying while that
		// guest still boots (the two VMs start independently), then
		// stays up a moment so the other's pings are answered too.
		out, errOut, code := e.Srun(t, "", "-N2", "-l", "--microvm="+e.Image, "sh", "-c",
			`ip -4 -o addr show dev eth0; grep -v '^#' /etc/hosts
for n in `+nodes[0]+` `+nodes[1]+`; do [ "$n" != "$(hostname)" ] && peer=$(grep -w $n /etc/hosts | cut -f1); done
for i in $(seq 60); do icmpecho $peer 1s >/dev/null 2>&1 && { echo ping-ok; break; }; done
sleep 3`)
		if code != 0 {
			t.Fatalf("exit %d: %s\n%s", code, errOut, out)
		}
		for i, want := range []string{"10.224.0.2/16", "10.224.0.3/16"} {
			if !strings.Contains(out, fmt.Sprintf("%d: ", i)) || !strings.Contains(out, want) {
				t.Errorf("task %d: no address %s in\n%s", i, want, out)
			}
		}
		for _, want := range []string{"10.224.0.2\t" + nodes[0], "10.224.0.3\t" + nodes[1]} {
			if !strings.Contains(out, want) {
				t.Errorf("/etc/hosts lacks %q:\n%s", want, out)
			}
		}
		if strings.Count(out, "ping-ok") != 2 {
			t.Errorf("a guest could not ping the other node's guest by its name in /etc/hosts:\n%s", out)
		}
	})

	mpiCases := []struct {
		impl mpitest.Impl
		mpi  string
		env  []string
	}{
		// Across nodes the ranks talk TCP between the guests (eth0);
		// Open MPI uses shared memory inside each guest. MPICH's UCX
		// 1.13 (Debian 12) sometimes never finishes flushing its
		// shared-memory endpoints in MPI_Finalize once TCP is in use
		// (all ranks printed done; seen in CI, a known UCX bug class):
		// it runs TCP only.
		{mpitest.OpenMPI, "pmix", []string{"OMPI_MCA_btl=self,vader,tcp", "OMPI_MCA_pml=ob1", "OMPI_MCA_btl_tcp_if_include=eth0"}},
		{mpitest.MPICH, "pmi2", []string{"UCX_TLS=tcp,self", "UCX_NET_DEVICES=eth0"}},
	}
	for _, c := range mpiCases {
		e.Run(t, c.impl.Name+" across two nodes over "+c.mpi, func(t *testing.T) {
			img := harness.MPIImage(t, c.impl)
			res := runMPI(t, e, img, c.mpi, c.env, "-N2", "-n4")
			hosts := map[string]int{}
			for _, rk := range res.Ranks {
				hosts[rk.Host]++
			}
			if hosts[nodes[0]] != 2 || hosts[nodes[1]] != 2 {
				t.Errorf("ranks per guest host %v, want 2 on each of %q", hosts, nodes)
			}
			t.Logf("%s across nodes: %d ranks, %d pair transfers checked, latency %.1f us, bandwidth %.0f MB/s (ranks 0-1: same node)",
				c.impl.Name, res.Size, res.PairsChecked, res.LatencyUS, res.BandwidthMBps)
		})
	}

	e.Run(t, "two jobs of two users are fenced from each other and from the hosts", func(t *testing.T) {
		fenceTest(t, e, nodes)
	})

	e.Run(t, "a guest root cannot reach its node's stack through a link-local group MAC", func(t *testing.T) {
		// Frames to 01:80:c2:00:00:0X skip the bridge's hooks and reach
		// the tap's own stack; the node must not answer or even count them.
		before := map[string]int{}
		for _, n := range nodes {
			before[n] = inEchos(t, e, n)
		}
		hosts := []string{e.C.NodeAddr(nodes[0]), e.C.NodeAddr(nodes[1])}
		out, errOut, code := e.Srun(t, "", append([]string{"-N2", "-l", "--microvm=" + e.Image, "sh", "-c", linkLocalAttack, "attack"}, hosts...)...)
		if code != 0 || strings.Count(out, "attack-done") != 2 {
			t.Fatalf("exit %d: %s\n%s", code, out, errOut)
		}
		if strings.Contains(out, "reply from") {
			t.Errorf("a guest got an echo reply from a node address:\n%s", out)
		}
		for _, n := range nodes {
			if after := inEchos(t, e, n); after > before[n] {
				t.Errorf("node %s's own IP stack received %d echo requests from the guests", n, after-before[n])
			}
		}
	})

	// -K (--kill-on-bad-exit): the task on the other node is ended when
	// this one fails, as an MPI job would want; without it srun waits for
	// that task, as on bare nodes.
	e.Run(t, "a killed supervisor leaves nothing on either node", func(t *testing.T) {
		killOnNode(t, e, nodes, "fault-sup", state.SupervisorFile, "supervisor")
	})

	e.Run(t, "scancel while the step network is set up leaves nothing", func(t *testing.T) {
		job, cmd := startStep(t, e, "", "fault-boot", "-N2", "--microvm="+e.Image, "sleep", "300")
		dir := filepath.Join(harness.RuntimeDir, state.StepID{Job: uint32(job), Node: nodes[1]}.String())
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if _, err := os.Stat(filepath.Join(dir, "network.json")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no network record on %s within 2 min", nodes[1])
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := e.C.Scancel(context.Background(), strconv.Itoa(job)); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		waitJobGone(t, e, job)
	})

	e.Run(t, "scancel leaves nothing on either node", func(t *testing.T) {
		job, cmd := startStep(t, e, "", "fence-scancel", "-N2", "--microvm="+e.Image, "sleep", "300")
		waitReady(t, e, job, nodes)
		if err := e.C.Scancel(context.Background(), strconv.Itoa(job)); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		waitJobGone(t, e, job)
	})

	e.Run(t, "a killed VMM leaves nothing on either node", func(t *testing.T) {
		killOnNode(t, e, nodes, "fence-kill", state.VMMPidFile, "VMM")
	})
}

// killOnNode starts `srun -K -N2 sleep` in microVMs, SIGKILLs the process
// recorded in pidFile of the step's state on the second node, and waits
// for srun and the job to end (the caller's e.Run checks nothing is left).
func killOnNode(t *testing.T, e *harness.Env, nodes []string, name, pidFile, what string) {
	t.Helper()
	job, cmd := startStep(t, e, "", name, "-K", "-N2", "--microvm="+e.Image, "sleep", "300")
	waitReady(t, e, job, nodes)
	p, err := state.ReadProc(filepath.Join(harness.RuntimeDir, state.StepID{Job: uint32(job), Node: nodes[1]}.String(), pidFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Errorf("srun did not end within 2 min of the %s on %s being killed", what, nodes[1])
		_ = e.C.Scancel(context.Background(), strconv.Itoa(job))
		<-done
	}
	waitJobGone(t, e, job)
}

// linkLocalAttack, run by a guest root with the nodes' addresses: a route
// and a permanent neighbour entry send them to LLDP's group MAC, then
// echo requests.
const linkLocalAttack = `
for h in "$@"; do
  ip route add $h/32 dev eth0
  arp -s $h 01:80:c2:00:00:0e || ip neigh replace $h lladdr 01:80:c2:00:00:0e dev eth0 nud permanent
done
for i in $(seq 10); do for h in "$@"; do icmpecho $h 200ms >/dev/null 2>&1 && echo "reply from $h"; done; done
echo attack-done
`

// inEchos reads node's Icmp InEchos counter (/proc/net/snmp of its
// network namespace).
func inEchos(t *testing.T, e *harness.Env, node string) int {
	t.Helper()
	cmd, err := e.C.NodeCommand(context.Background(), node, "cat", "/proc/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var hdr []string
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(l, "Icmp: ") {
			continue
		}
		f := strings.Fields(l)
		if hdr == nil {
			hdr = f
			continue
		}
		for i, h := range hdr {
			if h == "InEchos" && i < len(f) {
				n, _ := strconv.Atoi(f[i])
				return n
			}
		}
	}
	t.Fatalf("no Icmp InEchos in\n%s", out)
	return 0
}

// runMPI runs mpi_hello in img with srun args, as root, and checks the
// result.
func runMPI(t *testing.T, e *harness.Env, img, pmi string, env []string, args ...string) *mpitest.Result {
	t.Helper()
	return runMPIAs(t, e, "", img, pmi, env, args...)
}

// runMPIAs is runMPI as userName ("" for root).
func runMPIAs(t *testing.T, e *harness.Env, userName, img, pmi string, env []string, args ...string) *mpitest.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	all := append(append([]string{}, args...), "--mpi="+pmi, "--microvm="+img, "mpi_hello", "200", "20")
	cmd, err := e.C.Command(ctx, userName, "srun", all...)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("srun %q: %v\nstdout:\n%s\nstderr:\n%s", all, err, stdout.String(), stderr.String())
	}
	res, err := mpitest.ParseHello(stdout.Bytes())
	if err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	n := 0
	for i, a := range args {
		if strings.HasPrefix(a, "-n") && len(a) > 2 {
			n, _ = strconv.Atoi(a[2:])
		} else if a == "-n" && i+1 < len(args) {
			n, _ = strconv.Atoi(args[i+1])
		}
	}
	if err := res.Check(n); err != nil {
		t.Fatalf("%v\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	return res
}

// startStep starts srun (as userName, "" for root) with a job name, in the
// background, and returns its job id once Slurm shows it.
func startStep(t *testing.T, e *harness.Env, userName, name string, args ...string) (int, *exec.Cmd) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	cmd, err := e.C.Command(ctx, userName, "srun", append([]string{"--job-name=" + name}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var out fixture.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("srun %s output:\n%s", name, out.String())
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		q, err := e.C.Squeue(context.Background(), "-h", "-n", name, "-o", "%i")
		if err == nil && strings.TrimSpace(q) != "" {
			job, err := strconv.Atoi(strings.Fields(q)[0])
			if err == nil {
				return job, cmd
			}
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("job %s not in squeue after 1 min: %v\n%s", name, err, out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitReady waits until step 0 of job is ready on every node.
func waitReady(t *testing.T, e *harness.Env, job int, nodes []string) {
	t.Helper()
	deadline := time.Now().Add(4 * time.Minute)
	for _, n := range nodes {
		dir := filepath.Join(harness.RuntimeDir, state.StepID{Job: uint32(job), Node: n}.String())
		for {
			if _, err := os.Stat(filepath.Join(dir, state.ReadyFile)); err == nil {
				break
			}
			if b, err := os.ReadFile(filepath.Join(dir, state.ErrorFile)); err == nil {
				t.Fatalf("step %d.0 on %s failed: %s", job, n, b)
			}
			if time.Now().After(deadline) {
				t.Fatalf("step %d.0 not ready on %s after 4 min", job, n)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// waitJobGone waits until Slurm no longer shows job.
func waitJobGone(t *testing.T, e *harness.Env, job int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		q, err := e.C.Squeue(context.Background(), "-h", "-j", strconv.Itoa(job), "-o", "%i")
		if err == nil && strings.TrimSpace(q) == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d still in squeue after 2 min: %q %v", job, q, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// fenceScript is what each guest of a fence job runs: a TCP server on its
// own port answering with a token, then, once the test creates /sync/go,
// probes of its own job's guests, the other job's port, and the nodes'
// host addresses (slurmd's port, ping), one result line each.
const fenceScript = `
mine=$1; other=$2; token=$3-$(hostname); shift 3
nc -ll -p "$mine" -e echo "$token" &
sleep 0.5
touch "/sync/ready-$token"
while [ ! -e /sync/go ]; do sleep 0.2; done
for a in 10.224.0.2 10.224.0.3; do
  echo "own $a $(nc -w 3 $a $mine </dev/null 2>&1 | head -1)"
  echo "other $a $(nc -w 3 $a $other </dev/null 2>&1 | head -1)"
  if icmpecho $a 3s >/dev/null 2>&1; then echo "ping $a ok"; else echo "ping $a failed"; fi
done
# The hosts: no route exists; a guest root adds one on the segment to
# really knock on the host's door (the fence must drop it, not routing).
[ "$(id -u)" = 0 ] && ip route add 10.250.0.0/24 dev eth0 2>/dev/null
for h in "$@"; do
  echo "host $h:6818 $(nc -w 3 $h 6818 </dev/null >/dev/null 2>&1 && echo OPEN || echo closed)"
  if icmpecho $h 3s >/dev/null 2>&1; then echo "hostping $h ANSWERED"; else echo "hostping $h none"; fi
done
`

func fenceTest(t *testing.T, e *harness.Env, nodes []string) {
	sync := filepath.Join(harness.DataDir, "rw", "fence")
	if err := os.MkdirAll(sync, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sync, 0o1777); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sync)
	hosts := []string{e.C.NodeAddr(nodes[0]), e.C.NodeAddr(nodes[1]), e.C.CtlAddr()}
	script := filepath.Join(sync, "fence.sh")
	if err := os.WriteFile(script, []byte(fenceScript), 0o755); err != nil {
		t.Fatal(err)
	}
	type job struct {
		user, name, token string
		mine, other       int
		id                int
		cmd               *exec.Cmd
	}
	jobs := []*job{
		{user: "", name: "fence-a", token: "A", mine: 5001, other: 5002},
		{user: cluster.TestUser, name: "fence-b", token: "B", mine: 5002, other: 5001},
	}
	for _, j := range jobs {
		args := []string{"-N2", "-l", "--microvm=" + e.Image, "--microvm-mounts=" + sync + ":/sync:rw",
			"sh", "/sync/fence.sh", strconv.Itoa(j.mine), strconv.Itoa(j.other), j.token}
		j.id, j.cmd = startStep(t, e, j.user, j.name, append(args, hosts...)...)
	}
	for _, j := range jobs {
		waitReady(t, e, j.id, nodes)
	}
	// Both servers listen in all four guests before the probes start.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		m, _ := filepath.Glob(filepath.Join(sync, "ready-*"))
		if len(m) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("guests ready: %q, want 4", m)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := os.WriteFile(filepath.Join(sync, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		done := make(chan error, 1)
		go func() { done <- j.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("job %s: %v", j.name, err)
			}
		case <-time.After(3 * time.Minute):
			_ = e.C.Scancel(context.Background(), strconv.Itoa(j.id))
			<-done
			t.Errorf("job %s did not finish its probes in 3 min", j.name)
		}
		out := j.cmd.Stdout.(*fixture.SyncBuffer).String()
		for _, task := range []string{"0", "1"} {
			for _, a := range []string{"10.224.0.2", "10.224.0.3"} {
				// Its own job's guests on both nodes answer, by TCP
				// and ping.
				if own := fmt.Sprintf("%s: own %s %s-", task, a, j.token); !strings.Contains(out, own) {
					t.Errorf("job %s task %s: own guest %s did not answer on port %d (want %q)\n%s", j.name, task, a, j.mine, own, out)
				}
				if !strings.Contains(out, fmt.Sprintf("%s: ping %s ok", task, a)) {
					t.Errorf("job %s task %s: cannot ping own guest %s\n%s", j.name, task, a, out)
				}
			}
		}
		// The other job's servers are never reached, by any guest.
		other := map[string]string{"A": "B-", "B": "A-"}[j.token]
		if strings.Contains(out, other) {
			t.Errorf("job %s reached the other job's guests (saw %q):\n%s", j.name, other, out)
		}
		// Nor any host address, slurmd's port or ping.
		if strings.Contains(out, "OPEN") || strings.Contains(out, "ANSWERED") {
			t.Errorf("job %s reached a host address:\n%s", j.name, out)
		}
		if n := strings.Count(out, ":6818 closed"); n != 2*len(hosts) {
			t.Errorf("job %s: %d host probes ran, want %d:\n%s", j.name, n, 2*len(hosts), out)
		}
		t.Logf("job %s (%s):\n%s", j.name, map[string]string{"": "root"}[j.user]+j.user, out)
	}
	// Each user's own MPI across the two nodes still works.
	img := harness.MPIImage(t, mpitest.OpenMPI)
	for _, j := range jobs {
		runMPIAs(t, e, j.user, img, "pmix", []string{"OMPI_MCA_btl=self,vader,tcp", "OMPI_MCA_pml=ob1", "OMPI_MCA_btl_tcp_if_include=eth0"}, "-N2", "-n2")
	}
}
