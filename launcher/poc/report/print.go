package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Print writes r for a terminal: one line per check in r.Checks' order,
//
//	PASS <id>: <title>[: <reason>]
//	FAIL <id>: <title>: <reason>
//	SKIP <id>: <title>: <reason>
//
// each followed by " (teardown N ms of UnkillableStepTimeout S s)" when
// the check measured a teardown (the "of ..." part only when the report
// knows the timeout), then the load figures when r.Load is set, then the
// closing line of Summary. A pass prints its reason (a one-line summary)
// only when it has one; a failure or skip without a reason prints "no
// reason given" so that the line never hides that one is missing. Write
// errors of w are ignored, as fmt.Fprintf's are on a terminal.
func Print(w io.Writer, r *Report) {
	if r == nil {
		r = &Report{}
	}
	for _, c := range r.Checks {
		fmt.Fprintln(w, checkLine(c, r.UnkillableStepTimeoutS))
	}
	for _, l := range r.Load.lines() {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintln(w, Summary(r))
}

// Summary returns the closing line of Print, exactly
// "N passed, N failed, N skipped" (Report.Counts; a verdict other than
// PASS or FAIL counts as skipped).
func Summary(r *Report) string {
	if r == nil {
		r = &Report{}
	}
	pass, fail, skip := r.Counts()
	return fmt.Sprintf("%d passed, %d failed, %d skipped", pass, fail, skip)
}

// checkLine is c's line of Print; timeoutS is Slurm's
// UnkillableStepTimeout (s), 0 when unknown.
func checkLine(c Check, timeoutS int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %s", c.Verdict, c.ID, oneLine(c.Title))
	reason := oneLine(c.Reason)
	if reason == "" && c.Verdict != Pass {
		reason = "no reason given"
	}
	if reason != "" {
		b.WriteString(": ")
		b.WriteString(reason)
	}
	if t := teardownText(c.TeardownMS, timeoutS); t != "" {
		fmt.Fprintf(&b, " (%s)", t)
	}
	return b.String()
}

// teardownText is "teardown N ms of UnkillableStepTimeout S s", or
// without the "of" part when timeoutS is unknown (0), or "" when the
// teardown was not measured (ms 0).
func teardownText(ms int64, timeoutS int) string {
	if ms <= 0 {
		return ""
	}
	if timeoutS <= 0 {
		return fmt.Sprintf("teardown %d ms", ms)
	}
	return fmt.Sprintf("teardown %d ms of UnkillableStepTimeout %d s", ms, timeoutS)
}

// oneLine folds s onto one line (a reason or title with a newline would
// break the one-line-per-check contract of Print).
func oneLine(s string) string {
	return strings.Join(strings.Fields(Printable(s)), " ")
}

// Printable is s with every rune that is not printable (control
// characters, terminal escape sequences) written as a Go escape (\x1b,
// \u200b): a check's reason can hold names other users chose (a file in
// /tmp, a process's command line), and one must not rewrite the terminal's
// line (a FAIL shown as PASS).
func Printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == ' ' || r == '\t' || r == '\n':
			b.WriteRune(r)
		case r == utf8.RuneError || !unicode.IsPrint(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// CheckLine is the line Print writes for c; timeoutS is Slurm's
// UnkillableStepTimeout (s) the teardown is printed against.
func CheckLine(c Check, timeoutS int) string { return checkLine(c, timeoutS) }

// lines are the load figures of Print, none for a nil Load.
func (l *Load) lines() []string {
	if l == nil {
		return nil
	}
	out := []string{
		fmt.Sprintf("load: %d of %d concurrent sandboxes", l.Concurrent, l.ConcurrentWanted),
	}
	if mean, maxPSS, ok := pssStats(l.VMMPSSMiB); ok {
		out = append(out, fmt.Sprintf("load: VMM PSS per sandbox %.1f MiB mean, %.1f MiB max (%d sandboxes)", mean, maxPSS, len(l.VMMPSSMiB)))
	} else {
		out = append(out, "load: VMM PSS per sandbox not measured")
	}
	out = append(out,
		fmt.Sprintf("load: %d-task job array at %.1f steps per minute", l.ArrayTasks, l.StepsPerMinute),
		fmt.Sprintf("load: %d back-to-back steps of one image, %s", l.BackToBack, conversions(l.ImageConversions)),
	)
	if len(l.StartMS) == 0 {
		out = append(out, "load: start time not measured (no samples)")
	} else {
		out = append(out, fmt.Sprintf("load: start time p50 %d ms, p95 %d ms, max %d ms (%d steps)", l.P50MS, l.P95MS, l.MaxMS, len(l.StartMS)))
	}
	return out
}

// conversions says how often the back-to-back image was converted:
// "image converted 1 time" (the promise: converted once, reused after).
func conversions(n int) string {
	if n == 1 {
		return "image converted 1 time"
	}
	return fmt.Sprintf("image converted %d times", n)
}

// pssStats is the mean and the maximum of mib (MiB); ok is false when
// there are no samples.
func pssStats(mib []float64) (mean, maxPSS float64, ok bool) {
	if len(mib) == 0 {
		return 0, 0, false
	}
	var sum float64
	for _, v := range mib {
		sum += v
		maxPSS = math.Max(maxPSS, v)
	}
	return sum / float64(len(mib)), maxPSS, true
}

// Percentile returns the p-th percentile (0 < p <= 100) of ms by the
// nearest-rank method: the smallest sample such that at least p percent
// of the samples are less than or equal to it, i.e. the sample of rank
// ceil(p/100 * N) in ascending order (1-based). The result is always one
// of the samples, never an interpolation: p50 of {1, 2, 3, 4} is 2, p95
// of 20 samples is the 19th, p100 is the maximum. p <= 0 (or NaN) gives
// the minimum, p > 100 the maximum; no samples give 0. ms is not
// modified.
//
// Source: the nearest-rank definition of percentile (NIST/SEMATECH
// e-Handbook of Statistical Methods; Hyndman and Fan 1996, definition 1
// of the inverse empirical distribution function).
func Percentile(ms []int64, p float64) int64 {
	if len(ms) == 0 {
		return 0
	}
	sorted := slices.Clone(ms)
	slices.Sort(sorted)
	return nearestRank(sorted, p)
}

// nearestRank is Percentile on ascending samples (at least one).
func nearestRank(sorted []int64, p float64) int64 {
	n := len(sorted)
	if !(p > 0) {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	// p*n before /100: 99.9/100*1000 rounds to 999.0000000000001 in
	// floating point (rank 1000), 99.9*1000/100 to 999.
	rank := int(math.Ceil(p * float64(n) / 100))
	rank = max(1, min(rank, n))
	return sorted[rank-1]
}

// Summarize sets P50MS, P95MS and MaxMS from StartMS (Percentile's
// nearest rank); all three are 0 without samples. Call it after the last
// sample and before Print or Write.
func (l *Load) Summarize() {
	if l == nil {
		return
	}
	l.P50MS, l.P95MS, l.MaxMS = 0, 0, 0
	if len(l.StartMS) == 0 {
		return
	}
	sorted := slices.Clone(l.StartMS)
	slices.Sort(sorted)
	l.P50MS = nearestRank(sorted, 50)
	l.P95MS = nearestRank(sorted, 95)
	l.MaxMS = sorted[len(sorted)-1]
}
