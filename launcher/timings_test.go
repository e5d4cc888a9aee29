package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

func TestFailedStage(t *testing.T) {
	upTo := func(last string) map[string]time.Duration {
		m := map[string]time.Duration{}
		for _, p := range startPhases {
			if p == last {
				break
			}
			m[p] = time.Millisecond
		}
		return m
	}
	all := upTo("")
	withStop := upTo("")
	withStop[PhaseStop] = time.Second
	boom := errors.New("boom")
	tests := []struct {
		name   string
		phases map[string]time.Duration
		err    error
		want   string
	}{
		{"no error", all, nil, ""},
		{"stopped on purpose", upTo(PhaseImage), fmt.Errorf("prepare the image: %w", state.ErrStopped), ""},
		{"cancelled", upTo(PhaseBoot), fmt.Errorf("boot: %w", context.Canceled), ""},
		{"nothing done", map[string]time.Duration{}, boom, PhaseGPUs},
		{"image failed", upTo(PhaseImage), boom, PhaseImage},
		{"boot failed", upTo(PhaseBoot), boom, PhaseBoot},
		{"after ready", all, boom, stageRun},
		{"stop failed", withStop, boom, stageStop},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := failedStage(tc.phases, tc.err); got != tc.want {
				t.Errorf("failedStage = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestStartFailureCounted: a supervisor whose image cannot be found ends
// with its step counted in the node's metrics file: one start, one
// failure at stage image, the phases before it in the histograms. No
// VM boots.
func TestStartFailureCounted(t *testing.T) {
	fixture.RequireRoot(t)
	fixture.Require(t, "qemu-system-x86_64")
	tmp := t.TempDir()
	cfg := config.Defaults()
	cfg.RuntimeDir = filepath.Join(tmp, "run")
	cfg.CacheDir = filepath.Join(tmp, "cache")
	cfg.Log.Dir = ""
	cfg.Mounts.ScratchBase = ""
	cfg.MPI.Default = "off"
	cfg.Metrics.Textfile = filepath.Join(tmp, "textfile", "slurm_microvm.prom")
	l := &Launcher{Config: &cfg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		imageHelper: []string{testBinary(t)}, imageHelperEnv: []string{envImageHelper + "=1"}}
	s := &Spec{ID: state.StepID{Job: 4100000000 + uint32(time.Now().UnixNano()%1000000), Step: 0},
		UID: 65534, GID: 65534, Groups: []uint32{65534}, User: "nobody",
		Image: filepath.Join(tmp, "no-such-image.tar"), CPUs: 1, LocalTasks: 1, Hostname: "t", Network: "none"}
	ctx := context.Background()
	if err := l.Prepare(ctx, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.Remove(s.Dir(&cfg).File(state.SupervisorFile)) // this process
		_ = l.Stop(context.Background(), s.ID)
	})
	for i := 0; i < 2; i++ {
		if err := l.Start(ctx, s.ID); err == nil {
			t.Fatal("Start with a missing image succeeded")
		}
		_ = os.Remove(s.Dir(&cfg).File(state.ErrorFile))
	}
	f, err := os.Open(cfg.Metrics.Textfile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(f)
	if err != nil {
		t.Fatal(err)
	}
	if got := mfs["slurm_microvm_starts_total"].GetMetric()[0].GetCounter().GetValue(); got != 2 {
		t.Errorf("starts_total %v, want 2", got)
	}
	failures := map[string]float64{}
	for _, m := range mfs["slurm_microvm_failures_total"].GetMetric() {
		failures[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	if failures[PhaseImage] != 2 || failures[PhaseBoot] != 0 || len(failures) != len(metricsStages) {
		t.Errorf("failures_total %v, want image 2 and every other stage 0", failures)
	}
	phases := map[string]uint64{}
	for _, m := range mfs["slurm_microvm_phase_duration_seconds"].GetMetric() {
		phases[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
	}
	if phases[PhaseGPUs] != 2 || phases[PhaseShares] != 2 || phases[PhaseImage] != 0 {
		t.Errorf("phase observations %v, want gpus and shares 2 each, image none", phases)
	}
}
