package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// pendingReason is what Slurm 22.05 gives a job held back by its account's
// GrpTRES=gres/gpu=N (squeue %r, scontrol Reason; WAIT_ASSOC_GRP_GRES).
const pendingReason = "AssocGrpGRES"

// TestGPUQuota: on a cluster with accounting (slurmdbd, MariaDB), two teams
// are two Slurm accounts, each with one local user; team A may hold one GPU
// at a time (GrpTRES=gres/gpu=1). Team A's first one-GPU job runs, its
// second stays PENDING with Slurm's reason while a GPU is free, and team B's
// GPU job runs and completes meanwhile. The accounting records show the
// GPUs: AllocTRES of each job has gres/gpu=1, and slurmctld's association
// manager has team A at its limit.
func TestGPUQuota(t *testing.T) {
	e := harness.SetupWith(t, func(o *cluster.Options) { o.Accounting = true })
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	userA := cluster.TestUser
	uB := ensureUser(t, secondUser)
	userB := uB.Username

	sacctmgr := func(t *testing.T, args ...string) {
		t.Helper()
		out, errOut, code, err := e.C.Run(ctx, "", "sacctmgr", append([]string{"-i"}, args...)...)
		if err != nil || code != 0 {
			t.Fatalf("sacctmgr %s: exit %d, %v: %s%s", strings.Join(args, " "), code, err, out, errOut)
		}
	}
	// submit submits a job that t's end cancels (before e.Run's check
	// that nothing is left; the accounts and associations go with the
	// cluster's database).
	submit := func(t *testing.T, user, script string, args ...string) int {
		t.Helper()
		j, err := e.C.Sbatch(ctx, user, script, args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = e.C.Scancel(context.Background(), strconv.Itoa(j))
			_, _ = e.C.WaitJob(context.Background(), j)
		})
		return j
	}

	if !e.Run(t, "teams as accounts, team A capped at one GPU", func(t *testing.T) {
		sacctmgr(t, "add", "account", "team-a,team-b", "Cluster=microvm-test", "Description=e2e team", "Organization=e2e")
		sacctmgr(t, "add", "user", userA, "Account=team-a", "Cluster=microvm-test")
		sacctmgr(t, "add", "user", userB, "Account=team-b", "Cluster=microvm-test")
		sacctmgr(t, "modify", "account", "team-a", "set", "GrpTRES=gres/gpu=1")
		// slurmdbd pushes the change to slurmctld.
		waitFor(t, ctx, "slurmctld to know team-a's GrpTRES gres/gpu=1", func() (bool, string) {
			out, _, _, _ := e.C.Run(ctx, "", "scontrol", "show", "assoc_mgr", "accounts=team-a", "users="+userA, "flags=assoc")
			return strings.Contains(out, "gres/gpu=1("), out
		})
	}) {
		return
	}

	e.Run(t, "team A at its quota pends with Slurm's reason while team B's GPU job runs; the records show the GPUs", func(t *testing.T) {
		// Team A: plain (not microVM) steps that hold their GPU.
		a1 := submit(t, userA, "#!/bin/sh\nexec sleep 300\n", "--gres=gpu:fake:1", "--output=/dev/null")
		if _, err := e.C.WaitJobState(ctx, a1, "RUNNING"); err != nil {
			t.Fatal(err)
		}
		a2 := submit(t, userA, "#!/bin/sh\nexec sleep 300\n", "--gres=gpu:fake:1", "--output=/dev/null")
		// The node has two GPUs, one free: only the quota holds a2 back.
		waitFor(t, ctx, fmt.Sprintf("job %d PENDING with reason %s", a2, pendingReason), func() (bool, string) {
			j, err := e.C.Job(ctx, a2)
			return err == nil && j.State == "PENDING" && j.Reason == pendingReason, j.Raw
		})
		q, err := e.C.Squeue(ctx, "-h", "-j", strconv.Itoa(a2), "-o", "%T %r")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := strings.TrimSpace(q), "PENDING "+pendingReason; got != want {
			t.Errorf("squeue for job %d: %q, want %q (what the user sees)", a2, got, want)
		}

		// Team B: one GPU job whose step runs on it.
		// A microVM step on a stand-in GPU (gres Type=standin, booted
		// without VFIO by the e2e build) with the node's (stand-in) driver.
		harness.InstallStandinDriver(t, e)
		gres := "standin"
		step := "srun --microvm=" + e.Image + " --gres=gpu:standin:1 sh -c 'echo TEAM-B-STEP $SLURM_JOB_ID $(cat /proc/sys/kernel/random/boot_id) $(ls /dev/nvidia0)'"
		bOut := filepath.Join(uB.HomeDir, "quota-team-b.out")
		t.Cleanup(func() { os.Remove(bOut) })
		b := submit(t, userB, "#!/bin/sh\n"+step+"\n", "--gres=gpu:"+gres+":1", "--output="+bOut)
		j, err := e.C.WaitJob(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := os.ReadFile(bOut)
		if j.State != "COMPLETED" || j.ExitCode != "0:0" {
			t.Fatalf("team B's job %d: %s exit %s (reason %s), want COMPLETED 0:0; output:\n%s", b, j.State, j.ExitCode, j.Reason, out)
		}
		f := strings.Fields(string(out))
		if len(f) != 4 || f[0] != "TEAM-B-STEP" || f[1] != strconv.Itoa(b) || f[3] != "/dev/nvidia0" {
			t.Fatalf("team B's job output %q: want TEAM-B-STEP %d <boot id> /dev/nvidia0", out, b)
		}
		if f[2] == e.HostBoot {
			t.Errorf("team B's step ran on the host (boot id %s), want a microVM", f[2])
		}
		// Team A's second job is still held by the quota, not by anything else.
		if j, err := e.C.Job(ctx, a2); err != nil || j.State != "PENDING" || j.Reason != pendingReason {
			t.Errorf("job %d after team B's job: %s reason %s (%v), want PENDING %s", a2, j.State, j.Reason, err, pendingReason)
		}

		// The accounting records, while team A's first job holds its GPU.
		for _, tc := range []struct {
			job   int
			state string
		}{{a1, "RUNNING"}, {b, "COMPLETED"}} {
			// slurmctld sends job records to slurmdbd asynchronously.
			waitFor(t, ctx, fmt.Sprintf("sacct to show job %d %s with gres/gpu=1", tc.job, tc.state), func() (bool, string) {
				out, _, _, _ := e.C.Run(ctx, "", "sacct", "-j", strconv.Itoa(tc.job), "-X", "-n", "-P", "-o", "State,Account,AllocTRES")
				line := strings.TrimSpace(out)
				return strings.HasPrefix(line, tc.state+"|") && strings.Contains(line, "gres/gpu=1"), line
			})
		}
		users, _, _, _ := e.C.Run(ctx, "", "sacct", "-j", strconv.Itoa(a1)+","+strconv.Itoa(b), "-X", "-n", "-P", "-o", "JobID,Account,User")
		for _, want := range []string{fmt.Sprintf("%d|team-a|%s", a1, userA), fmt.Sprintf("%d|team-b|%s", b, userB)} {
			if !strings.Contains(users, want) {
				t.Errorf("sacct JobID,Account,User:\n%s\nwant a line %q", users, want)
			}
		}
		// Team A's account: limit gres/gpu=1, in use 1 ("limit(used)").
		am, _, _, _ := e.C.Run(ctx, "", "scontrol", "show", "assoc_mgr", "accounts=team-a", "flags=assoc")
		var acct string
		for _, line := range strings.Split(am, "\n") {
			if strings.Contains(line, "Account=team-a UserName= ") {
				acct = line
			}
		}
		if acct == "" {
			t.Fatalf("scontrol show assoc_mgr: no association of account team-a:\n%s", am)
		}
		// The GrpTRES line follows the association's ClusterName=... line.
		rest := am[strings.Index(am, acct):]
		if i := strings.Index(rest, "GrpTRES="); i < 0 || !strings.Contains(strings.Fields(rest[i:])[0], "gres/gpu=1(1)") {
			t.Errorf("scontrol show assoc_mgr for team-a:\n%s\nwant GrpTRES with gres/gpu=1(1): limit 1, 1 in use", rest)
		}
	})
}

// waitFor polls cond every 200 ms for up to 60 s (bounded by ctx), failing t
// with what and cond's last note.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok, note := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("waiting for %s: last seen:\n%s", what, note)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
