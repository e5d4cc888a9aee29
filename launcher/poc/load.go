package poc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/poc/report"
	"github.com/slurm-microvm/slurm-microvm/launcher/residue"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

func loadChecks() []checkDef {
	return []checkDef{
		{"load.concurrent", "as many concurrent sandboxes as the node fits (one per CPU) run at once; VMM host memory per sandbox", checkConcurrent},
		{"load.array", "a job array of tiny steps runs through; steps per minute and each step's srun wall time", checkArray},
		{"load.back-to-back", "back-to-back steps of one image: converted once, reused after", checkBackToBack},
	}
}

func (r *run) load() *report.Load {
	if r.rep.Load == nil {
		r.rep.Load = &report.Load{}
	}
	return r.rep.Load
}

// timedSrun is a batch-script line that runs `srun --microvm true` and
// prints its wall time in ms as POC-START-MS (measured on the node).
func (r *run) timedSrun() string {
	return `s=$(date +%s%N); ` + r.srunLine("true") + `; rc=$?; e=$(date +%s%N); echo "POC-START-MS $(( (e - s) / 1000000 )) $rc"`
}

var startLine = regexp.MustCompile(`(?m)^POC-START-MS (\d+) (\d+)`)

// startTimes reads the POC-START-MS lines of out: times and failures.
func startTimes(out string) (ms []int64, failed int) {
	for _, m := range startLine.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		ms = append(ms, n)
		if m[2] != "0" {
			failed++
		}
	}
	return ms, failed
}

// pssMiB is a process's proportional set size (MiB,
// /proc/PID/smaps_rollup "Pss:").
func pssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`(?m)^Pss:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	kb, _ := strconv.ParseFloat(string(m[1]), 64)
	return kb / 1024
}

func checkConcurrent(ctx context.Context, r *run, c *report.Check) {
	v := newVerdict(c)
	defer v.done()
	n := max(r.node.CPUs, 1)
	if fit := (r.node.MemMiB - 512) / 512; r.node.MemMiB > 0 && fit < n {
		n = max(fit, 1)
	}
	l := r.load()
	l.ConcurrentWanted = n
	snap := residue.Take(r.scope)
	var jobs []*job
	for i := range n {
		j, err := r.sbatch(ctx, r.tenants[i%2], fmt.Sprintf("conc-%d", i), r.srunLine("sh", "-c", "echo POC-UP; sleep 60"), "-t", "5", "-c1", "--mem=512")
		if err != nil {
			v.fail("%v", err)
			break
		}
		v.job(j)
		jobs = append(jobs, j)
	}
	// All ready at once.
	deadline := time.Now().Add(6 * time.Minute)
	var dirs []string
	for time.Now().Before(deadline) && ctx.Err() == nil {
		dirs = dirs[:0]
		for _, j := range jobs {
			if m, _ := filepath.Glob(filepath.Join(r.o.Config.RuntimeDir, fmt.Sprintf("%d.0.*.%s", j.id, r.o.Node), state.ReadyFile)); len(m) > 0 {
				dirs = append(dirs, filepath.Dir(m[0]))
			}
		}
		if len(dirs) == len(jobs) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	l.Concurrent = len(dirs)
	for _, d := range dirs {
		if p, err := state.ReadProc(filepath.Join(d, state.VMMPidFile)); err == nil {
			l.VMMPSSMiB = append(l.VMMPSSMiB, pssMiB(p.Pid))
		}
	}
	if l.Concurrent < n {
		v.fail("%d of %d sandboxes ran at once", l.Concurrent, n)
	}
	v.note("%d sandboxes at once (-c1 --mem=512 each; node %d CPUs, %d MiB); VMM PSS MiB %v", l.Concurrent, r.node.CPUs, r.node.MemMiB, l.VMMPSSMiB)
	for _, j := range jobs {
		_ = r.slurm.Scancel(ctx, strconv.Itoa(j.id))
	}
	for _, j := range jobs {
		_, _ = r.wait(ctx, j, 2*time.Minute)
	}
	r.cleanupAfter(ctx, v, snap, time.Now())
}

// waitGone waits until squeue no longer lists job id (an array: all
// its tasks), bounded by limit.
func (r *run) waitGone(ctx context.Context, id int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		out, _, _, err := r.slurm.Run(ctx, nil, "", "squeue", "-h", "-j", strconv.Itoa(id), "-o", "%i")
		if err == nil && strings.TrimSpace(out) == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("job %d still queued or running after %s", id, limit)
		}
		time.Sleep(time.Second)
	}
}

func checkArray(ctx context.Context, r *run, c *report.Check) {
	v := newVerdict(c)
	defer v.done()
	l := r.load()
	n := r.o.ArrayTasks
	snap := residue.Take(r.scope)
	t0 := time.Now()
	j, err := r.sbatch(ctx, r.tenants[0], "array", r.timedSrun(), "-t", "5", "-c1", "--mem=512", fmt.Sprintf("--array=0-%d", n-1))
	if err != nil {
		v.fail("%v", err)
		return
	}
	v.job(j)
	if err := r.waitGone(ctx, j.id, time.Duration(n)*30*time.Second+5*time.Minute); err != nil {
		v.fail("%v", err)
	}
	wall := time.Since(t0)
	end := time.Now()
	var all []int64
	failed, missing := 0, 0
	for i := range n {
		b, _ := readRegular(strings.ReplaceAll(j.out, "%a", strconv.Itoa(i)), maxRead, &j.t.UID)
		ms, f := startTimes(string(b))
		if len(ms) == 0 {
			missing++
		}
		all = append(all, ms...)
		failed += f
	}
	l.ArrayTasks = n
	if wall > 0 {
		l.StepsPerMinute = float64(len(all)) / wall.Minutes()
	}
	l.StartMS = append(l.StartMS, all...)
	l.Summarize()
	if failed > 0 || missing > 0 {
		v.fail("%d of %d array tasks failed, %d gave no result", failed, n, missing)
	}
	v.note("%d tasks in %s: %.1f steps per minute", n, wall.Round(time.Second), l.StepsPerMinute)
	r.cleanupAfter(ctx, v, snap, end)
}

func checkBackToBack(ctx context.Context, r *run, c *report.Check) {
	v := newVerdict(c)
	defer v.done()
	l := r.load()
	n := r.o.BackToBack
	snap := residue.Take(r.scope)
	body := fmt.Sprintf("i=0; while [ $i -lt %d ]; do %s; i=$((i+1)); done", n, r.timedSrun())
	j, _, ok := r.runJob(ctx, v, r.tenants[1], "b2b", body, time.Duration(n)*time.Minute, "-t", "30", "-c1", "--mem=512")
	if !ok {
		return
	}
	end := time.Now()
	ms, failed := startTimes(j.output())
	l.BackToBack = len(ms)
	l.StartMS = append(l.StartMS, ms...)
	l.Summarize()
	if failed > 0 || len(ms) != n {
		v.fail("%d of %d steps failed, %d ran", failed, n, len(ms))
	}
	// Conversions: the supervisor logs "converted image" once per
	// conversion; the admin's kept logs outlive the steps.
	conv := 0
	if r.o.Config.Log.Dir != "" {
		conv = strings.Count(r.adminLog(j.id), "converted image")
	} else {
		v.note("[log] dir is off: conversions counted as 0 (not measured)")
	}
	l.ImageConversions = conv
	if conv > 1 {
		v.fail("the image was converted %d times in %d steps", conv, n)
	}
	v.note("%d steps back to back, image converted %d times", len(ms), conv)
	r.cleanupAfter(ctx, v, snap, end)
}
