// Package benchreport is the report of one `make bench` run (test/bench):
// figures with their unit, target and the command that measures them,
// printed as a table and stored as JSON, from which test/bench/benchdoc
// regenerates the README's measurements.
package benchreport

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
)

// Figure is one measured result of `make bench`: what was measured, its
// value and unit, the target it is held to (empty: reported only) and the
// command that measures it, so a reader can reproduce it. Ratios are the
// result; absolute times hold for the machine that ran the bench only.
type Figure struct {
	// Section groups figures in the report: "launch", "size", "exec",
	// "placement", "shares", "memory", "baseline", "mpi".
	Section string  `json:"section"`
	Name    string  `json:"name"`
	Value   float64 `json:"value"`
	// Unit is "ms", "us", "ratio", "MB/s", "files/s", "MiB" or "%".
	Unit string `json:"unit"`
	// Target is the bound the issue sets, as text ("<= 1.15"); empty when
	// the figure is reported only.
	Target string `json:"target,omitempty"`
	// Met says whether Value meets Target (nil without a target).
	Met *bool `json:"met,omitempty"`
	// Command measures the figure (what runs, in which shape).
	Command string `json:"command"`
}

// Report collects the figures of one `make bench` run. Benchmarks add to
// it; TestMain prints it and writes it as JSON to $SMV_BENCH_JSON when set.
type Report struct {
	mu      sync.Mutex
	Host    string    `json:"host"`
	Accel   string    `json:"accelerator"`
	Kernel  string    `json:"guest_kernel"`
	CPUs    int       `json:"host_cpus"`
	Started time.Time `json:"started"`
	Rounds  int       `json:"rounds"`
	Figures []Figure  `json:"figures"`
}

// New returns an empty report of a run that takes the median of rounds
// samples per figure.
func New(rounds int) *Report {
	host, _ := os.Hostname()
	return &Report{Host: host, CPUs: runtime.NumCPU(), Started: time.Now().UTC(), Rounds: rounds}
}

// Read loads a report Write stored.
func Read(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the bench report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("reading the bench report %s: %w", path, err)
	}
	return &r, nil
}

// Add records f. A target "<= X", "< X", ">= X" or "> X" is checked against
// Value and the verdict stored in Met.
func (r *Report) Add(f Figure) {
	if f.Target != "" {
		var op string
		var bound float64
		if _, err := fmt.Sscanf(f.Target, "%s %g", &op, &bound); err == nil {
			var ok bool
			switch op {
			case "<=":
				ok = f.Value <= bound
			case "<":
				ok = f.Value < bound
			case ">=":
				ok = f.Value >= bound
			case ">":
				ok = f.Value > bound
			}
			f.Met = &ok
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Figures = append(r.Figures, f)
}

// Environment records the accelerator and guest kernel of the run (the
// first caller wins).
func (r *Report) Environment(accel, kernel string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Accel == "" {
		r.Accel, r.Kernel = accel, kernel
	}
}

// Sections are the report's sections in the order it is printed, with
// their titles.
var Sections = []struct{ Key, Title string }{
	{"launch", "Step launch"},
	{"size", "Launch time by guest size"},
	{"exec", "Exec round trip in a running microVM"},
	{"placement", "Placement"},
	{"shares", "Host shares (read-only data)"},
	{"memory", "VMM memory"},
	{"baseline", "Against a container boundary"},
	{"mpi", "MPI"},
}

// Text renders the report as the table `make bench` prints.
func (r *Report) Text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	rank := map[string]int{}
	for i, s := range Sections {
		rank[s.Key] = i
	}
	figs := append([]Figure(nil), r.Figures...)
	sort.SliceStable(figs, func(i, j int) bool { return rank[figs[i].Section] < rank[figs[j].Section] })
	var sb strings.Builder
	fmt.Fprintf(&sb, "slurm-microvm bench: accelerator %s, guest kernel %s, %d host CPUs, median of %d\n", r.Accel, r.Kernel, r.CPUs, r.Rounds)
	sec := ""
	for _, f := range figs {
		if f.Section != sec {
			sec = f.Section
			fmt.Fprintf(&sb, "\n[%s]\n", sec)
		}
		verdict := ""
		if f.Target != "" {
			verdict = "target " + f.Target
			if f.Met != nil && *f.Met {
				verdict += " (met)"
			} else if f.Met != nil {
				verdict += " (NOT met)"
			}
		}
		fmt.Fprintf(&sb, "  %-46s %10.2f %-7s %s\n", f.Name, f.Value, f.Unit, verdict)
	}
	return sb.String()
}

// Write stores the report as indented JSON at path, through a temporary
// file and a rename.
func (r *Report) Write(path string) error {
	r.mu.Lock()
	data, err := json.MarshalIndent(r, "", "  ")
	r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("encoding the bench report: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".bench-*.json")
	if err != nil {
		return fmt.Errorf("writing the bench report: %w", err)
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the bench report %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the bench report %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("installing the bench report at %s: %w", path, err)
	}
	return nil
}
