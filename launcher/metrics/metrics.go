package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/slurm-microvm/slurm-microvm/launcher/flock"
	"github.com/slurm-microvm/slurm-microvm/launcher/inventory"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// Buckets are the upper bounds of phase_duration_seconds, in seconds.
var Buckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// Options say where the metrics live and what the gauges measure.
type Options struct {
	// Textfile is the .prom file ([metrics] textfile); "" keeps none.
	Textfile string
	// RuntimeDir holds the steps' state (sandboxes_running); CacheDir
	// the caches (cache_size_bytes).
	RuntimeDir, CacheDir string
	// Except is left out of sandboxes_running: the step whose
	// supervisor is recording its end.
	Except state.StepID
	// Stages are the failure stages written with 0 before any failed,
	// so that rate() sees each series from its start.
	Stages []string
	// Now is the write time (zero: time.Now).
	Now time.Time
}

// Step is what one supervisor adds to the counters.
type Step struct {
	// Started counts the step in starts_total.
	Started bool
	// Failed is the stage that failed; "": none.
	Failed string
	// Phases are the durations of the phases that succeeded.
	Phases map[string]time.Duration
}

// counters is the state file (<textfile>.state.json).
type counters struct {
	Starts   uint64            `json:"starts"`
	Failures map[string]uint64 `json:"failures,omitempty"`
	Phases   map[string]*hist  `json:"phases,omitempty"`
}

// hist is one histogram: Counts[i] observations in (Bounds[i-1],
// Bounds[i]] (not cumulative), the last one above every bound.
type hist struct {
	Bounds     []float64 `json:"bounds"`
	Counts     []uint64  `json:"counts"`
	SumSeconds float64   `json:"sum_seconds"`
}

func (h *hist) observe(s float64) {
	i := sort.SearchFloat64s(h.Bounds, s)
	h.Counts[i]++
	h.SumSeconds += s
}

func newHist() *hist {
	return &hist{Bounds: append([]float64(nil), Buckets...), Counts: make([]uint64, len(Buckets)+1)}
}

func statePath(textfile string) string { return textfile + ".state.json" }
func lockPath(textfile string) string  { return textfile + ".lock" }

// load reads the state file; a missing one is zero counters. A histogram
// kept with other bounds (an older version) starts again.
func load(textfile string) (*counters, error) {
	c := &counters{}
	b, err := os.ReadFile(statePath(textfile))
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read metrics state: %w", err)
	}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("parse metrics state %s: %w (remove it to start the counters again)", statePath(textfile), err)
	}
	for name, h := range c.Phases {
		if h == nil || !slices.Equal(h.Bounds, Buckets) || len(h.Counts) != len(Buckets)+1 {
			delete(c.Phases, name)
		}
	}
	return c, nil
}

func (c *counters) add(s Step) {
	if s.Started {
		c.Starts++
	}
	if s.Failed != "" {
		if c.Failures == nil {
			c.Failures = map[string]uint64{}
		}
		c.Failures[s.Failed]++
	}
	for name, d := range s.Phases {
		if c.Phases == nil {
			c.Phases = map[string]*hist{}
		}
		h := c.Phases[name]
		if h == nil {
			h = newHist()
			c.Phases[name] = h
		}
		h.observe(d.Seconds())
	}
}

// Record adds step to the counters kept next to o.Textfile and rewrites
// the textfile, under the file's lock (waiting at most until ctx ends).
// Nothing is done when o.Textfile is "". Errors name the file.
func Record(ctx context.Context, o Options, step Step) error {
	if o.Textfile == "" {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(o.Textfile), 0o755); err != nil {
		return fmt.Errorf("metrics textfile %s: %w", o.Textfile, err)
	}
	release, err := flock.Exclusive(ctx, lockPath(o.Textfile), "another step's metrics")
	if err != nil {
		return fmt.Errorf("metrics textfile %s: %w", o.Textfile, err)
	}
	defer release()
	c, err := load(o.Textfile)
	if err != nil {
		return err
	}
	c.add(step)
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if err := state.WriteFileAtomic(statePath(o.Textfile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write metrics state: %w", err)
	}
	reg, err := registry(o, c)
	if err != nil {
		return err
	}
	if err := prometheus.WriteToTextfile(o.Textfile, reg); err != nil {
		return fmt.Errorf("write metrics textfile %s: %w", o.Textfile, err)
	}
	return nil
}

// Write prints the metrics in the text exposition format to w: the
// counters kept next to o.Textfile (zero when "" or none yet) and the
// gauges as they are now.
func Write(w io.Writer, o Options) error {
	c := &counters{}
	if o.Textfile != "" {
		var err error
		if c, err = load(o.Textfile); err != nil {
			return err
		}
	}
	reg, err := registry(o, c)
	if err != nil {
		return err
	}
	mfs, err := reg.Gather()
	if err != nil {
		return fmt.Errorf("gather metrics: %w", err)
	}
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(w, mf); err != nil {
			return err
		}
	}
	return nil
}

// registry holds the metrics of c and the gauges measured now.
func registry(o Options, c *counters) (*prometheus.Registry, error) {
	running, err := inventory.Running(o.RuntimeDir, o.Except)
	if err != nil {
		return nil, fmt.Errorf("count running sandboxes: %w", err)
	}
	caches, err := cacheSizes(o.CacheDir)
	if err != nil {
		return nil, err
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(&collector{c: c, stages: o.Stages, running: running, caches: caches, now: now}); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return reg, nil
}

// cacheSizes is the disk space (allocated blocks) under each directory
// of cacheDir, by its name; a missing cacheDir has none.
func cacheSizes(cacheDir string) (map[string]uint64, error) {
	ents, err := os.ReadDir(cacheDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cache size: %w", err)
	}
	out := map[string]uint64{}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		var n uint64
		// Entries that vanish or cannot be read (a conversion's work
		// directory removed meanwhile) are left out.
		_ = filepath.WalkDir(filepath.Join(cacheDir, e.Name()), func(_ string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if fi, err := d.Info(); err == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					n += uint64(st.Blocks) * 512
				}
			}
			return nil
		})
		out[e.Name()] = n
	}
	return out, nil
}

var (
	descStarts   = prometheus.NewDesc("slurm_microvm_starts_total", "Sandbox starts begun by a step's supervisor.", nil, nil)
	descFailures = prometheus.NewDesc("slurm_microvm_failures_total", "Steps whose sandbox failed, by the phase that failed (run: after it was ready).", []string{"stage"}, nil)
	descPhase    = prometheus.NewDesc("slurm_microvm_phase_duration_seconds", "Duration of each successful phase of a sandbox's start and stop, in seconds.", []string{"phase"}, nil)
	descRunning  = prometheus.NewDesc("slurm_microvm_sandboxes_running", "Sandboxes booting or running on the node when the metrics were written.", nil, nil)
	descCache    = prometheus.NewDesc("slurm_microvm_cache_size_bytes", "Disk space allocated under each directory of cache_dir, in bytes.", []string{"cache"}, nil)
	descUpdated  = prometheus.NewDesc("slurm_microvm_metrics_updated_timestamp_seconds", "When these metrics were written (Unix time, seconds).", nil, nil)
)

type collector struct {
	c       *counters
	stages  []string
	running int
	caches  map[string]uint64
	now     time.Time
}

func (k *collector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(k, ch) }

func (k *collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descStarts, prometheus.CounterValue, float64(k.c.Starts))
	failures := map[string]uint64{}
	for _, s := range k.stages {
		failures[s] = 0
	}
	for s, n := range k.c.Failures {
		failures[s] = n
	}
	for s, n := range failures {
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, float64(n), s)
	}
	for name, h := range k.c.Phases {
		cum := map[float64]uint64{}
		var total uint64
		for i, b := range h.Bounds {
			total += h.Counts[i]
			cum[b] = total
		}
		total += h.Counts[len(h.Bounds)]
		ch <- prometheus.MustNewConstHistogram(descPhase, total, h.SumSeconds, cum, name)
	}
	ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(k.running))
	for name, n := range k.caches {
		ch <- prometheus.MustNewConstMetric(descCache, prometheus.GaugeValue, float64(n), name)
	}
	ch <- prometheus.MustNewConstMetric(descUpdated, prometheus.GaugeValue, float64(k.now.UnixMilli())/1000)
}
