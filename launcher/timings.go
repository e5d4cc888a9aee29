package launcher

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/inventory"
	"github.com/slurm-microvm/slurm-microvm/launcher/metrics"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// startPhases are the phases of a start in the order they run: a failed
// start failed in the first one not done (metrics' failure stage).
var startPhases = []string{PhaseGPUs, PhaseShares, PhaseImage, PhaseMPI, PhaseAssets, PhaseNetwork, PhaseBoot, PhaseReady}

// Failure stages beyond the start phases.
const (
	stageRun  = "run"  // the sandbox failed after it was ready
	stageStop = "stop" // the supervisor's stop of the sandbox failed
)

// metricsStages are every failure stage, written with 0 from the first
// metrics on.
var metricsStages = append(append([]string(nil), startPhases...), stageRun, stageStop)

// timings are one supervisor's phase durations: logged as each phase
// ends (logPhase), kept for sandbox.json and the node's metrics. The
// first exec is timed from the exec server's goroutine, hence the lock.
type timings struct {
	log *slog.Logger

	mu      sync.Mutex
	phases  map[string]time.Duration
	res     inventory.Resolved
	readyAt time.Time
}

func newTimings(log *slog.Logger) *timings {
	return &timings{log: log, phases: map[string]time.Duration{}}
}

// done logs that phase, begun at t0, is done and keeps its duration.
func (t *timings) done(phase string, t0 time.Time) {
	logPhase(t.log, phase, t0)
	t.mu.Lock()
	t.phases[phase] = time.Since(t0)
	t.mu.Unlock()
}

// resolved records what the supervisor resolved for the step in its
// sandbox.json (ps and inspect read it), with the phases so far.
func (t *timings) resolved(d state.Dir, r inventory.Resolved) {
	t.mu.Lock()
	t.res = r
	t.mu.Unlock()
	t.save(d)
}

// ready marks the sandbox ready: first_exec counts from here.
func (t *timings) ready(d state.Dir) {
	t.mu.Lock()
	t.readyAt = time.Now()
	t.mu.Unlock()
	t.save(d)
}

// firstExec times the first exec client since ready (once per step:
// control.Endpoint.OnFirstClient).
func (t *timings) firstExec(d state.Dir) {
	t.mu.Lock()
	at := t.readyAt
	t.mu.Unlock()
	if at.IsZero() {
		return
	}
	t.done(PhaseFirstExec, at)
	t.save(d)
}

func (t *timings) save(d state.Dir) {
	t.mu.Lock()
	r := t.res
	r.PhasesMS = map[string]int64{}
	for name, dur := range t.phases {
		r.PhasesMS[name] = dur.Milliseconds()
	}
	t.mu.Unlock()
	if err := inventory.WriteResolved(d, r); err != nil {
		t.log.Warn("record the sandbox for ps", "err", err)
	}
}

// snapshot is a copy of the durations so far.
func (t *timings) snapshot() map[string]time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.phases)
}

// failedStage names where a supervisor that ended with err failed: the
// first start phase not done, "run" once the sandbox was ready, "stop"
// when only its stop failed; "" for no failure (err nil, or a stop that
// was asked for: state.ErrStopped, a cancelled context).
func failedStage(phases map[string]time.Duration, err error) string {
	if err == nil || errors.Is(err, state.ErrStopped) || errors.Is(err, context.Canceled) {
		return ""
	}
	if _, ok := phases[PhaseStop]; ok {
		return stageStop
	}
	for _, p := range startPhases {
		if _, ok := phases[p]; !ok {
			return p
		}
	}
	return stageRun
}

// recordMetrics adds the supervisor's step to the node's metrics
// ([metrics] textfile; nothing when ""). A failure to write them is
// logged, never the step's.
func (l *Launcher) recordMetrics(d state.Dir, t *timings, err error) {
	c := l.Config
	if c.Metrics.Textfile == "" {
		return
	}
	phases := t.snapshot()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	step := metrics.Step{Started: true, Failed: failedStage(phases, err), Phases: phases}
	o := MetricsOptions(c)
	o.Except = d.ID
	if merr := metrics.Record(ctx, o, step); merr != nil {
		t.log.Warn("node metrics not written", "err", merr)
	}
}

// MetricsOptions are the node's metrics as c configures them, with every
// failure stage (`slurm-microvm metrics` prints the same as the file).
func MetricsOptions(c *config.Config) metrics.Options {
	return metrics.Options{Textfile: c.Metrics.Textfile, RuntimeDir: c.RuntimeDir, CacheDir: c.CacheDir, Stages: metricsStages}
}
