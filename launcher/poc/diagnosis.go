package poc

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/poc/report"
	"github.com/slurm-microvm/slurm-microvm/launcher/residue"
)

func diagnosisChecks() []checkDef {
	return []checkDef{
		{"diagnosis.phases", "the job's debug output and the admin's log show each start phase with its duration", checkPhases},
		{"diagnosis.no-tenant-data", "no log, job output or report of this run holds a job's environment value or file content", checkNoTenantData},
	}
}

// Phases the supervisor logs (msg=phase step=ID phase=NAME ms=N) for
// every start, whatever the step asks for (GPUs and MPI only when it
// does).
var Phases = []string{"shares", "image", "assets", "network", "boot", "ready", "start"}

var phaseLine = regexp.MustCompile(`msg=phase (?:step=\S+ )?phase=(\S+) ms=(\d+)`)

// judgePhases: every phase of Phases is in text with a duration.
func judgePhases(where, text string) []string {
	seen := map[string]bool{}
	for _, m := range phaseLine.FindAllStringSubmatch(text, -1) {
		seen[m[1]] = true
	}
	var missing []string
	for _, p := range Phases {
		if !seen[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return []string{fmt.Sprintf("%s lacks the phase lines %s", where, strings.Join(missing, ", "))}
	}
	return nil
}

func checkPhases(ctx context.Context, r *run, c *report.Check) {
	v := newVerdict(c)
	defer v.done()
	a := r.tenants[0]
	snap := residue.Take(r.scope)
	j, jb, ok := r.runJob(ctx, v, a, "debug", r.srunLine("--microvm-debug", "--microvm-mounts="+r.treeOf(a)+"/own:/data", "sh", "-c", "cat /data/data.txt >/dev/null; echo POC-DEBUG-DONE"), 5*time.Minute, "-t", "5", "--mem=512")
	if !ok {
		return
	}
	end := time.Now()
	if jb.State != "COMPLETED" {
		v.fail("the debug step ended %s (exit %s)", jb.State, jb.ExitCode)
	}
	for _, f := range judgePhases("the job's --microvm-debug output", j.output()) {
		v.fail("%s", f)
	}
	if dir := r.o.Config.Log.Dir; dir != "" {
		text := r.adminLog(j.id)
		for _, f := range judgePhases("the admin's log "+filepath.Join(dir, fmt.Sprintf("%d.*.log", j.id)), text) {
			v.fail("%s", f)
		}
		for _, m := range phaseLine.FindAllStringSubmatch(text, -1) {
			v.note("phase %s: %s ms", m[1], m[2])
		}
	} else {
		v.note("[log] dir is off: the admin's copy is not kept; only the job's output checked")
	}
	// The error of a failed step is in its admin log: the VMM-killed step.
	if vj := r.byName["vmmkill"]; vj != nil && r.o.Config.Log.Dir != "" {
		text := r.adminLog(vj.id)
		if !strings.Contains(text, "VMM") {
			v.fail("the admin's log of the VMM-killed job %d does not hold its error", vj.id)
		} else {
			v.note("the VMM-killed job's error is in its admin log: %s", firstLineWith(text, "VMM"))
		}
	}
	r.cleanupAfter(ctx, v, snap, end)
}

// judgeTenantData lists the files (name -> content) that hold a marker.
func judgeTenantData(files map[string]string, markers []string) []string {
	var fails []string
	for name, text := range files {
		for _, m := range markers {
			if strings.Contains(text, m) {
				fails = append(fails, name+" holds a job's secret or file content")
				break
			}
		}
	}
	return fails
}

func checkNoTenantData(ctx context.Context, r *run, c *report.Check) {
	v := newVerdict(c)
	defer v.done()
	var markers []string
	for _, d := range r.markers {
		markers = append(markers, d.secret, d.content)
	}
	files := map[string]string{}
	read := func(p string) {
		if b, err := readRegular(p, maxRead, nil); err == nil {
			files[p] = string(b)
		}
	}
	r.mu.Lock()
	jobs := append([]int{}, r.jobs...)
	r.mu.Unlock()
	for _, id := range jobs {
		if text := r.adminLog(id); text != "" {
			files[fmt.Sprintf("the admin's log of job %d", id)] = text
		}
	}
	for _, t := range r.tenants {
		outs, _ := filepath.Glob(filepath.Join(r.treeOf(t), "out", "*.out"))
		for _, p := range outs {
			read(p)
		}
	}
	if lf, _ := r.slurm.ConfigValue(ctx, "SlurmdLogFile"); lf != "" && lf != "(null)" {
		read(strings.ReplaceAll(lf, "%n", r.o.Node))
	}
	n := len(files)
	for _, f := range judgeTenantData(files, markers) {
		v.fail("%s", f)
	}
	// The report itself, as it stands.
	var ev []string
	for _, ch := range r.rep.Checks {
		ev = append(append(ev, ch.Reason), ch.Evidence...)
	}
	for _, f := range judgeTenantData(map[string]string{"the report": strings.Join(ev, "\n")}, markers) {
		v.fail("%s", f)
	}
	v.note("%d logs and job outputs of this run's %d jobs searched for %d markers", n, len(jobs), len(markers))
}
