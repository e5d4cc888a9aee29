package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// opsTests are the admin's view of a node (issue "See what runs"): ps
// lists a running step's sandbox and nothing of it after it ended, and the
// metrics textfile parses and counts the steps the test ran.
func opsTests(t *testing.T, e *harness.Env) {
	img := "--microvm=" + e.Image
	e.Run(t, "ps lists a running step's sandbox, then nothing of it; the metrics count it", func(t *testing.T) {
		before := readMetrics(t, harness.MetricsFile)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd, err := e.C.Command(ctx, "", "srun", img, "sh", "-c", "echo JOB=$SLURM_JOB_ID; exec sleep 30")
		if err != nil {
			t.Fatal(err)
		}
		var so, se fixture.SyncBuffer
		cmd.Stdout, cmd.Stderr = &so, &se
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		srunDone := make(chan struct{})
		go func() { _ = cmd.Wait(); close(srunDone) }()
		defer func() { cancel(); <-srunDone }()
		var job int
		for job == 0 {
			if m := jobLine.FindStringSubmatch(so.String()); m != nil {
				job, _ = strconv.Atoi(m[1])
				break
			}
			select {
			case <-srunDone:
				t.Fatalf("srun ended before the step ran: stdout %q stderr %q", so.String(), se.String())
			case <-ctx.Done():
				t.Fatalf("no JOB= line: stdout %q stderr %q", so.String(), se.String())
			case <-time.After(100 * time.Millisecond):
			}
		}
		// The task runs: the sandbox is ready; ps shows it.
		var sb map[string]any
		for deadline := time.Now().Add(30 * time.Second); sb == nil; time.Sleep(200 * time.Millisecond) {
			for _, s := range ps(t, e) {
				if s["job"] == float64(job) && s["phase"] == "running" {
					sb = s
				}
			}
			if sb == nil && time.Now().After(deadline) {
				t.Fatalf("ps --json never listed job %d running: %v", job, ps(t, e))
			}
		}
		t.Logf("ps: %v", sb)
		digest, _ := sb["image_digest"].(string)
		if sb["step"] != 0.0 || sb["uid"] != 0.0 || sb["user"] != "root" || sb["image"] != e.Image || len(digest) < 71 ||
			sb["vcpus"].(float64) < 1 || sb["memory_mib"].(float64) < 64 || sb["uptime_s"].(float64) < 0 {
			t.Errorf("ps --json entry %v", sb)
		}
		if pid := int(sb["vmm_pid"].(float64)); pid <= 0 {
			t.Errorf("vmm_pid %d", pid)
		} else if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			t.Errorf("vmm_pid %d is no process: %v", pid, err)
		}
		out, err := exec.Command(e.Launcher, "--config", e.Config, "inspect", fmt.Sprintf("%d.0", job)).Output()
		var rec map[string]any
		if err != nil || json.Unmarshal(out, &rec) != nil || rec["image_digest"] != digest || rec["spec"] == nil {
			t.Errorf("inspect %d.0: %v\n%s", job, err, out)
		}
		// End the step early (the CI budget), as an admin would.
		sc, err := e.C.Command(ctx, "", "scancel", strconv.Itoa(job))
		if err != nil {
			t.Fatal(err)
		}
		if out, err := sc.CombinedOutput(); err != nil {
			t.Fatalf("scancel: %v\n%s", err, out)
		}
		<-srunDone
		e.WaitClean(t, job)
		for _, s := range ps(t, e) {
			if s["job"] == float64(job) {
				t.Errorf("ps --json still lists job %d after it ended: %v", job, s)
			}
		}
		// Its supervisor counted it at its end; then one more step.
		if _, errOut, code := e.Srun(t, "", img, "true"); code != 0 {
			t.Fatalf("srun true: exit %d: %s", code, errOut)
		}
		var after map[string]*dto.MetricFamily
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			after = readMetrics(t, harness.MetricsFile)
			if counter(after, "slurm_microvm_starts_total", "") >= counter(before, "slurm_microvm_starts_total", "")+2 || time.Now().After(deadline) {
				break
			}
		}
		for _, c := range []struct {
			family, label string
			delta         float64
		}{
			{"slurm_microvm_starts_total", "", 2},
			{"slurm_microvm_phase_duration_seconds", "boot", 2},
			{"slurm_microvm_phase_duration_seconds", "first_exec", 2},
			{"slurm_microvm_phase_duration_seconds", "stop", 2},
			{"slurm_microvm_failures_total", "image", 0},
		} {
			if d := counter(after, c.family, c.label) - counter(before, c.family, c.label); d != c.delta {
				t.Errorf("%s{%s} rose by %v over the test's 2 steps, want %v", c.family, c.label, d, c.delta)
			}
		}
		if _, ok := after["slurm_microvm_sandboxes_running"]; !ok {
			t.Errorf("no slurm_microvm_sandboxes_running in %s", harness.MetricsFile)
		}
		// `slurm-microvm metrics` prints what Prometheus parses, no
		// sandbox running now.
		out, err = exec.Command(e.Launcher, "--config", e.Config, "metrics").Output()
		if err != nil {
			t.Fatalf("slurm-microvm metrics: %v", err)
		}
		now := parseMetrics(t, out)
		if counter(now, "slurm_microvm_starts_total", "") != counter(after, "slurm_microvm_starts_total", "") || counter(now, "slurm_microvm_sandboxes_running", "") != 0 {
			t.Errorf("slurm-microvm metrics:\n%s", out)
		}
	})
}

// ps runs `slurm-microvm ps --json` as root.
func ps(t *testing.T, e *harness.Env) []map[string]any {
	t.Helper()
	out, err := exec.Command(e.Launcher, "--config", e.Config, "ps", "--json").Output()
	if err != nil {
		t.Fatalf("ps --json: %v", err)
	}
	var list []map[string]any
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("ps --json: %v\n%s", err, out)
	}
	return list
}

// readMetrics parses the textfile (none yet: no metrics).
func readMetrics(t *testing.T, path string) map[string]*dto.MetricFamily {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return parseMetrics(t, b)
}

func parseMetrics(t *testing.T, b []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("the Prometheus text parser refuses the metrics: %v\n%s", err, b)
	}
	return mfs
}

// counter is the value of the family's sample whose one label has value
// label ("": the unlabelled sample); a histogram's sample count; 0 when
// absent.
func counter(mfs map[string]*dto.MetricFamily, family, label string) float64 {
	for _, m := range mfs[family].GetMetric() {
		if (label == "") != (len(m.GetLabel()) == 0) || label != "" && m.GetLabel()[0].GetValue() != label {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return 0
}
