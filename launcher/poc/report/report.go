package report

import "time"

// Verdict is a check's outcome.
type Verdict string

// Verdicts, as printed: one line per check, "PASS id: title".
const (
	Pass Verdict = "PASS"
	Fail Verdict = "FAIL"
	Skip Verdict = "SKIP"
)

// Check is one check's outcome with its evidence. Evidence never holds
// tenant data (an environment value, file content of a job): only ids,
// exit codes, counts, durations, paths the poc made and lines of the
// launcher's own messages.
type Check struct {
	// ID is stable, dotted: "<group>.<name>", e.g. "isolation.files",
	// "fault.vmm-killed" (SPECIFICATION.md links to it).
	ID      string  `json:"id"`
	Group   string  `json:"group"` // isolation, fault, load, diagnosis
	Title   string  `json:"title"` // what is proved, one line
	Verdict Verdict `json:"verdict"`
	// Reason says why a check failed or was skipped (for a pass: a one
	// line summary, may be empty).
	Reason   string   `json:"reason,omitempty"`
	Evidence []string `json:"evidence,omitempty"`
	Jobs     []int    `json:"jobs,omitempty"` // Slurm job ids the check ran
	// TeardownMS is the time (ms) from the step's end as Slurm saw it to
	// nothing of it left on the node; 0 when not measured.
	TeardownMS int64 `json:"teardown_ms,omitempty"`
	// DurationMS is how long the check ran (ms).
	DurationMS int64 `json:"duration_ms"`
}

// Load is what the load checks measured.
type Load struct {
	// Concurrent is how many sandboxes ran at once on the node, of
	// ConcurrentWanted (what the node's CPUs and memory fit).
	Concurrent       int `json:"concurrent"`
	ConcurrentWanted int `json:"concurrent_wanted"`
	// VMMPSSMiB is each concurrent sandbox's VMM host memory (PSS, MiB,
	// /proc/PID/smaps_rollup).
	VMMPSSMiB []float64 `json:"vmm_pss_mib,omitempty"`
	// ArrayTasks tiny steps of one job array ran at StepsPerMinute.
	ArrayTasks     int     `json:"array_tasks"`
	StepsPerMinute float64 `json:"steps_per_minute"`
	// BackToBack steps of one image in one job; ImageConversions is how
	// many times its image was converted (1: converted once, reused).
	BackToBack       int `json:"back_to_back"`
	ImageConversions int `json:"image_conversions"`
	// StartMS are the start times (ms) of every load step: `srun
	// --microvm true` from launch to the workload's end, measured on the
	// node by the batch step; P50MS, P95MS and MaxMS summarize them.
	StartMS []int64 `json:"start_ms,omitempty"`
	P50MS   int64   `json:"p50_ms"`
	P95MS   int64   `json:"p95_ms"`
	MaxMS   int64   `json:"max_ms"`
}

// Report is one poc run.
type Report struct {
	Version   string    `json:"version"`
	Started   time.Time `json:"started"`
	Finished  time.Time `json:"finished"`
	Cluster   string    `json:"cluster"`   // ClusterName
	Partition string    `json:"partition"` // "" : the default
	Node      string    `json:"node"`
	Users     []string  `json:"users"`
	Image     string    `json:"image"`
	Driver    string    `json:"driver"`
	Accel     string    `json:"accel"` // kvm or tcg
	// UnkillableStepTimeoutS is Slurm's (s): teardown times are printed
	// against it.
	UnkillableStepTimeoutS int `json:"unkillable_step_timeout_s"`
	// Notes are facts a reader needs (e.g. "GPU checks ran on fake GRES").
	Notes  []string `json:"notes,omitempty"`
	Checks []Check  `json:"checks"`
	Load   *Load    `json:"load,omitempty"`
}

// Counts returns how many checks passed, failed and were skipped.
func (r *Report) Counts() (pass, fail, skip int) {
	for _, c := range r.Checks {
		switch c.Verdict {
		case Pass:
			pass++
		case Fail:
			fail++
		default:
			skip++
		}
	}
	return pass, fail, skip
}
