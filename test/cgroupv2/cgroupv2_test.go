package cgroupv2

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"

	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
	"github.com/slurm-microvm/slurm-microvm/launcher/inventory"
	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// workDir is shared read-write between the host and the node (9p tag
// "work", the same path on both). Not under /tmp or /run: the node mounts
// those afresh.
const workDir = "/var/lib/slurm-microvm-test-cgv2"

// nodeCache is the node's cache_dir: not on the host (the node writes it
// to its tmpfs overlay), so every run builds its assets and image anew
// instead of reading whatever the host's e2e cache holds.
const nodeCache = "/var/cache/slurm-microvm-test-cgv2-node"

// nodeEnv, set in the node, is workDir: TestInNode runs there only.
const nodeEnv = "SMV_CGV2_NODE"

// TestCgroupV2Node boots the cgroup v2 test node (doc.go) and runs
// TestInNode in it: a real Slurm with cgroup/v2 and real --microvm steps
// on a kernel that mounts only the unified hierarchy.
func TestCgroupV2Node(t *testing.T) {
	if os.Getenv(nodeEnv) != "" {
		prereq.OptIn(t, "TestCgroupV2Node runs on the host; this is the node")
	}
	prereq.Root(t, "the node's QEMU exports the host's tree with its owners (9p security_model=passthrough)")
	prereq.Tools(t, "qemu-system-x86_64", "mkfs.erofs", "busybox", "make", "cc", "slurmd", "munged")
	if err := os.RemoveAll(workDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(workDir) })
	harness.Build(t, filepath.Join(workDir, "built"))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	testBin := filepath.Join(workDir, "cgroupv2.test")
	if err := harness.InstallFile(self, testBin, 0o755); err != nil {
		t.Fatal(err)
	}
	a := bootAssets(t, filepath.Join(workDir, "assets"))
	ctx, cancel := context.WithTimeout(context.Background(), 26*time.Minute)
	defer cancel()
	env := []string{nodeEnv + "=" + workDir, "CI=" + os.Getenv("CI"), "SMV_RESIDUE_TMP_IGNORE=" + os.Getenv("SMV_RESIDUE_TMP_IGNORE")}
	t0 := time.Now()
	code, console := node{Work: workDir, MemoryMiB: 3072, CPUs: 2}.run(ctx, t, a, env,
		testBin, "-test.run=^TestInNode$", "-test.v", "-test.count=1", "-test.timeout=24m")
	t.Logf("the node ran TestInNode in %s (exit %d)", time.Since(t0).Round(time.Second), code)
	if code != 0 {
		t.Fatalf("TestInNode failed in the cgroup v2 node (exit %d); its console:\n%s", code, console)
	}
	// The node's own verdicts, for the log.
	for _, line := range strings.Split(console, "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "--- ") || strings.Contains(l, "measured:") {
			t.Log(l)
		}
	}
}

// nodeOpts is the harness for the node: the host's build, and timeouts for
// a guest under nested TCG (the node is itself a TCG guest: a step's boot
// takes about a minute). vmm_overhead_mib is 32 so that a guest that
// touches most of its memory takes the VMM past the step's memory.max
// (the case "a step that exceeds --mem fails alone").
func nodeOpts(work string) harness.Options {
	return harness.Options{Prebuilt: filepath.Join(work, "built"), BootTimeout: "600s", AgentHang: "300s", VMMOverheadMiB: 32, CacheDir: nodeCache}
}

// TestInNode is the test proper; it runs inside the node (TestCgroupV2Node).
func TestInNode(t *testing.T) {
	work := os.Getenv(nodeEnv)
	if work == "" {
		prereq.OptIn(t, "runs inside the cgroup v2 test node that TestCgroupV2Node boots")
	}
	if m := cgroups.Mode(); m != cgroups.Unified {
		t.Fatalf("the node's cgroup mode is %v, want the unified hierarchy only", m)
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err == nil {
		t.Fatal("/sys/fs/cgroup/memory exists: a v1 hierarchy in the node")
	}
	e := harness.SetupOpts(t, nodeOpts(work), nil)
	// Job A spans the cases: nothing of any step may be left at the end.
	e.NothingLeft(t)
	img := "--microvm=" + e.Image

	// Job A: one step that fills 200 MiB of its guest's memory and waits.
	outA := "/tmp/cgv2-job-a.out"
	jobA, err := e.C.Sbatch(context.Background(), cluster.TestUser,
		"#!/bin/sh\nexec srun "+img+" sh -c 'dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>/dev/null && echo filled && sleep 900'\n",
		"--mem=700", "-o", outA)
	if err != nil {
		t.Fatalf("sbatch job A: %v", err)
	}
	// Before the "nothing left" check (cleanups run last first): the
	// job's output file is the test's, not a step's.
	t.Cleanup(func() {
		_ = e.C.Scancel(context.Background(), strconv.Itoa(jobA))
		_ = os.Remove(outA)
	})
	sbA := waitRunning(t, e, jobA, outA, "filled")

	var stepDir string
	t.Run("the sandbox's processes are in the step's cgroup", func(t *testing.T) {
		procs := descendants(sbA.SupervisorPid)
		if len(procs) < 2 {
			t.Fatalf("supervisor %d has no children: %v", sbA.SupervisorPid, procs)
		}
		vmmSeen := false
		for _, pid := range procs {
			path, err := unifiedPath(pid)
			if err != nil {
				t.Errorf("pid %d: %v", pid, err)
				continue
			}
			if !cgroup.InStep(path, uint32(jobA), 0) {
				t.Errorf("pid %d (%s) is in %s, outside job %d step 0", pid, comm(pid), path, jobA)
			}
			if pid == sbA.VMMPid {
				vmmSeen = true
				stepDir = stepOf(path)
			}
			// The VMM has the tasks' OOM standing, not slurmstepd's -1000.
			if adj := strings.TrimSpace(readFile(t, fmt.Sprintf("/proc/%d/oom_score_adj", pid))); pid == sbA.VMMPid && adj != "0" {
				t.Errorf("the VMM (pid %d) has oom_score_adj %s, want 0 as the step's tasks have", pid, adj)
			}
			t.Logf("pid %d %-16s %s", pid, comm(pid), path)
		}
		if !vmmSeen {
			t.Fatalf("the VMM (pid %d) is not a descendant of the supervisor %d (%v)", sbA.VMMPid, sbA.SupervisorPid, procs)
		}
	})
	t.Run("the guest's memory counts against the step", func(t *testing.T) {
		if stepDir == "" {
			t.Fatal("no step cgroup: the case before failed")
		}
		cur := readUint(t, filepath.Join("/sys/fs/cgroup", stepDir, "memory.current"))
		lim, err := cgroup.MemoryLimit(sbA.VMMPid, cgroup.Roots{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("measured: step %s memory.current %d MiB, VMM VmRSS %d MiB, limit on the VMM %d MiB (%s)", stepDir, cur>>20, vmRSS(sbA.VMMPid)>>20, lim.MiB(), lim.File)
		if cur < 200<<20 {
			t.Errorf("the step's memory.current is %d MiB while its guest holds 200 MiB: the VMM's memory is not charged to the step", cur>>20)
		}
		if lim.MiB() != 700 {
			t.Errorf("the memory limit on the VMM is %d MiB (%s), want the job's --mem=700", lim.MiB(), lim.File)
		}
	})
	t.Run("a step that exceeds --mem fails alone", func(t *testing.T) {
		// The guest gets 600-32 MiB; dd's 450 MiB buffer plus the guest
		// kernel plus the VMM's own memory pass the step's 600 MiB.
		// Its own deadline: a guest under nested TCG boots in minutes.
		ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
		defer cancel()
		t0 := time.Now()
		out, errOut, code, err := e.C.Srun(ctx, cluster.TestUser, "--mem=600", img, "sh", "-c", "dd if=/dev/zero of=/dev/null bs=450M count=1 2>/dev/null; echo survived")
		if err != nil && code < 0 {
			t.Fatalf("srun: %v (after %s)\nstderr: %s", err, time.Since(t0).Round(time.Second), errOut)
		}
		t.Logf("measured: exceeding step: exit %d after %s, stdout %q, stderr %q", code, time.Since(t0).Round(time.Second), out, errOut)
		if code == 0 || strings.Contains(out, "survived") {
			t.Errorf("the step that exceeds --mem=600 exited %d with %q: want it killed", code, out)
		}
		if !strings.Contains(errOut, "killed by the kernel's out-of-memory killer") || !strings.Contains(errOut, "(600 MiB)") {
			t.Errorf("srun's stderr does not say the step's memory cgroup killed the VMM at --mem=600: %q", errOut)
		}
		// The one the kernel killed is the VMM, the step's memory.
		if out, err := exec.Command("dmesg").CombinedOutput(); err != nil {
			t.Errorf("dmesg: %v: %s", err, out)
		} else if k := regexp.MustCompile(`Memory cgroup out of memory: Killed process \d+ \(([^)]*)\)`).FindAllStringSubmatch(string(out), -1); len(k) == 0 || k[len(k)-1][1] != "qemu-system-x86" {
			t.Errorf("the memory cgroup's OOM kill did not hit the VMM: %v", k)
		}
		if !alive(sbA.SupervisorPid) || !alive(sbA.VMMPid) {
			t.Errorf("job %d's sandbox died with the other step (supervisor %d alive %v, VMM %d alive %v)",
				jobA, sbA.SupervisorPid, alive(sbA.SupervisorPid), sbA.VMMPid, alive(sbA.VMMPid))
		}
	})
	t.Run("scancel leaves nothing", func(t *testing.T) {
		procs := descendants(sbA.SupervisorPid)
		t0 := time.Now()
		if err := e.C.Scancel(context.Background(), strconv.Itoa(jobA)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.C.WaitJob(context.Background(), jobA); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for _, pid := range procs {
			for alive(pid) && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			if alive(pid) {
				t.Errorf("pid %d (%s) of job %d's sandbox outlived scancel", pid, comm(pid), jobA)
			}
		}
		t.Logf("measured: scancel to the last sandbox process gone: %s", time.Since(t0).Round(10*time.Millisecond))
		e.WaitClean(t, jobA)
		for time.Now().Before(deadline) && len(jobDirs(jobA)) > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		if d := jobDirs(jobA); len(d) > 0 {
			t.Errorf("job %d's cgroups are left: %v", jobA, d)
		}
	})
}

// waitRunning waits (12 min: nested TCG; 2 to 7 min measured) until job's step 0 sandbox runs and
// out holds marker, and returns the sandbox.
func waitRunning(t *testing.T, e *harness.Env, job int, out, marker string) inventory.Sandbox {
	t.Helper()
	start := time.Now()
	deadline := start.Add(12 * time.Minute)
	next := start.Add(30 * time.Second)
	for {
		list, _ := inventory.List(harness.RuntimeDir, time.Now())
		b, _ := os.ReadFile(out)
		for _, sb := range list {
			if sb.Job == uint32(job) && sb.Step == 0 && sb.VMMPid > 0 && strings.Contains(string(b), marker) {
				t.Logf("measured: job %d's step ran in its guest %s after sbatch", job, time.Since(start).Round(time.Second))
				return sb
			}
		}
		if time.Now().After(next) {
			// Progress, for a slow nested boot: the step's phase.
			next = next.Add(30 * time.Second)
			for _, sb := range list {
				if sb.Job == uint32(job) {
					t.Logf("%s: job %d step %d phase %s", time.Since(start).Round(time.Second), sb.Job, sb.Step, sb.Phase)
				}
			}
		}
		if time.Now().After(deadline) {
			st, _ := e.C.Squeue(context.Background())
			t.Fatalf("job %d: no running sandbox with %q in %s after 12 min; output %q; squeue:\n%s\nslurmd log:\n%s",
				job, marker, out, b, st, e.C.LogTail("slurmd", 40))
		}
		time.Sleep(time.Second)
	}
}

// descendants is pid and every process below it.
func descendants(pid int) []int {
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		me, _ := strconv.Atoi(strings.Fields(s)[0])
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], me)
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// unifiedPath is the "0::" line of /proc/<pid>/cgroup.
func unifiedPath(pid int) (string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("no unified cgroup line in /proc/%d/cgroup", pid)
}

// stepOf cuts a cgroup path below ".../job_J/step_S" back to it.
func stepOf(path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		if strings.HasPrefix(p, "step_") {
			return strings.Join(parts[:i+1], "/")
		}
	}
	return path
}

// jobDirs lists the cgroup directories named job_<job> under the unified root.
func jobDirs(job int) []string {
	var out []string
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if d.Name() == "job_"+strconv.Itoa(job) {
			out = append(out, p)
			return filepath.SkipDir
		}
		return nil
	})
	return out
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// vmRSS is the resident memory of pid in bytes (0 when unknown).
func vmRSS(pid int) uint64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n << 10
		}
	}
	return 0
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func readUint(t *testing.T, p string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(strings.TrimSpace(readFile(t, p)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	return n
}
