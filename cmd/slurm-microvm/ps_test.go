package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/inventory"
	"github.com/slurm-microvm/slurm-microvm/launcher/metrics"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// TestPsAndInspect: ps lists a prepared and a running step (table and
// JSON), inspect prints one in full, and bad ids are refused by name.
func TestPsAndInspect(t *testing.T) {
	dir := t.TempDir()
	rt := filepath.Join(dir, "run")
	conf := write(t, dir, "microvm.toml", fmt.Sprintf("runtime_dir = %q\ncache_dir = %q\n", rt, filepath.Join(dir, "cache")))
	if err := state.MakeDir(rt, 0o711); err != nil {
		t.Fatal(err)
	}
	for i, id := range []state.StepID{{Job: 77, Step: 0, Node: "n1"}, {Job: 78, Step: 2, Node: "n1"}} {
		d := state.Dir{Root: rt, ID: id}
		if err := os.Mkdir(d.Path(), 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(launcher.Spec{ID: id, UID: 1000, User: "alice", Image: "docker://alpine", MemMiB: 512})
		if err := state.WriteFileAtomic(d.File(state.SpecFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			if err := d.RecordSupervisor(os.Getpid()); err != nil {
				t.Fatal(err)
			}
			if err := inventory.WriteResolved(d, inventory.Resolved{ImageDigest: "sha256:0123456789abcdef0123", VCPUs: 4, MemoryMiB: 1024}); err != nil {
				t.Fatal(err)
			}
			if err := state.WriteFileAtomic(d.File(state.ReadyFile), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	code, out := runApp(t, "--config", conf, "ps", "--json")
	if code != 0 {
		t.Fatalf("ps --json: %d %s", code, out)
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("ps --json: %v\n%s", err, out)
	}
	if len(list) != 2 || list[0]["phase"] != "preparing" || list[1]["phase"] != "running" || list[1]["memory_mib"] != 1024.0 || list[1]["vcpus"] != 4.0 {
		t.Errorf("ps --json: %s", out)
	}
	code, out = runApp(t, "--config", conf, "ps")
	if code != 0 || !strings.Contains(out, "78.2") || !strings.Contains(out, "alice(1000)") || !strings.Contains(out, "sha256:0123456789ab") || !strings.Contains(out, "running") {
		t.Errorf("ps: %d\n%s", code, out)
	}
	code, out = runApp(t, "--config", conf, "inspect", "78.2")
	var rec map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &rec) != nil || rec["state_dir"] != filepath.Join(rt, "78.2.0.n1") || rec["spec"] == nil {
		t.Errorf("inspect 78.2: %d\n%s", code, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"inspect", "78"}, `step "78": want JOB.STEP`},
		{[]string{"inspect", "79.0"}, "step 79.0: no sandbox on this node"},
		{[]string{"inspect"}, "name one step"},
	} {
		code, out := runApp(t, append([]string{"--config", conf}, tc.args...)...)
		if code == 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%v: %d %q, want an error with %q", tc.args, code, out, tc.want)
		}
	}
	// No sandboxes: an empty array, not null.
	if err := os.RemoveAll(rt); err != nil {
		t.Fatal(err)
	}
	if code, out := runApp(t, "--config", conf, "ps", "--json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("ps --json with none: %d %q", code, out)
	}
}

// TestMetricsCommand: `metrics` prints the counters kept for the
// textfile and the gauges, in a form Prometheus's text parser reads.
func TestMetricsCommand(t *testing.T) {
	dir := t.TempDir()
	textfile := filepath.Join(dir, "tf", "slurm_microvm.prom")
	conf := write(t, dir, "microvm.toml", fmt.Sprintf("runtime_dir = %q\ncache_dir = %q\n[metrics]\ntextfile = %q\n", filepath.Join(dir, "run"), filepath.Join(dir, "cache"), textfile))
	cfg, err := config.Load(conf, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := metrics.Record(context.Background(), launcher.MetricsOptions(cfg), metrics.Step{Started: true, Failed: "boot"}); err != nil {
		t.Fatal(err)
	}
	code, out := runApp(t, "--config", conf, "metrics")
	if code != 0 {
		t.Fatalf("metrics: %d %s", code, out)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(out))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, out)
	}
	if v := mfs["slurm_microvm_starts_total"].GetMetric()[0].GetCounter().GetValue(); v != 1 {
		t.Errorf("starts_total %v, want 1", v)
	}
	if mfs["slurm_microvm_sandboxes_running"] == nil || len(mfs["slurm_microvm_failures_total"].GetMetric()) < 9 {
		t.Errorf("metrics lack the gauge or the stages:\n%s", out)
	}
}
