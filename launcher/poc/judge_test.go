package poc

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/fault"
	"github.com/slurm-microvm/slurm-microvm/launcher/poc/report"
)

// Each judgement FAILs on the evidence a broken build leaves, and passes
// on what a sound one leaves: a check that cannot fail is a defect.

func TestJudgeCleanup(t *testing.T) {
	for _, tc := range []struct {
		name  string
		left  []string
		took  time.Duration
		state string
		fails int
	}{
		{"clean", nil, time.Second, "idle", 0},
		{"leftover process", []string{"process 42 (/usr/bin/qemu-system-x86_64): qemu"}, time.Minute, "idle", 1},
		{"slow teardown", nil, 2 * time.Minute, "idle", 1},
		{"drained", nil, time.Second, "drained", 1},
		{"draining and leftover", []string{"state /run/x/1.0.0.n"}, time.Second, "draining", 2},
		{"down", nil, time.Second, "down*", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judgeCleanup(tc.left, tc.took, 60*time.Second, tc.state); len(got) != tc.fails {
				t.Errorf("judgeCleanup = %q, want %d failures", got, tc.fails)
			}
		})
	}
}

func TestJudgeFiles(t *testing.T) {
	secret := []byte("data 1234\n")
	h := fmt.Sprintf("%x", sha256.Sum256(secret))
	victim := map[string]string{h: "/home/b/.slurm-microvm-poc/r/own/data.txt"}
	mounts := []string{"other-tree", "own-symlink"}
	ok := "POC-OWN ok\nPOC-RC other-tree 1\nPOC-RC own-symlink 1\n"
	for _, tc := range []struct {
		name, out string
		want      string // substring of a failure; "" : none
	}{
		{"sound", ok, ""},
		{"own share unreadable", strings.Replace(ok, "POC-OWN ok\n", "", 1), "its own share"},
		{"read through a planted symlink", ok + "POC-READ /data/link-file " + h + "\n", "through /data/link-file"},
		{"other tree mounted", strings.Replace(ok, "other-tree 1", "other-tree 0", 1), "other-tree was accepted"},
		{"attempt did not run", strings.Replace(ok, "POC-RC own-symlink 1\n", "", 1), "no result"},
		{"read-only share written (share exported read-write)", ok + "POC-WROTE\n", "read-only share"},
		{"own file read is fine", ok + "POC-READ /data/data.txt " + strings.Repeat("0", 64) + "\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(judgeFiles(tc.out, victim, mounts), "; ")
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("judgeFiles = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestJudgeMemory(t *testing.T) {
	oom := "slurm-microvm: the task was killed by the guest's out-of-memory killer: the step's memory is exhausted\n"
	for _, tc := range []struct {
		name     string
		hog      Job
		hogOut   string
		other    Job
		otherOut string
		fails    int
	}{
		{"sound", Job{State: "FAILED"}, oom, Job{State: "COMPLETED"}, "POC-DONE\n", 0},
		{"no reason, only a code", Job{State: "FAILED", ExitCode: "0:9"}, "srun: error: task 0: Killed\n", Job{State: "COMPLETED"}, "POC-DONE\n", 1},
		{"hog completed", Job{State: "COMPLETED"}, "", Job{State: "COMPLETED"}, "POC-DONE\n", 2},
		{"neighbour killed too", Job{State: "FAILED"}, oom, Job{State: "FAILED"}, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judgeMemory(tc.hog, tc.hogOut, tc.other, tc.otherOut); len(got) != tc.fails {
				t.Errorf("judgeMemory = %q, want %d failures", got, tc.fails)
			}
		})
	}
}

func TestJudgeCPUs(t *testing.T) {
	for _, tc := range []struct {
		name                         string
		guest, vmm, allocated, nodes int
		fails                        int
	}{
		{"sound", 1, 1, 1, 4, 0},
		{"guest sees every CPU", 4, 1, 1, 4, 2},
		{"VMM not confined", 1, 4, 1, 4, 1},
		{"not measured", 0, 1, 1, 4, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judgeCPUs(tc.guest, tc.vmm, tc.allocated, tc.nodes); len(got) != tc.fails {
				t.Errorf("judgeCPUs = %q, want %d failures", got, tc.fails)
			}
		})
	}
}

func TestJudgePhases(t *testing.T) {
	var all []string
	for _, p := range Phases {
		all = append(all, fmt.Sprintf("time=x level=INFO msg=phase phase=%s ms=12", p))
	}
	if got := judgePhases("log", strings.Join(all, "\n")); got != nil {
		t.Errorf("every phase present: %q", got)
	}
	if got := judgePhases("log", strings.Join(all[1:], "\n")); len(got) != 1 || !strings.Contains(got[0], Phases[0]) {
		t.Errorf("phase %s missing: %q", Phases[0], got)
	}
	if got := judgePhases("log", "msg=phase phase=image"); len(got) != 1 {
		t.Errorf("a phase without its duration counts as missing: %q", got)
	}
}

func TestJudgeTenantData(t *testing.T) {
	markers := []string{"0123456789abcdef0123456789abcdef"}
	files := map[string]string{"/var/log/slurm-microvm/1.0.0.log": "msg=phase phase=boot ms=3\n"}
	if got := judgeTenantData(files, markers); got != nil {
		t.Errorf("clean logs: %q", got)
	}
	files["/home/a/out/x.out"] = "slurm-microvm: env SMV_POC_SECRET=" + markers[0] + "\n" // log-env build
	if got := judgeTenantData(files, markers); len(got) != 1 || !strings.Contains(got[0], "x.out") {
		t.Errorf("leaked secret: %q", got)
	}
}

func TestCheckpointOK(t *testing.T) {
	data := []byte("checkpoint data\x00\x01")
	good := append(append(append([]byte{}, data...), '\n'), []byte(fmt.Sprintf("%x\n", sha256.Sum256(data)))...)
	for _, tc := range []struct {
		name string
		b    []byte
		want bool
	}{
		{"complete", good, true},
		{"truncated", good[:len(good)-10], false},
		{"partial data", good[3:], false},
		{"empty", nil, false},
		{"zero-filled tail", append(append([]byte{}, good[:len(good)-66]...), make([]byte, 66)...), false},
	} {
		if got := checkpointOK(tc.b); got != tc.want {
			t.Errorf("%s: checkpointOK = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestCPUCount(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0-3": 4, "0-1,4,6-7": 5, "": 0, "3-1": 0} {
		if got := cpuCount(in); got != want {
			t.Errorf("cpuCount(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestGPURequest(t *testing.T) {
	for _, tc := range []struct {
		in     string
		prefix string
		n      int
		bad    bool
	}{
		{"gpu:2", "gpu", 2, false},
		{"gpu:standin:2", "gpu:standin", 2, false},
		{"gpu", "", 0, true},
		{"nic:1", "", 0, true},
		{"gpu:a100:0", "", 0, true},
		{"gpu:x:y:1", "", 0, true},
	} {
		p, n, err := gpuRequest(tc.in)
		if (err != nil) != tc.bad || p != tc.prefix || n != tc.n {
			t.Errorf("gpuRequest(%q) = %q, %d, %v", tc.in, p, n, err)
		}
		if err != nil && !strings.Contains(err.Error(), tc.in) {
			t.Errorf("gpuRequest(%q): the error %q does not name the input", tc.in, err)
		}
	}
	if got := nodeGPUs("gpu:fake:2(S:0),gpu:standin:2"); got != "gpu:fake:2" {
		t.Errorf("nodeGPUs = %q", got)
	}
}

func TestDrained(t *testing.T) {
	for st, want := range map[string]bool{"idle": false, "mixed": false, "allocated": false, "drained": true, "draining": true, "down*": true, "fail": true, "idle~": false} {
		if Drained(st) != want {
			t.Errorf("Drained(%q) = %v", st, !want)
		}
	}
}

func TestStartTimes(t *testing.T) {
	ms, failed := startTimes("POC-START-MS 2300 0\nnoise\nPOC-START-MS 2500 1\n")
	if len(ms) != 2 || ms[0] != 2300 || ms[1] != 2500 || failed != 1 {
		t.Errorf("startTimes = %v, %d", ms, failed)
	}
}

// TestExpectations: each fault check's judgement passes on the outcome a
// sound build gives and FAILs on the one a broken build gives.
func TestExpectations(t *testing.T) {
	bound := 30 * time.Second
	for _, tc := range []struct {
		id         string
		good, bad  outcome
		wantReason string
	}{
		{"fault.exit-0", outcome{Job: Job{State: "COMPLETED", ExitCode: "0:0"}}, outcome{Job: Job{State: "FAILED", ExitCode: "125:0"}}, "want COMPLETED"},
		{"fault.exit-n", outcome{Job: Job{State: "FAILED", ExitCode: "7:0"}}, outcome{Job: Job{State: "FAILED", ExitCode: "1:0"}}, "want FAILED 7:0"},
		{"fault.signal", outcome{Job: Job{State: "FAILED"}, Out: "srun: error: vm: task 0: Terminated\n"}, outcome{Job: Job{State: "FAILED", ExitCode: "143:0"}}, "Terminated"},
		{"fault.scancel-step", outcome{Job: Job{State: "COMPLETED"}, Out: "POC-UP\nPOC-AFTER-STEP 137\n"}, outcome{Job: Job{State: "CANCELLED"}, Out: "POC-UP\n"}, "go on"},
		{"fault.scancel-job", outcome{Job: Job{State: "CANCELLED"}, Out: "POC-TRAPPED-TERM\n"}, outcome{Job: Job{State: "CANCELLED"}, Out: "POC-UP\n"}, "TERM trap"},
		{"fault.time-limit", outcome{Job: Job{State: "TIMEOUT"}, Out: "POC-TRAPPED-USR1\nPOC-TRAPPED-TERM\n"}, outcome{Job: Job{State: "TIMEOUT"}, Out: "POC-TRAPPED-TERM\n"}, "--signal"},
		{"fault.vmm-killed", outcome{Job: Job{State: "FAILED"}, Out: "slurm-microvm: the microVM's VMM exited: killed by signal 9 (SIGKILL)\n", Took: 2 * time.Second, Bound: bound},
			outcome{Job: Job{State: "FAILED"}, Out: "slurm-microvm: the microVM's VMM exited\n", Took: time.Minute, Bound: bound}, "after the kill"},
		{"fault.supervisor-killed", outcome{Job: Job{State: "FAILED"}, Took: time.Second, Bound: bound}, outcome{Job: Job{State: "COMPLETED"}, Took: time.Second, Bound: bound}, "ended COMPLETED"},
		{"fault.exec-killed", outcome{Job: Job{State: "FAILED"}, Took: time.Second, Bound: bound}, outcome{Job: Job{State: "FAILED"}, Took: 5 * time.Minute, Bound: bound}, "after the kill"},
		{"fault.agent-hung", outcome{Job: Job{State: "FAILED"}, Out: "the guest agent did not answer for 15s", Took: 20 * time.Second, Bound: bound},
			outcome{Job: Job{State: "FAILED"}, Out: "srun: error: task 0: Killed", Took: 20 * time.Second, Bound: bound}, "guest agent"},
		{"fault.start", outcome{Job: Job{State: "FAILED"}, Out: `slurm-microvm: start the VMM: fault injected at stage "vmm" (smv_faults build)`, Stage: "vmm"},
			outcome{Job: Job{State: "FAILED"}, Out: `slurm-microvm: start the VMM: fault injected at stage "image"`, Stage: "vmm"}, `stage "vmm"`},
		{"fault.slurmstepd-killed", outcome{Job: Job{State: "CANCELLED"}}, outcome{Job: Job{State: "COMPLETED"}}, "ended COMPLETED"},
	} {
		t.Run(tc.id, func(t *testing.T) {
			judge, ok := expectations[tc.id]
			if !ok {
				t.Fatalf("no expectation for %s", tc.id)
			}
			if got := judge(tc.good); got != nil {
				t.Errorf("sound outcome judged %q", got)
			}
			if got := strings.Join(judge(tc.bad), "; "); !strings.Contains(got, tc.wantReason) {
				t.Errorf("broken outcome judged %q, want a failure about %q", got, tc.wantReason)
			}
		})
	}
	// Every fault check has a judgement tested here or its own.
	own := map[string]bool{"fault.requeue": true, "fault.checkpoint": true}
	for _, id := range CheckIDs() {
		if !strings.HasPrefix(id, "fault.") || own[id] || strings.HasPrefix(id, "fault.start-") {
			continue
		}
		if _, ok := expectations[id]; !ok {
			t.Errorf("fault check %s has no entry in expectations", id)
		}
	}
	if got := judgeRequeue(true, nil); got != nil {
		t.Errorf("judgeRequeue sound: %q", got)
	}
	if got := judgeRequeue(true, []string{"process 42"}); len(got) != 1 {
		t.Errorf("judgeRequeue with the first run's process left: %q", got)
	}
	if got := judgeRequeue(false, nil); len(got) != 1 {
		t.Errorf("judgeRequeue without a second run: %q", got)
	}
}

// TestAdminLogSinceRun: the admin's log of a job id is read from this
// run on; an older job that had the same id (job ids start over with a
// new cluster) is not this run's.
func TestAdminLogSinceRun(t *testing.T) {
	dir := t.TempDir()
	started := time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC)
	old := "time=2026-12-01T16:00:00.000Z level=INFO msg=\"converted image\"\n"
	now := "time=2026-12-01T18:00:05.000Z level=INFO msg=phase phase=boot ms=3\n"
	if err := os.WriteFile(filepath.Join(dir, "7.0.0.n1.log"), []byte(old+now), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "70.0.0.n1.log"), []byte(now+"other job\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &run{o: Options{Config: &config.Config{Log: config.Log{Dir: dir}}}, rep: &report.Report{Started: started}}
	if got := r.adminLog(7); got != now {
		t.Errorf("adminLog(7) = %q, want only %q", got, now)
	}
	r.o.Config.Log.Dir = ""
	if got := r.adminLog(7); got != "" {
		t.Errorf("[log] dir off: %q", got)
	}
}

func TestParseJob(t *testing.T) {
	j, err := ParseJob(7, "JobId=7 JobName=x UserId=a(1001) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) Restarts=1 ExitCode=0:15 StdOut=/home/a/x-7.out\nJobId=8 JobState=RUNNING\n")
	if err != nil || j.State != "TIMEOUT" || j.Reason != "TimeLimit" || j.Restarts != 1 || j.ExitCode != "0:15" || j.StdOut != "/home/a/x-7.out" {
		t.Errorf("ParseJob = %+v, %v", j, err)
	}
	if _, err := ParseJob(9, "slurm_load_jobs error: Invalid job id specified"); err == nil || !strings.Contains(err.Error(), "no JobState") {
		t.Errorf("no record: %v", err)
	}
	if !Terminal("OUT_OF_MEMORY") || Terminal("COMPLETING") || Terminal("RUNNING") {
		t.Error("Terminal")
	}
}

// TestReadRegular: the poc (root) reads a tenant's file only when it is a
// regular file of that tenant, never through a symlink the tenant
// planted, never blocking on a FIFO, never more than asked.
func TestReadRegular(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "root-only")
	if err := os.WriteFile(secret, []byte("root secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "out.txt")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	if b, err := readRegular(link, 100, nil); err == nil {
		t.Errorf("read %q through a symlink", b)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := readRegular(fifo, 100, nil); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("read a FIFO")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("readRegular blocked on a FIFO")
	}
	if b, err := readRegular("/dev/zero", 100, nil); err == nil {
		t.Errorf("read %d bytes of a device", len(b))
	}
	nobody := uint32(65534)
	if _, err := readRegular(secret, 100, &nobody); err == nil {
		t.Error("read a file not owned by the given uid")
	}
	if b, err := readRegular(secret, 4, nil); err != nil || string(b) != "root" {
		t.Errorf("limited read = %q, %v", b, err)
	}
}

// TestRunRefusesBadOptions: what an admin types is checked before any job
// runs, each error naming the input and the rule.
func TestRunRefusesBadOptions(t *testing.T) {
	cfg := &config.Config{}
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no image", Options{Config: cfg, Users: [2]string{"a", "b"}}, "--image"},
		{"one account twice", Options{Config: cfg, Image: "x", Users: [2]string{"a", "a"}}, "two distinct"},
		{"empty check entry", Options{Config: cfg, Image: "x", Users: [2]string{"a", "b"}, Only: []string{"isolation", ""}}, "empty entry"},
		{"unknown check", Options{Config: cfg, Image: "x", Users: [2]string{"a", "b"}, Only: []string{"nosuch"}}, `"nosuch"`},
		{"root as a tenant", Options{Config: cfg, Image: "x", Users: [2]string{"root", "daemon"}}, "root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if os.Geteuid() != 0 {
				tc.want = "as root"
			}
			_, err := Run(t.Context(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestOnThisHost(t *testing.T) {
	h, _ := os.Hostname()
	short, _, _ := strings.Cut(h, ".")
	if err := onThisHost(NodeInfo{Name: "n9", Hostname: short}); err != nil {
		t.Errorf("NodeHostname %s: %v", short, err)
	}
	if err := onThisHost(NodeInfo{Name: "n9", Addr: "127.0.0.1"}); err != nil {
		t.Errorf("NodeAddr 127.0.0.1: %v", err)
	}
	if err := onThisHost(NodeInfo{Name: "elsewhere-x", Hostname: "elsewhere-x", Addr: "192.0.2.77"}); err == nil || !strings.Contains(err.Error(), "192.0.2.77") {
		t.Errorf("another node: %v", err)
	}
}

func TestPluginLauncher(t *testing.T) {
	dir := t.TempDir()
	inc := filepath.Join(dir, "plugstack.conf.d")
	if err := os.Mkdir(inc, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"plugstack.conf":          "# site\noptional /usr/lib/slurm/other.so\ninclude " + inc + "/*.conf\n",
		"plugstack.conf.d/a.conf": "required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_microvm.so config=/etc/slurm/microvm.toml launcher=/opt/smv/bin/slurm-microvm # ours\n",
		"default.conf":            "required spank_microvm.so\n",
		"none.conf":               "optional /usr/lib/slurm/other.so\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for conf, want := range map[string]string{"plugstack.conf": "/opt/smv/bin/slurm-microvm", "default.conf": DefaultLauncher, "none.conf": "", "absent.conf": ""} {
		if got := launcherIn(filepath.Join(dir, conf), 0); got != want {
			t.Errorf("%s: launcher %q, want %q", conf, got, want)
		}
	}
	// This test binary has no smv_faults tag unless built with it.
	exe, _ := os.Executable()
	if faults, known := hasFaults(exe); !known || faults != fault.Enabled {
		t.Errorf("hasFaults(test binary) = %v, %v; want %v, true", faults, known, fault.Enabled)
	}
	if _, known := hasFaults("/bin/sh"); known {
		t.Error("a non-Go binary's build information was read")
	}
}

func TestJudgeGPUs(t *testing.T) {
	done := Job{State: "COMPLETED"}
	for _, tc := range []struct {
		name  string
		n     int
		jb    Job
		out   string
		fails bool
	}{
		{"none asked, none seen", 0, done, "POC-GPUS 0 CVD=\n", false},
		{"two asked, two seen", 2, done, "POC-GPUS 2 CVD=0,1\n", false},
		{"none asked, one leaked in", 0, done, "POC-GPUS 1 CVD=\n", true},
		{"one asked, all seen (device cgroup ignored)", 1, done, "POC-GPUS 4 CVD=0\n", true},
		{"visible devices wrong", 2, done, "POC-GPUS 2 CVD=0\n", true},
		{"step failed", 1, Job{State: "FAILED", ExitCode: "125:0"}, "", true},
		{"no answer", 1, done, "", true},
	} {
		if got := judgeGPUs(tc.n, tc.jb, tc.out); (got != nil) != tc.fails {
			t.Errorf("%s: judgeGPUs = %q", tc.name, got)
		}
	}
}

func TestJudgeNetwork(t *testing.T) {
	done := Job{State: "COMPLETED"}
	for _, tc := range []struct {
		name  string
		jb    Job
		out   string
		fails bool
	}{
		{"loopback only", done, "POC-IF lo\nPOC-NET-DONE\n", false},
		{"reached the node's slurmd", done, "POC-IF lo\nPOC-IF eth0\nPOC-REACHED 10.0.0.1\nPOC-NET-DONE\n", true},
		{"no interface listed", done, "POC-NET-DONE\n", true},
		{"step failed", Job{State: "FAILED"}, "", true},
	} {
		if got := judgeNetwork(tc.jb, tc.out, "6818"); (got != nil) != tc.fails {
			t.Errorf("%s: judgeNetwork = %q", tc.name, got)
		}
	}
}
