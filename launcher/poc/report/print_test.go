package report

import (
	"bytes"
	"strings"
	"testing"
)

func TestCheckLine(t *testing.T) {
	for _, tc := range []struct {
		name     string
		c        Check
		timeoutS int
		want     string
	}{
		{"pass", Check{ID: "isolation.files", Title: "each tenant reaches only its own paths", Verdict: Pass},
			60, "PASS isolation.files: each tenant reaches only its own paths"},
		{"pass with summary", Check{ID: "isolation.files", Title: "own paths", Verdict: Pass, Reason: "12 paths refused"},
			60, "PASS isolation.files: own paths: 12 paths refused"},
		{"pass with teardown", Check{ID: "fault.exit0", Title: "exit 0", Verdict: Pass, TeardownMS: 850},
			60, "PASS fault.exit0: exit 0 (teardown 850 ms of UnkillableStepTimeout 60 s)"},
		{"teardown, timeout unknown", Check{ID: "fault.exit0", Title: "exit 0", Verdict: Pass, TeardownMS: 850},
			0, "PASS fault.exit0: exit 0 (teardown 850 ms)"},
		{"fail", Check{ID: "fault.vmm-killed", Title: "VMM SIGKILL", Verdict: Fail, Reason: "srun took 31 s to report it", TeardownMS: 1200},
			60, "FAIL fault.vmm-killed: VMM SIGKILL: srun took 31 s to report it (teardown 1200 ms of UnkillableStepTimeout 60 s)"},
		{"fail without reason", Check{ID: "a.b", Title: "t", Verdict: Fail},
			60, "FAIL a.b: t: no reason given"},
		{"skip", Check{ID: "gpu.all", Title: "all GPUs", Verdict: Skip, Reason: "no GRES gpu on node n1"},
			60, "SKIP gpu.all: all GPUs: no GRES gpu on node n1"},
		{"multi-line reason folds", Check{ID: "a.b", Title: "t", Verdict: Fail, Reason: "line one\nline two\t "},
			60, "FAIL a.b: t: line one line two"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := checkLine(tc.c, tc.timeoutS); got != tc.want {
				t.Errorf("checkLine:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestSummary(t *testing.T) {
	for _, tc := range []struct {
		name     string
		verdicts []Verdict
		want     string
	}{
		{"none", nil, "0 passed, 0 failed, 0 skipped"},
		{"mixed", []Verdict{Pass, Pass, Fail, Skip, Pass}, "3 passed, 1 failed, 1 skipped"},
		{"unknown verdict counts as skipped", []Verdict{Pass, "??"}, "1 passed, 0 failed, 1 skipped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Report{}
			for i, v := range tc.verdicts {
				r.Checks = append(r.Checks, Check{ID: "c." + string(rune('a'+i)), Verdict: v})
			}
			if got := Summary(r); got != tc.want {
				t.Errorf("Summary = %q, want %q", got, tc.want)
			}
		})
	}
	if got := Summary(nil); got != "0 passed, 0 failed, 0 skipped" {
		t.Errorf("Summary(nil) = %q", got)
	}
}

func TestPrint(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    *Report
		want []string
	}{
		{"checks and load", &Report{
			UnkillableStepTimeoutS: 60,
			Checks: []Check{
				{ID: "isolation.files", Title: "own paths only", Verdict: Pass},
				{ID: "fault.scancel-step", Title: "scancel of a step", Verdict: Fail, Reason: "a loop device is left: /dev/loop3", TeardownMS: 850},
				{ID: "gpu.one", Title: "one GPU", Verdict: Skip, Reason: "no GPUs"},
			},
			Load: &Load{Concurrent: 6, ConcurrentWanted: 8, VMMPSSMiB: []float64{40, 50},
				ArrayTasks: 100, StepsPerMinute: 312.46, BackToBack: 20, ImageConversions: 1,
				StartMS: []int64{400, 500, 700}, P50MS: 500, P95MS: 700, MaxMS: 700},
		}, []string{
			"PASS isolation.files: own paths only",
			"FAIL fault.scancel-step: scancel of a step: a loop device is left: /dev/loop3 (teardown 850 ms of UnkillableStepTimeout 60 s)",
			"SKIP gpu.one: one GPU: no GPUs",
			"load: 6 of 8 concurrent sandboxes",
			"load: VMM PSS per sandbox 45.0 MiB mean, 50.0 MiB max (2 sandboxes)",
			"load: 100-task job array at 312.5 steps per minute",
			"load: 20 back-to-back steps of one image, image converted 1 time",
			"load: start time p50 500 ms, p95 700 ms, max 700 ms (3 steps)",
			"1 passed, 1 failed, 1 skipped",
		}},
		{"load measured nothing", &Report{
			Checks: []Check{{ID: "load.array", Title: "array", Verdict: Fail, Reason: "sbatch refused"}},
			Load:   &Load{},
		}, []string{
			"FAIL load.array: array: sbatch refused",
			"load: 0 of 0 concurrent sandboxes",
			"load: VMM PSS per sandbox not measured",
			"load: 0-task job array at 0.0 steps per minute",
			"load: 0 back-to-back steps of one image, image converted 0 times",
			"load: start time not measured (no samples)",
			"0 passed, 1 failed, 0 skipped",
		}},
		{"no load", &Report{Checks: []Check{{ID: "a.b", Title: "t", Verdict: Pass}}},
			[]string{"PASS a.b: t", "1 passed, 0 failed, 0 skipped"}},
		{"nil report", nil, []string{"0 passed, 0 failed, 0 skipped"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			Print(&buf, tc.r)
			want := strings.Join(tc.want, "\n") + "\n"
			if got := buf.String(); got != want {
				t.Errorf("Print:\n got:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	twenty := make([]int64, 20)
	for i := range twenty {
		twenty[i] = int64(20 - i) // 20, 19, ..., 1: unsorted on purpose
	}
	thousand := make([]int64, 1000)
	for i := range thousand {
		thousand[i] = int64(i + 1)
	}
	for _, tc := range []struct {
		name string
		ms   []int64
		p    float64
		want int64
	}{
		{"no samples", nil, 50, 0},
		{"one sample p50", []int64{7}, 50, 7},
		{"one sample p95", []int64{7}, 95, 7},
		{"p50 of four is the 2nd, not an interpolation", []int64{4, 1, 3, 2}, 50, 2},
		{"p50 of five is the middle", []int64{5, 1, 4, 2, 3}, 50, 3},
		{"p95 of 20 is the 19th", twenty, 95, 19},
		{"p96 of 20 is the 20th", twenty, 96, 20},
		{"p5 of 20 is the 1st", twenty, 5, 1},
		{"p100 is the max", twenty, 100, 20},
		{"p0 is the min", twenty, 0, 1},
		{"negative p is the min", twenty, -3, 1},
		{"p above 100 is the max", twenty, 250, 20},
		{"tiny p is the min", twenty, 0.001, 1},
		{"p99.9 of 1000 is the 999th", thousand, 99.9, 999},
		{"duplicates", []int64{3, 3, 3, 9}, 75, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]int64(nil), tc.ms...)
			if got := Percentile(tc.ms, tc.p); got != tc.want {
				t.Errorf("Percentile(%d samples, %v) = %d, want %d", len(tc.ms), tc.p, got, tc.want)
			}
			for i := range in {
				if in[i] != tc.ms[i] {
					t.Fatalf("Percentile modified its input: %v, was %v", tc.ms, in)
				}
			}
		})
	}
}

func TestLoadSummarize(t *testing.T) {
	for _, tc := range []struct {
		name          string
		start         []int64
		p50, p95, max int64
	}{
		{"no samples clears stale figures", nil, 0, 0, 0},
		{"one", []int64{420}, 420, 420, 420},
		{"hundred", func() []int64 {
			s := make([]int64, 100)
			for i := range s {
				s[i] = int64(1000 - 10*i) // 1000 ... 10
			}
			return s
		}(), 500, 950, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &Load{StartMS: tc.start, P50MS: -1, P95MS: -1, MaxMS: -1}
			l.Summarize()
			if l.P50MS != tc.p50 || l.P95MS != tc.p95 || l.MaxMS != tc.max {
				t.Errorf("Summarize: p50 %d p95 %d max %d, want %d %d %d", l.P50MS, l.P95MS, l.MaxMS, tc.p50, tc.p95, tc.max)
			}
		})
	}
	var nilLoad *Load
	nilLoad.Summarize() // must not panic
}

// TestPrintableLine: a reason holding a name another user chose (a file
// in /tmp with terminal escapes) cannot rewrite the terminal's line.
func TestPrintableLine(t *testing.T) {
	evil := "left on the node: temporary file /tmp/\x1b[G\x1b[2KPASS fault.exit-0: ok\x1b[8m\r"
	line := CheckLine(Check{ID: "fault.exit-0", Title: "t", Verdict: Fail, Reason: evil}, 60)
	if strings.ContainsAny(line, "\x1b\r") {
		t.Errorf("line %q keeps control characters", line)
	}
	if !strings.HasPrefix(line, "FAIL fault.exit-0: t: ") || !strings.Contains(line, `\x1b[G`) {
		t.Errorf("line %q: want the FAIL with the escapes shown", line)
	}
}
