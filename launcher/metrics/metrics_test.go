package metrics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/metrics"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// parse reads a text exposition with Prometheus's own parser.
func parse(t *testing.T, b []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse metrics: %v\n%s", err, b)
	}
	return mfs
}

// value is the value of the family's sample with label (name=value, ""
// for none): a counter's or gauge's value, a histogram's sample count.
func value(t *testing.T, mfs map[string]*dto.MetricFamily, family, label string) float64 {
	t.Helper()
	mf, ok := mfs[family]
	if !ok {
		t.Fatalf("no %s", family)
	}
	for _, m := range mf.GetMetric() {
		match := label == ""
		for _, lp := range m.GetLabel() {
			if lp.GetName()+"="+lp.GetValue() == label {
				match = true
			}
		}
		if !match {
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
	t.Fatalf("no %s{%s}", family, label)
	return 0
}

// fixture makes a runtime dir with one running sandbox (the test's own
// process as its supervisor) and a cache of 3 files of 8 KiB.
func fixture(t *testing.T) metrics.Options {
	t.Helper()
	dir := t.TempDir()
	rt := filepath.Join(dir, "run")
	if err := state.MakeDir(rt, 0o711); err != nil {
		t.Fatal(err)
	}
	for _, id := range []state.StepID{{Job: 1, Step: 0}, {Job: 2, Step: 0}} {
		d := state.Dir{Root: rt, ID: id}
		if err := os.Mkdir(d.Path(), 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(launcher.Spec{ID: id, Image: "img"})
		if err := state.WriteFileAtomic(d.File(state.SpecFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := d.RecordSupervisor(os.Getpid()); err != nil {
			t.Fatal(err)
		}
		if err := state.WriteFileAtomic(d.File(state.ReadyFile), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cache := filepath.Join(dir, "cache")
	for i, name := range []string{"images/1000/a.erofs", "images/0/b.erofs", "assets/vmlinuz"} {
		p := filepath.Join(cache, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.Repeat([]byte{byte(i + 1)}, 8192), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return metrics.Options{
		Textfile:   filepath.Join(dir, "textfile", "slurm_microvm.prom"),
		RuntimeDir: rt, CacheDir: cache,
		Except: state.StepID{Job: 1, Step: 0},
		Stages: []string{"image", "boot", "run"},
	}
}

func TestRecord(t *testing.T) {
	tests := []struct {
		name  string
		steps []metrics.Step
		// want: "family{label}" -> value (histograms: sample count)
		want map[string]float64
	}{
		{name: "none", steps: nil, want: map[string]float64{
			"slurm_microvm_starts_total": 0, "slurm_microvm_failures_total{stage=image}": 0,
		}},
		{name: "two starts and a failed image", steps: []metrics.Step{
			{Started: true, Phases: map[string]time.Duration{"image": 30 * time.Millisecond, "boot": 2 * time.Second, "stop": time.Second}},
			{Started: true, Phases: map[string]time.Duration{"image": 3 * time.Second, "boot": 1500 * time.Millisecond}},
			{Started: true, Failed: "image", Phases: map[string]time.Duration{"gpus": 0}},
		}, want: map[string]float64{
			"slurm_microvm_starts_total":                        3,
			"slurm_microvm_failures_total{stage=image}":         1,
			"slurm_microvm_failures_total{stage=boot}":          0,
			"slurm_microvm_phase_duration_seconds{phase=image}": 2,
			"slurm_microvm_phase_duration_seconds{phase=boot}":  2,
			"slurm_microvm_phase_duration_seconds{phase=stop}":  1,
			"slurm_microvm_phase_duration_seconds{phase=gpus}":  1,
		}},
		{name: "a failure after ready", steps: []metrics.Step{{Started: true, Failed: "run"}}, want: map[string]float64{
			"slurm_microvm_starts_total": 1, "slurm_microvm_failures_total{stage=run}": 1, "slurm_microvm_failures_total{stage=image}": 0,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := fixture(t)
			// Each step is its own Record, as each supervisor is its own process.
			for _, s := range tc.steps {
				if err := metrics.Record(context.Background(), o, s); err != nil {
					t.Fatal(err)
				}
			}
			if len(tc.steps) == 0 {
				if err := metrics.Record(context.Background(), o, metrics.Step{}); err != nil {
					t.Fatal(err)
				}
			}
			b, err := os.ReadFile(o.Textfile)
			if err != nil {
				t.Fatal(err)
			}
			if fi, _ := os.Stat(o.Textfile); fi.Mode().Perm() != 0o644 {
				t.Errorf("textfile mode %v, want 0644 (node_exporter reads it)", fi.Mode())
			}
			mfs := parse(t, b)
			for key, want := range tc.want {
				family, label, _ := strings.Cut(strings.TrimSuffix(key, "}"), "{")
				if got := value(t, mfs, family, label); got != want {
					t.Errorf("%s = %v, want %v\n%s", key, got, want, b)
				}
			}
			// The gauges: one of two sandboxes is the recording step's own.
			if got := value(t, mfs, "slurm_microvm_sandboxes_running", ""); got != 1 {
				t.Errorf("sandboxes_running %v, want 1", got)
			}
			if got := value(t, mfs, "slurm_microvm_cache_size_bytes", "cache=images"); got < 16384 {
				t.Errorf("cache_size_bytes{cache=images} %v, want at least 16384", got)
			}
			if got := value(t, mfs, "slurm_microvm_cache_size_bytes", "cache=assets"); got < 8192 {
				t.Errorf("cache_size_bytes{cache=assets} %v, want at least 8192", got)
			}
			// The histogram's buckets are seconds: 2 s and 1.5 s are both
			// above 1 and at most 2.5.
			if len(tc.steps) > 1 {
				for _, m := range mfs["slurm_microvm_phase_duration_seconds"].GetMetric() {
					if m.GetLabel()[0].GetValue() != "boot" {
						continue
					}
					for _, bk := range m.GetHistogram().GetBucket() {
						want := uint64(0)
						if bk.GetUpperBound() >= 2.5 {
							want = 2
						}
						if bk.GetCumulativeCount() != want {
							t.Errorf("boot bucket le=%v: %d, want %d", bk.GetUpperBound(), bk.GetCumulativeCount(), want)
						}
					}
					if s := m.GetHistogram().GetSampleSum(); s < 3.49 || s > 3.51 {
						t.Errorf("boot sum %v s, want 3.5", s)
					}
				}
			}
			// `slurm-microvm metrics` prints the same counters.
			var out bytes.Buffer
			if err := metrics.Write(&out, o); err != nil {
				t.Fatal(err)
			}
			printed := parse(t, out.Bytes())
			if a, b := value(t, printed, "slurm_microvm_starts_total", ""), value(t, mfs, "slurm_microvm_starts_total", ""); a != b {
				t.Errorf("Write: starts %v, textfile %v", a, b)
			}
		})
	}
}

// TestRecordConcurrent: supervisors that end together all count (the
// lock orders their read-add-write of the state file).
func TestRecordConcurrent(t *testing.T) {
	o := fixture(t)
	const n = 12
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- metrics.Record(context.Background(), o, metrics.Step{Started: true, Phases: map[string]time.Duration{"boot": time.Second}})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(o.Textfile)
	if err != nil {
		t.Fatal(err)
	}
	mfs := parse(t, b)
	if got := value(t, mfs, "slurm_microvm_starts_total", ""); got != n {
		t.Errorf("starts_total %v after %d concurrent records, want %d", got, n, n)
	}
	if got := value(t, mfs, "slurm_microvm_phase_duration_seconds", "phase=boot"); got != n {
		t.Errorf("boot observations %v, want %d", got, n)
	}
	// No temporaries left next to it.
	ents, _ := os.ReadDir(filepath.Dir(o.Textfile))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "slurm_microvm.prom slurm_microvm.prom.lock slurm_microvm.prom.state.json" {
		t.Errorf("textfile directory holds %v", names)
	}
}

func TestRecordOff(t *testing.T) {
	o := fixture(t)
	dir := filepath.Dir(o.Textfile)
	o.Textfile = ""
	if err := metrics.Record(context.Background(), o, metrics.Step{Started: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("textfile \"\" wrote %s", dir)
	}
	var out bytes.Buffer
	if err := metrics.Write(&out, o); err != nil {
		t.Fatal(err)
	}
	if got := value(t, parse(t, out.Bytes()), "slurm_microvm_sandboxes_running", ""); got != 1 {
		t.Errorf("Write without a textfile: sandboxes_running %v, want 1", got)
	}
}

func TestCorruptState(t *testing.T) {
	o := fixture(t)
	if err := os.MkdirAll(filepath.Dir(o.Textfile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(o.Textfile+".state.json", []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := metrics.Record(context.Background(), o, metrics.Step{Started: true})
	if err == nil || !strings.Contains(err.Error(), "state.json") || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("Record over a corrupt state file: %v, want an error naming it and the fix", err)
	}
}
