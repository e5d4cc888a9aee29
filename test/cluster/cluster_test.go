package cluster

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// stepScript prints the step's ids, its /proc/self/cgroup, and the memory
// limit of its step cgroup (v1 memory.limit_in_bytes or v2 memory.max).
const stepScript = `set -e
echo "ids $SLURM_JOB_ID $SLURM_STEP_ID"
cat /proc/self/cgroup
p=$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup)
if [ -n "$p" ]; then f=/sys/fs/cgroup/memory$(echo "$p" | sed 's,\(/step_[^/]*\)/.*,\1,')/memory.limit_in_bytes
else f=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup | sed 's,\(/step_[^/]*\)/.*,\1,')/memory.max; fi
echo "limit $(cat "$f")"
`

// stepInfo is what stepScript printed.
type stepInfo struct {
	job, step string
	cgroups   map[string]string // controller ("" for the v2 line) -> path
	limit     string
}

func parseStep(t *testing.T, out string) stepInfo {
	t.Helper()
	s := stepInfo{cgroups: map[string]string{}}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		switch {
		case strings.HasPrefix(line, "ids "):
			f := strings.Fields(line)
			if len(f) != 3 {
				t.Fatalf("bad ids line %q", line)
			}
			s.job, s.step = f[1], f[2]
		case strings.HasPrefix(line, "limit "):
			s.limit = strings.TrimPrefix(line, "limit ")
		default:
			// hierarchy-ID:controller-list:cgroup-path (cgroups(7))
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 {
				t.Fatalf("bad /proc/self/cgroup line %q", line)
			}
			for _, ctrl := range strings.Split(parts[1], ",") {
				s.cgroups[ctrl] = parts[2]
			}
		}
	}
	if s.job == "" {
		t.Fatalf("no ids in step output:\n%s", out)
	}
	return s
}

// checkStepCgroups asserts the layout documented in doc.go.
func checkStepCgroups(t *testing.T, c *Cluster, s stepInfo, uid string) {
	t.Helper()
	stepDir := fmt.Sprintf("/job_%s/step_%s", s.job, s.step)
	if c.CgroupVersion == 1 {
		prefix := fmt.Sprintf("/slurm_%s/uid_%s%s", c.Node, uid, stepDir)
		for _, ctrl := range []string{"freezer", "memory", "cpuset", "devices"} {
			if p := s.cgroups[ctrl]; !strings.HasPrefix(p, prefix) {
				t.Errorf("%s cgroup %q: want it under %s", ctrl, p, prefix)
			}
		}
		// The freezer (proctrack/cgroup) stops at the step; memory is per task.
		if p := s.cgroups["freezer"]; p != prefix {
			t.Errorf("freezer cgroup %q: want exactly %s", p, prefix)
		}
		if p := s.cgroups["memory"]; !regexp.MustCompile(`/task_\d+$`).MatchString(p) {
			t.Errorf("memory cgroup %q: want a task_<n> leaf", p)
		}
		return
	}
	if p := s.cgroups[""]; !strings.Contains(p, stepDir+"/") {
		t.Errorf("cgroup v2 path %q: want it to contain %s/", p, stepDir)
	}
}

func TestCluster(t *testing.T) {
	c := Up(t, Options{})
	t.Logf("cluster up in %v (cgroup v%d, node %s)\n%s", c.StartupTime, c.CgroupVersion, c.Node, c.UpOutput)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	tu, err := user.Lookup(TestUser)
	if err != nil {
		t.Fatal(err)
	}

	// Options.OCIRuntime is off: no oci.conf (Slurm then ignores
	// --container) and nothing of its host preparation.
	t.Run("no containers by default", func(t *testing.T) {
		for _, name := range []string{"etc/oci.conf", "oci-cgmounts", "oci-rundirs"} {
			if _, err := os.Stat(filepath.Join(c.Dir, name)); !os.IsNotExist(err) {
				t.Errorf("%s in a cluster without Options.OCIRuntime: %v", name, err)
			}
		}
		if err := c.SetOCIRuntime("runc"); err == nil {
			t.Error("SetOCIRuntime on a cluster without Options.OCIRuntime: no error")
		}
	})

	t.Run("srun -n2 hostname", func(t *testing.T) {
		stdout, stderr, code, err := c.Srun(ctx, "", "-n2", "hostname")
		if err != nil || code != 0 {
			t.Fatalf("srun: exit %d, %v: %s", code, err, stderr)
		}
		lines := strings.Fields(stdout)
		if len(lines) != 2 || lines[0] != host || lines[1] != host {
			t.Errorf("srun -n2 hostname printed %q, want %q twice", stdout, host)
		}
	})

	t.Run("exit status", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want int
		}{
			{[]string{"true"}, 0},
			{[]string{"sh", "-c", "exit 3"}, 3},
		} {
			_, stderr, code, err := c.Srun(ctx, "", tc.args...)
			if err != nil || code != tc.want {
				t.Errorf("srun %q: exit %d, %v, want exit %d (stderr %s)", tc.args, code, err, tc.want, stderr)
			}
		}
	})

	t.Run("cores", func(t *testing.T) {
		stdout, stderr, code, err := c.Srun(ctx, "", "-n1", "-c1", "nproc")
		if err != nil || code != 0 {
			t.Fatalf("srun: exit %d, %v: %s", code, err, stderr)
		}
		if got := strings.TrimSpace(stdout); got != "1" {
			t.Errorf("srun -c1 nproc = %q, want 1 (ConstrainCores/task affinity)", got)
		}
	})

	t.Run("step cgroups", func(t *testing.T) {
		stdout, stderr, code, err := c.Srun(ctx, "", "--mem=100", "sh", "-c", stepScript)
		if err != nil || code != 0 {
			t.Fatalf("srun: exit %d, %v: %s", code, err, stderr)
		}
		t.Logf("step output:\n%s", stdout)
		s := parseStep(t, stdout)
		checkStepCgroups(t, c, s, "0")
		if want := fmt.Sprint(100 << 20); s.limit != want {
			t.Errorf("step memory limit %s, want %s (--mem=100)", s.limit, want)
		}
	})

	t.Run("srun as test user", func(t *testing.T) {
		stdout, stderr, code, err := c.Srun(ctx, TestUser, "--mem=50", "sh", "-c", "id -un; "+stepScript)
		if err != nil || code != 0 {
			t.Fatalf("srun: exit %d, %v: %s", code, err, stderr)
		}
		name, rest, _ := strings.Cut(stdout, "\n")
		if name != TestUser {
			t.Errorf("id -un = %q, want %q", name, TestUser)
		}
		s := parseStep(t, rest)
		checkStepCgroups(t, c, s, tu.Uid)
		if want := fmt.Sprint(50 << 20); s.limit != want {
			t.Errorf("step memory limit %s, want %s (--mem=50)", s.limit, want)
		}
	})

	t.Run("sbatch as test user", func(t *testing.T) {
		out := filepath.Join(tu.HomeDir, "cluster-test-%j.out")
		id, err := c.Sbatch(ctx, TestUser, "#!/bin/sh\nid -un\nexit 0\n", "--output="+out)
		if err != nil {
			t.Fatal(err)
		}
		j, err := c.WaitJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.State != "COMPLETED" || j.ExitCode != "0:0" {
			t.Errorf("job %d: %s exit %s, want COMPLETED 0:0 (%s)", id, j.State, j.ExitCode, j.Raw)
		}
		path := strings.ReplaceAll(out, "%j", fmt.Sprint(id))
		t.Cleanup(func() { os.Remove(path) })
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(b)); got != TestUser {
			t.Errorf("batch output %q, want %q", got, TestUser)
		}
	})

	t.Run("scancel", func(t *testing.T) {
		id, err := c.Sbatch(ctx, "", "#!/bin/sh\nexec sleep 300\n", "--output=/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitJobState(ctx, id, "RUNNING"); err != nil {
			t.Fatal(err)
		}
		q, err := c.Squeue(ctx, "-h", "-o", "%A %T")
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%d RUNNING", id); !strings.Contains(q, want) {
			t.Errorf("squeue = %q, want a line %q", q, want)
		}
		start := time.Now()
		if err := c.Scancel(ctx, fmt.Sprint(id)); err != nil {
			t.Fatal(err)
		}
		j, err := c.WaitJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if j.State != "CANCELLED" {
			t.Errorf("job %d after scancel: %s, want CANCELLED", id, j.State)
		}
		t.Logf("scancel to CANCELLED: %v", time.Since(start))
	})
}

// TestClusterAccounting: Options.Accounting runs a private MariaDB and
// slurmdbd beside the cluster: root's jobs are recorded with their TRES
// (sacct reads them back from slurmdbd), a user without an association is
// refused (AccountingStorageEnforce=associations), and Down stops exactly
// the daemons up.sh recorded and removes the database with the state
// directory, leaving the system's MariaDB paths alone.
func TestClusterAccounting(t *testing.T) {
	_, sysDataErr := os.Stat("/var/lib/mysql/slurm_acct_db")
	_, sysRunErr := os.Stat("/run/mysqld")
	c := Up(t, Options{Accounting: true, FakeGPUs: 1})
	t.Logf("cluster with accounting up in %v\n%s", c.StartupTime, c.UpOutput)
	if !c.Accounting {
		t.Fatalf("Cluster.Accounting is false after Up with Options.Accounting")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	pids := recordedPids(t, c.Dir)
	for _, d := range []string{"mariadbd", "slurmdbd"} {
		if pids[d] == 0 {
			t.Errorf("pids file has no %s: %v", d, pids)
		}
	}

	stdout, stderr, code, err := c.Srun(ctx, "", "--gres=gpu:1", "sh", "-c", "echo $SLURM_JOB_ID")
	if err != nil || code != 0 {
		t.Fatalf("srun as root: exit %d, %v: %s", code, err, stderr)
	}
	job := strings.TrimSpace(stdout)
	// slurmctld sends the job's end to slurmdbd asynchronously.
	var tres string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, _, _, err := c.Run(ctx, "", "sacct", "-j", job, "-X", "-n", "-P", "-o", "State,AllocTRES")
		if err != nil {
			t.Fatal(err)
		}
		if tres = strings.TrimSpace(out); strings.HasPrefix(tres, "COMPLETED|") {
			break
		}
	}
	if !strings.HasPrefix(tres, "COMPLETED|") || !strings.Contains(tres, "gres/gpu=1") {
		t.Errorf("sacct -j %s: %q, want COMPLETED with gres/gpu=1 in AllocTRES", job, tres)
	}

	_, stderr, code, err = c.Srun(ctx, TestUser, "true")
	if err != nil {
		t.Fatal(err)
	}
	if code == 0 || !strings.Contains(stderr, "Invalid account") {
		t.Errorf("srun as %s (no association): exit %d, stderr %q: want the job refused for its account", TestUser, code, stderr)
	}

	if err := c.Down(); err != nil {
		t.Fatal(err)
	}
	for name, pid := range pids {
		// A zombie (not yet reaped by init) has stopped.
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && f[0] != "Z" {
				t.Errorf("%s (pid %d) still runs after Down (state %s)", name, pid, f[0])
			}
		}
	}
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Errorf("state dir %s after Down: %v, want it gone", c.Dir, err)
	}
	if _, err := os.Stat("/run/mysqld"); err == nil && sysRunErr != nil {
		t.Errorf("/run/mysqld appeared: the cluster's MariaDB must use its own socket and pid file")
	}
	if _, err := os.Stat("/var/lib/mysql/slurm_acct_db"); err == nil && sysDataErr != nil {
		t.Errorf("/var/lib/mysql/slurm_acct_db appeared: the cluster's database must live in its state dir")
	}
}

// recordedPids reads dir/pids ("name pid starttime exe" lines).
func recordedPids(t *testing.T, dir string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "pids"))
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var name string
		var pid int
		if _, err := fmt.Sscan(line, &name, &pid); err == nil {
			pids[name] = pid
		}
	}
	return pids
}
