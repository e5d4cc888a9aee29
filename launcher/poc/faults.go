package poc

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/fault"
	"github.com/slurm-microvm/slurm-microvm/launcher/poc/report"
	"github.com/slurm-microvm/slurm-microvm/launcher/residue"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// trapLoop is a workload that prints POC-UP and runs for up to ten
// minutes; for each of sigs its trap prints POC-TRAPPED-<SIG> and, when
// mark is set, writes that line to the file mark-<SIG> (in a writable
// share: a trap's output cannot reach a task that srun already killed,
// its side effects can); the TERM trap then exits 0, as a workload that
// saves its state on TERM does.
func trapLoop(mark string, sigs ...string) string {
	s := ""
	for _, sig := range sigs {
		then := ""
		if mark != "" {
			then += "; echo POC-TRAPPED-" + sig + " > " + mark + "-" + sig
		}
		if sig == "TERM" {
			then += "; exit 0"
		}
		s += "trap 'echo POC-TRAPPED-" + sig + then + "' " + sig + "; "
	}
	return s + "echo POC-UP; i=0; while [ $i -lt 3000 ]; do sleep 0.2; i=$((i+1)); done"
}

// faultSpec is one fault check: a job, an action once its sandbox is
// ready and the workload is up, and the expected outcome.
type faultSpec struct {
	body string   // the batch script
	args []string // more sbatch options
	// hold: submit held, call beforeRelease with the job id, then release.
	beforeRelease func(id int) error
	// action runs once the step's sandbox is ready (dir) and its output
	// holds POC-UP (nil: none, the job runs to its end).
	action func(ctx context.Context, j *job, dir string) error
	// expect judges the ended job; took is from the action to the job's
	// end. nil: expectations[check id] (start faults: "fault.start").
	expect func(jb Job, out string, took time.Duration) []string
	// bound is the longest the job may take to end after the action.
	bound time.Duration
	stage fault.Stage
	// wait bounds the job's run (default 5 min).
	wait time.Duration
	// mark names the check's trap markers in the writable share
	// (ckptShare): their lines are added to the job's output.
	mark string
}

// ckptShare is the --microvm-mounts value of tenant A's writable share:
// its ckpt directory on /ckpt (the site's [mounts] writable must allow it;
// checks that need it SKIP otherwise).
func (r *run) ckptShare() string {
	return "--microvm-mounts=" + filepath.Join(r.treeOf(r.tenants[0]), "ckpt") + ":/ckpt:rw"
}

// trapStep is a job body: one step of trapLoop with its markers in the
// writable share.
func (r *run) trapStep(name string, sigs ...string) string {
	return r.srunLine(r.ckptShare(), "sh", "-c", trapLoop("/ckpt/"+name, sigs...))
}

// refusedWritable reports whether out says the writable share was
// refused by the site's mount policy (then the check SKIPs).
func refusedWritable(out string) string {
	if l := firstLineWith(out, "writable"); l != "" && !strings.Contains(out, "POC-UP") {
		return l
	}
	return ""
}

func (r *run) faultCheck(ctx context.Context, c *report.Check, name string, f faultSpec) (Job, string) {
	v := newVerdict(c)
	defer v.done()
	snap := residue.Take(r.scope)
	args := append([]string{"-t", "10", "--mem=512"}, f.args...)
	if f.beforeRelease != nil {
		args = append(args, "--hold")
	}
	j, err := r.sbatch(ctx, r.tenants[0], name, f.body, args...)
	if err != nil {
		v.fail("%v", err)
		return Job{}, ""
	}
	v.job(j)
	if f.beforeRelease != nil {
		if err := f.beforeRelease(j.id); err != nil {
			v.fail("%v", err)
		}
		if _, err := r.slurm.root(ctx, "scontrol", "release", strconv.Itoa(j.id)); err != nil {
			v.fail("%v", err)
		}
	}
	acted := time.Now()
	if f.action != nil {
		dir, err := r.waitReady(ctx, j, 0, 5*time.Minute)
		if err == nil {
			err = r.waitOutput(ctx, j, "POC-UP", 2*time.Minute)
		}
		if err == nil {
			acted = time.Now()
			err = f.action(ctx, j, dir)
		}
		if err != nil {
			v.fail("%v", err)
		}
	}
	wait := f.wait
	if wait == 0 {
		wait = 5 * time.Minute
	}
	jb, err := r.wait(ctx, j, wait)
	end := time.Now()
	if err != nil {
		v.fail("%v", err)
		_ = r.slurm.Scancel(ctx, strconv.Itoa(j.id))
		_, _ = r.wait(ctx, j, time.Minute)
	}
	out := j.output()
	if f.mark != "" {
		if why := refusedWritable(out); why != "" {
			v.skip("no [mounts] writable entry allows the poc's share: %s", why)
			return jb, out
		}
		marks, _ := filepath.Glob(filepath.Join(r.treeOf(r.tenants[0]), "ckpt", f.mark+"-*"))
		for _, m := range marks {
			b, _ := readRegular(m, 4096, &r.tenants[0].UID) // the guest wrote it, as tenant A
			out += string(b)
			v.note("the trap wrote %s into the share", filepath.Base(m))
		}
	}
	expect := f.expect
	if expect == nil {
		id := c.ID
		if f.stage != "" {
			id = "fault.start"
		}
		judge := expectations[id]
		expect = func(jb Job, out string, took time.Duration) []string {
			return judge(outcome{Job: jb, Out: out, Took: took, Bound: f.bound, Stage: f.stage})
		}
	}
	for _, e := range expect(jb, out, end.Sub(acted)) {
		v.fail("%s", e)
	}
	v.note("job %d ended %s, exit %s, %s after the fault", j.id, jb.State, jb.ExitCode, end.Sub(acted).Round(100*time.Millisecond))
	if l := firstLineWith(out, "slurm-microvm"); l != "" {
		v.note("srun: %s", l)
	}
	r.cleanupAfter(ctx, v, snap, end)
	return jb, out
}

// outcome is what a fault check saw of its job: the job's end, its
// output, the time from the fault to the job's end, and the check's bound.
type outcome struct {
	Job   Job
	Out   string
	Took  time.Duration
	Bound time.Duration
	Stage fault.Stage // of a start fault
}

// expectations judge the outcome of each fault check, by check id; a
// check with its own judgement (requeue, checkpoint) is not here.
var expectations = map[string]func(o outcome) []string{
	"fault.exit-0": func(o outcome) []string {
		return want(o.Job.State == "COMPLETED" && o.Job.ExitCode == "0:0", "ended %s exit %s, want COMPLETED 0:0", o.Job.State, o.Job.ExitCode)
	},
	"fault.exit-n": func(o outcome) []string {
		return want(o.Job.State == "FAILED" && o.Job.ExitCode == "7:0", "ended %s exit %s, want FAILED 7:0", o.Job.State, o.Job.ExitCode)
	},
	"fault.signal": func(o outcome) []string {
		return append(want(o.Job.State != "COMPLETED", "ended COMPLETED"),
			want(strings.Contains(o.Out, "Terminated"), "srun did not report the task Terminated")...)
	},
	"fault.scancel-step": func(o outcome) []string {
		return append(want(o.Job.State == "COMPLETED", "the job ended %s; want the batch script to go on and complete", o.Job.State),
			want(afterStep.MatchString(o.Out), "the batch script did not go on after the cancelled step with srun's non-zero status")...)
	},
	"fault.scancel-job": func(o outcome) []string {
		return append(want(o.Job.State == "CANCELLED", "ended %s, want CANCELLED", o.Job.State),
			want(strings.Contains(o.Out, "POC-TRAPPED-TERM"), "the workload's TERM trap did not run")...)
	},
	"fault.time-limit": func(o outcome) []string {
		return append(append(want(o.Job.State == "TIMEOUT", "ended %s, want TIMEOUT", o.Job.State),
			want(strings.Contains(o.Out, "POC-TRAPPED-USR1"), "--signal=USR1@45 did not reach the workload")...),
			want(strings.Contains(o.Out, "POC-TRAPPED-TERM"), "the workload's TERM trap did not run at the time limit")...)
	},
	"fault.vmm-killed": func(o outcome) []string {
		return append(append(want(o.Job.State != "COMPLETED", "ended COMPLETED"),
			want(strings.Contains(o.Out, "VMM"), "srun's output does not name the VMM")...),
			want(o.Took < o.Bound, "the job ended %s after the kill (want < %s)", o.Took.Round(time.Second), o.Bound)...)
	},
	"fault.supervisor-killed": func(o outcome) []string {
		return append(want(o.Job.State != "COMPLETED", "ended COMPLETED"),
			want(o.Took < o.Bound, "the job ended %s after the kill (want < %s)", o.Took.Round(time.Second), o.Bound)...)
	},
	"fault.exec-killed": func(o outcome) []string {
		return append(want(o.Job.State != "COMPLETED", "ended COMPLETED"),
			want(o.Took < o.Bound, "the job ended %s after the kill (want < %s)", o.Took.Round(time.Second), o.Bound)...)
	},
	"fault.agent-hung": func(o outcome) []string {
		return append(append(want(o.Job.State != "COMPLETED", "ended COMPLETED"),
			want(strings.Contains(o.Out, "agent"), "srun's output does not name the guest agent")...),
			want(o.Took < o.Bound, "detected after %s (want < %s)", o.Took.Round(time.Second), o.Bound)...)
	},
	"fault.start": func(o outcome) []string {
		return append(want(o.Job.State != "COMPLETED", "ended COMPLETED"),
			want(strings.Contains(o.Out, fmt.Sprintf("fault injected at stage %q", o.Stage)), "srun's output does not give the stage %q", o.Stage)...)
	},
	"fault.slurmstepd-killed": func(o outcome) []string {
		return want(o.Job.State != "COMPLETED" && o.Job.State != "RUNNING", "ended %s", o.Job.State)
	},
}

// afterStep is the batch script's line after a cancelled step: srun's
// status, non-zero.
var afterStep = regexp.MustCompile(`(?m)^POC-AFTER-STEP [1-9][0-9]*$`)

// want is a list of failures unless cond.
func want(cond bool, format string, a ...any) []string {
	if cond {
		return nil
	}
	return []string{fmt.Sprintf(format, a...)}
}

// signalRecorded sends sig to the process recorded in dir/file.
func signalRecorded(dir, file string, sig syscall.Signal) error {
	p, err := state.ReadProc(filepath.Join(dir, file))
	if err != nil {
		return fmt.Errorf("read %s: %w", file, err)
	}
	if err := p.Signal(sig); err != nil {
		return fmt.Errorf("signal %s (pid %d): %w", file, p.Pid, err)
	}
	return nil
}

func faultChecks() []checkDef {
	defs := []checkDef{
		{"fault.exit-0", "a workload that exits 0 completes; nothing is left", func(ctx context.Context, r *run, c *report.Check) {
			r.faultCheck(ctx, c, "exit0", faultSpec{body: r.srunLine("true")})
		}},
		{"fault.exit-n", "a workload's exit code N is the job's", func(ctx context.Context, r *run, c *report.Check) {
			r.faultCheck(ctx, c, "exitn", faultSpec{body: r.srunLine("sh", "-c", "exit 7")})
		}},
		{"fault.signal", "a workload killed by a signal is reported as killed by it", func(ctx context.Context, r *run, c *report.Check) {
			r.faultCheck(ctx, c, "sig", faultSpec{body: r.srunLine("sh", "-c", "kill -TERM $$")})
		}},
		{"fault.scancel-step", "scancel of a step ends it (SIGKILL, as Slurm does to a step without a microVM) and the job goes on", func(ctx context.Context, r *run, c *report.Check) {
			r.faultCheck(ctx, c, "cancelstep", faultSpec{body: r.trapStep("cancelstep", "TERM") + "\necho POC-AFTER-STEP $?", mark: "cancelstep",
				action: func(ctx context.Context, j *job, _ string) error {
					return r.slurm.Scancel(ctx, fmt.Sprintf("%d.0", j.id))
				},
			})
		}},
		{"fault.scancel-job", "scancel of a job: the workload's TERM trap runs, the job ends CANCELLED", func(ctx context.Context, r *run, c *report.Check) {
			r.faultCheck(ctx, c, "canceljob", faultSpec{body: r.trapStep("canceljob", "TERM"), mark: "canceljob",
				action: func(ctx context.Context, j *job, _ string) error { return r.slurm.Scancel(ctx, strconv.Itoa(j.id)) },
			})
		}},
		{"fault.time-limit", "a job over its time limit ends TIMEOUT; --signal=USR1@T reaches the workload first", checkTimeLimit},
		{"fault.vmm-killed", "the VMM killed with SIGKILL mid-step: srun reports it within seconds, naming the VMM", func(ctx context.Context, r *run, c *report.Check) {
			r.faultCheck(ctx, c, "vmmkill", faultSpec{body: r.srunLine("sh", "-c", trapLoop("")),
				action: func(ctx context.Context, j *job, dir string) error {
					return signalRecorded(dir, state.VMMPidFile, syscall.SIGKILL)
				},
				bound: 30 * time.Second})
		}},
		{"fault.supervisor-killed", "the supervisor killed with SIGKILL: the step fails and is torn down", func(ctx context.Context, r *run, c *report.Check) {
			r.faultCheck(ctx, c, "supkill", faultSpec{body: r.srunLine("sh", "-c", trapLoop("")),
				action: func(ctx context.Context, j *job, dir string) error {
					return signalRecorded(dir, state.SupervisorFile, syscall.SIGKILL)
				},
				bound: time.Minute})
		}},
		{"fault.exec-killed", "the task's exec process killed with SIGKILL: the step ends and is torn down", func(ctx context.Context, r *run, c *report.Check) {
			r.faultCheck(ctx, c, "execkill", faultSpec{body: r.srunLine("sh", "-c", trapLoop("")),
				action: func(ctx context.Context, j *job, dir string) error {
					pids, err := r.slurm.StepPids(ctx, j.id, 0)
					if err != nil {
						return err
					}
					for _, p := range pids {
						if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", p)); strings.Contains(filepath.Base(exe), "slurm-microvm") {
							return syscall.Kill(p, syscall.SIGKILL)
						}
					}
					return fmt.Errorf("no exec process among the step's pids %v", pids)
				},
				bound: time.Minute})
		}},
		{"fault.agent-hung", "a hung guest (the VMM stopped, so the agent cannot answer) is detected within a bounded time", func(ctx context.Context, r *run, c *report.Check) {
			r.faultCheck(ctx, c, "agenthang", faultSpec{body: r.srunLine("sh", "-c", trapLoop("")),
				action: func(ctx context.Context, j *job, dir string) error {
					return signalRecorded(dir, state.VMMPidFile, syscall.SIGSTOP)
				},
				bound: agentHangBound(r) + 15*time.Second})
		}},
	}
	for _, st := range fault.StartStages {
		defs = append(defs, checkDef{"fault.start-" + string(st), fmt.Sprintf("a sandbox start that fails at stage %q fails the step with that reason and leaves nothing", st),
			func(ctx context.Context, r *run, c *report.Check) { r.startFault(ctx, c, st) }})
	}
	defs = append(defs,
		checkDef{"fault.slurmstepd-killed", "the step's slurmstepd killed with SIGKILL: the job's epilog cleans up", checkStepdKilled},
		checkDef{"fault.requeue", "a requeued job: its first run's state directory, supervisor and VMM are gone when the second runs", checkRequeue},
		checkDef{"fault.checkpoint", "a job killed while it writes a checkpoint (write, fsync, rename) leaves it absent or complete, never partial", checkCheckpoint},
	)
	return defs
}

// agentHangBound is the launcher's hung-agent bound: timeouts.agent_hang
// plus one ping interval (timeouts.agent_ping).
func agentHangBound(r *run) time.Duration {
	return r.o.Config.Timeouts.AgentHang.Duration + r.o.Config.Timeouts.AgentPing.Duration
}

// writeFault switches stage on for job (smv_faults build only).
func writeFault(job int, st fault.Stage) error {
	if err := os.MkdirAll(fault.Dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(fault.Dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(fault.Dir, strconv.Itoa(job)), []byte(string(st)+"\n"), 0o600)
}

func (r *run) startFault(ctx context.Context, c *report.Check, st fault.Stage) {
	if !r.faultsOn {
		c.Verdict, c.Reason = report.Skip, "the jobs' launcher is not an smv_faults build (fault injection exists only in test builds)"
		return
	}
	var id int
	defer func() {
		if id != 0 {
			_ = os.Remove(filepath.Join(fault.Dir, strconv.Itoa(id)))
		}
		_ = os.Remove(fault.Dir) // when empty
	}()
	r.faultCheck(ctx, c, "start-"+string(st), faultSpec{body: r.srunLine("true"),
		beforeRelease: func(job int) error { id = job; return writeFault(job, st) }, stage: st})
}

func checkTimeLimit(ctx context.Context, r *run, c *report.Check) {
	r.faultCheck(ctx, c, "timelimit", faultSpec{body: r.trapStep("timelimit", "USR1", "TERM"), mark: "timelimit",
		args: []string{"-t", "1", "--signal=USR1@45"}, wait: 4 * time.Minute})
}

// stepd is the slurmstepd parent of pid ("" when it is not one).
func stepd(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	if strings.TrimSpace(string(comm)) != "slurmstepd" {
		return 0
	}
	return ppid
}

func checkStepdKilled(ctx context.Context, r *run, c *report.Check) {
	r.faultCheck(ctx, c, "stepdkill", faultSpec{body: r.srunLine("sh", "-c", trapLoop("")),
		action: func(ctx context.Context, j *job, dir string) error {
			pids, err := r.slurm.StepPids(ctx, j.id, 0)
			if err != nil {
				return err
			}
			for _, p := range pids {
				if sd := stepd(p); sd != 0 {
					if err := syscall.Kill(sd, syscall.SIGKILL); err != nil {
						return err
					}
					// The job's batch step waits for a step that is
					// gone: end the job, so that its epilog runs.
					time.Sleep(3 * time.Second)
					return r.slurm.Scancel(ctx, strconv.Itoa(j.id))
				}
			}
			return fmt.Errorf("no slurmstepd parent of the step's pids %v", pids)
		}})
}

func checkRequeue(ctx context.Context, r *run, c *report.Check) {
	var firstLeft []string
	var second bool
	r.faultCheck(ctx, c, "requeue", faultSpec{body: r.srunLine("sh", "-c", trapLoop("")), args: []string{"--requeue"}, wait: 8 * time.Minute,
		action: func(ctx context.Context, j *job, dir string) error {
			// The first run, as the node knows it: its state
			// directory (by inode: a requeued run may reuse the name)
			// and its supervisor and VMM.
			var first []state.Proc
			for _, f := range []string{state.SupervisorFile, state.VMMPidFile} {
				if p, err := state.ReadProc(filepath.Join(dir, f)); err == nil {
					first = append(first, p)
				}
			}
			var ino uint64
			if fi, err := os.Stat(dir); err == nil {
				ino = fi.Sys().(*syscall.Stat_t).Ino
			}
			if _, err := r.slurm.root(ctx, "scontrol", "requeue", strconv.Itoa(j.id)); err != nil {
				return err
			}
			// The second run. Slurm holds a requeued job back for a
			// while (BeginTime); the poc, root, lets it start now.
			deadline := time.Now().Add(6 * time.Minute)
			released := false
			for time.Now().Before(deadline) && ctx.Err() == nil && !second {
				if !released {
					if jb, err := r.slurm.Job(ctx, j.id); err == nil && jb.State == "PENDING" {
						_, err := r.slurm.root(ctx, "scontrol", "update", "jobid="+strconv.Itoa(j.id), "starttime=now")
						released = err == nil
					}
				}
				m, _ := filepath.Glob(filepath.Join(r.o.Config.RuntimeDir, fmt.Sprintf("%d.0.*.%s", j.id, r.o.Node), state.ReadyFile))
				for _, p := range m {
					if fi, err := os.Stat(filepath.Dir(p)); err == nil && fi.Sys().(*syscall.Stat_t).Ino != ino {
						second = true
					}
				}
				time.Sleep(500 * time.Millisecond)
			}
			if fi, err := os.Stat(dir); err == nil && fi.Sys().(*syscall.Stat_t).Ino == ino {
				firstLeft = append(firstLeft, "state "+dir)
			}
			for _, p := range first {
				if p.Alive() {
					firstLeft = append(firstLeft, fmt.Sprintf("process %d", p.Pid))
				}
			}
			return r.slurm.Scancel(ctx, strconv.Itoa(j.id))
		},
		expect: func(Job, string, time.Duration) []string { return judgeRequeue(second, firstLeft) }})
}

// judgeRequeue: the second run became ready and nothing of the first
// (its state directory, its processes) was there by then.
func judgeRequeue(second bool, firstLeft []string) []string {
	f := want(second, "the requeued job's second run never became ready")
	if len(firstLeft) > 0 {
		f = append(f, "the first run left: "+strings.Join(firstLeft, ", "))
	}
	return f
}

// checkpointOK reports whether a checkpoint file is complete: its data,
// a newline, then the data's sha256 in hex and a newline.
func checkpointOK(b []byte) bool {
	if len(b) < 66 || b[len(b)-1] != '\n' {
		return false
	}
	data, sum := b[:len(b)-66], b[len(b)-65:len(b)-1]
	if b[len(b)-66] != '\n' {
		return false
	}
	return fmt.Sprintf("%x", sha256.Sum256(data)) == string(sum)
}

func checkCheckpoint(ctx context.Context, r *run, c *report.Check) {
	dir := filepath.Join(r.treeOf(r.tenants[0]), "ckpt")
	writer := `i=0; while :; do
  dd if=/dev/urandom of=/tmp/d bs=1M count=4 2>/dev/null
  s=$(sha256sum < /tmp/d | cut -c1-64)
  { cat /tmp/d; echo; echo "$s"; } | dd of=/ckpt/ckpt.tmp bs=1M conv=fsync 2>/dev/null
  mv /ckpt/ckpt.tmp /ckpt/ckpt
  i=$((i+1)); [ $i -eq 2 ] && echo POC-UP
done`
	var final []byte
	var present bool
	_, out := r.faultCheck(ctx, c, "ckpt", faultSpec{body: r.srunLine("--microvm-mounts="+dir+":/ckpt:rw", "sh", "-c", writer),
		action: func(ctx context.Context, j *job, sdir string) error {
			time.Sleep(700 * time.Millisecond) // mid-write
			return signalRecorded(sdir, state.VMMPidFile, syscall.SIGKILL)
		},
		expect: func(jb Job, out string, _ time.Duration) []string {
			b, err := readRegular(filepath.Join(dir, "ckpt"), 64<<20, &r.tenants[0].UID)
			if err != nil {
				// POC-UP comes after two renames: a final file was there.
				return []string{fmt.Sprintf("the final checkpoint is gone: %v", err)}
			}
			final, present = b, true
			return want(checkpointOK(b), "the final checkpoint is partial (%d bytes, digest does not match)", len(b))
		}})
	if c.Verdict == report.Fail && strings.Contains(c.Reason, "before its step 0 was ready") && strings.Contains(out, "writable") {
		c.Verdict, c.Reason = report.Skip, "no [mounts] writable entry allows "+dir+": "+firstLineWith(out, "writable")
		return
	}
	if present {
		c.Evidence = append(c.Evidence, fmt.Sprintf("final checkpoint complete: %d bytes, digest matches", len(final)))
	} else {
		c.Evidence = append(c.Evidence, "final checkpoint absent (killed before the first rename)")
	}
}
