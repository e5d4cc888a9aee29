// Package report holds the result of one `slurm-microvm poc` run and
// writes it: one line per check on the terminal (Print, Summary),
// report.json for automation and report.html for people (Write).
//
// # What a report holds
//
// Report is the run: the cluster, partition, node, the two test users,
// the image, the VMM driver and its acceleration (kvm or tcg), the
// product's version, start and end times, Slurm's UnkillableStepTimeout
// (teardown times are printed against it) and notes a reader needs (e.g.
// that the GPU checks ran on fake GRES). Check is one check: a stable
// dotted id ("fault.vmm-killed", which SPECIFICATION.md links to), what it
// proves, its verdict (PASS, FAIL, SKIP) with the reason, the Slurm job
// ids it ran, the time from the step's end to nothing of it left on the
// node (teardown), its duration, and evidence: lines of ids, exit codes,
// counts, durations, paths the poc made and the launcher's own messages,
// never tenant data. Load is what the load checks measured: concurrent
// sandboxes of those the node fits, the VMM's host memory (PSS) per
// sandbox, a job array's steps per minute, back-to-back steps of one image
// and how often it was converted, and every step's start time with its
// p50, p95 and maximum (Summarize, by Percentile's nearest rank).
//
//	rep.Load.Summarize()
//	report.Print(os.Stdout, rep)   // PASS/FAIL/SKIP lines, load, "N passed, N failed, N skipped"
//	jsonPath, htmlPath, err := report.Write(dir, rep)
//
// report.html is one file: a header with the run, the summary line, the
// checks table (table#checks, one row per check, verdicts coloured), the
// evidence of each check as preformatted text, the load table, and a
// histogram of the start times (svg#start-times: about sqrt(N) bins of
// whole ms, 10 to 20 of them unless the samples span fewer ms; one bar per
// non-empty bin with a "N steps in A-B ms" tooltip; ms on the x axis; p50
// and p95 as dashed lines). Without start samples
// the page says so instead of drawing an empty picture. Both files are
// written to a temporary file in the directory and renamed, so an
// interrupted run leaves the previous report or the new one, never half of
// one.
//
// # Design decisions (each with the alternative and why not)
//
// The picture is inline SVG, laid out in Go (histogram.go) and rendered by
// html/template: no JavaScript, no font, stylesheet or image fetched, so
// the report opens offline, from a file, on an air-gapped cluster's login
// node or after it is copied to a laptop, in any browser, and it diffs and
// greps as text. Hovering a bar shows its count through SVG's <title>,
// which needs no script. A PNG drawn by a plotting library (gonum/plot)
// was the alternative: it adds a dependency with its own font and
// rasteriser for one chart, the picture cannot carry tooltips or
// selectable numbers, and it is a second file to keep beside the page or a
// base64 blob inside it. A JavaScript chart library (Chart.js, Vega) would
// either be fetched from a CDN (nothing loads on an air-gapped cluster,
// and the report would run third-party code) or be inlined (hundreds of
// kB of script in every report, and a page that shows nothing where
// scripts are off).
//
// Every string of the report is escaped by html/template: evidence is
// plain text (a `<script>` in it stays text), and the page holds no script
// of its own, so escaping is the whole of its safety. Write renders both
// files before writing either.
//
// Percentiles are nearest-rank (always one of the measured samples, never
// an interpolation), so p95 of 20 start times is the 19th fastest: a
// figure a site can find in its own job logs.
//
// The acceptance test (TestReportInChromium) opens report.html in headless
// Chromium through chromedp, reads the checks table and the picture's laid
// out boxes (getBoundingClientRect), and checks that the browser leaves no
// process and no file behind; hack/setup-debian.sh installs Debian's
// chromium for it, and without it the test goes through test/prereq
// (fails under CI=true).
package report
