package report

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// browserTimeout bounds the whole browser test: start, every page, and
// the browser's exit.
const browserTimeout = 90 * time.Second

// rendered is what the page looks like in the browser (browserProbe).
type rendered struct {
	Rows         int      `json:"rows"`
	Bars         int      `json:"bars"`
	BarsDrawn    int      `json:"barsDrawn"`
	FirstTooltip string   `json:"firstTooltip"`
	SVG          bool     `json:"svg"`
	Width        float64  `json:"width"`
	Height       float64  `json:"height"`
	NoPicture    bool     `json:"noPicture"`
	Scripts      int      `json:"scripts"`
	Summary      string   `json:"summary"`
	Evidence     string   `json:"evidence"`
	Verdicts     []string `json:"verdicts"`
	Backgrounds  []string `json:"backgrounds"`
}

// browserProbe reads the rendered page: the checks table's body rows, the
// picture's bars and their laid-out boxes (getBoundingClientRect: zero
// when the SVG does not render), the verdict cells' computed colours.
const browserProbe = `(() => {
	const svg = document.querySelector('svg#start-times');
	const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
	const bars = [...document.querySelectorAll('svg#start-times rect.bar')];
	const cells = [...document.querySelectorAll('table#checks > tbody > tr > td:nth-child(3)')];
	const ev = document.getElementById('evidence-isolation.files');
	const pre = ev ? ev.querySelector('pre') : null;
	return {
		rows: document.querySelectorAll('table#checks > tbody > tr').length,
		bars: bars.length,
		barsDrawn: bars.filter(b => { const r = b.getBoundingClientRect(); return r.width > 0 && r.height > 0; }).length,
		firstTooltip: bars.length ? bars[0].querySelector('title').textContent : '',
		svg: !!svg, width: box.width, height: box.height,
		noPicture: !!document.getElementById('start-times-none'),
		scripts: document.scripts.length,
		summary: document.getElementById('summary').textContent,
		evidence: pre ? pre.textContent : '',
		verdicts: cells.map(td => td.textContent),
		backgrounds: cells.map(td => getComputedStyle(td).backgroundColor),
	};
})()`

// TestReportInChromium is the acceptance test of the human report: the
// report.html that Write makes, opened from disk in headless Chromium (no
// network, no JavaScript of its own), shows one checks-table row per check,
// the verdicts styled apart, the evidence as text, and the start-time
// picture with one drawn bar per non-empty bin and a nonzero size; without
// samples it says so instead. The browser and its profile are gone
// afterwards.
func TestReportInChromium(t *testing.T) {
	prereq.Tools(t, "chromium")
	exe, _ := exec.LookPath("chromium")

	// The browser's temporary files (chromedp's profile directory, the
	// shared memory files of --disable-dev-shm-usage) go to a directory
	// of this test, which must be empty once the browser is gone.
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	// Chromium's zygotes and renderers outlive the main process by a
	// moment: as a child subreaper this test becomes their parent (not
	// PID 1), so it sees each one and reaps it (orphansOf).
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("become a child subreaper: %v", err)
	}
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
	tmpBefore := chromiumLeftovers(t, "/tmp")

	pages := []struct {
		name string
		r    *Report
	}{
		{"full", sampleReport(120)},
		{"one sample", sampleReport(1)},
		{"no start samples", sampleReport(0)},
	}
	urls := make([]string, len(pages))
	for i, p := range pages {
		_, htmlPath, err := Write(filepath.Join(t.TempDir(), "report"), p.r)
		if err != nil {
			t.Fatalf("%s: Write: %v", p.name, err)
		}
		urls[i] = "file://" + htmlPath
	}

	ctx, cancel := context.WithTimeout(t.Context(), browserTimeout)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox, // Chromium refuses to run as root with its sandbox
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 1024),
		chromedp.Flag("no-proxy-server", true), // a file:// page needs no network
	)
	// The browser's own output, read only once the allocator is done
	// (its goroutines write it).
	var browserOut bytes.Buffer
	opts = append(opts, chromedp.CombinedOutput(&browserOut))
	allocCtx, allocCancel := chromedp.NewExecAllocator(ctx, opts...)
	defer allocCancel()
	bctx, bcancel := chromedp.NewContext(allocCtx)
	defer bcancel()
	if err := chromedp.Do(bctx); err != nil {
		allocCancel()
		t.Fatalf("start %s: %v\n%s", exe, err, browserOut.String())
	}
	profiles := chromiumLeftovers(t, tmp)
	if len(profiles) == 0 {
		t.Fatalf("no chromedp profile directory in TMPDIR %s: the cleanup check below would check nothing", tmp)
	}

	for i, p := range pages {
		t.Run(p.name, func(t *testing.T) {
			picture := chromedp.CSS("svg#start-times")
			if len(p.r.Load.StartMS) == 0 {
				picture = chromedp.CSS("#start-times-none")
			}
			if err := chromedp.Do(bctx, chromedp.Navigate(urls[i]), chromedp.WaitVisible(picture)); err != nil {
				t.Fatalf("load %s in Chromium: %v", urls[i], err)
			}
			got, err := chromedp.Run(bctx, chromedp.Evaluate[rendered](browserProbe))
			if err != nil {
				t.Fatalf("read %s in Chromium: %v", urls[i], err)
			}
			if got.Rows != len(p.r.Checks) {
				t.Errorf("table#checks shows %d rows, want %d (one per check)", got.Rows, len(p.r.Checks))
			}
			if got.Summary != Summary(p.r) {
				t.Errorf("summary %q, want %q", got.Summary, Summary(p.r))
			}
			if got.Scripts != 0 {
				t.Errorf("the page has %d scripts, want none", got.Scripts)
			}
			if want := strings.Join(p.r.Checks[0].Evidence, "\n"); got.Evidence != want {
				t.Errorf("evidence shows as %q, want the text %q", got.Evidence, want)
			}
			var wantVerdicts []string
			for _, c := range p.r.Checks {
				wantVerdicts = append(wantVerdicts, string(c.Verdict))
			}
			if !slices.Equal(got.Verdicts, wantVerdicts) {
				t.Errorf("verdicts %q, want %q", got.Verdicts, wantVerdicts)
			}
			if bg := got.Backgrounds; len(bg) != 3 || bg[0] == bg[1] || bg[1] == bg[2] || bg[0] == bg[2] || slices.Contains(bg, "rgba(0, 0, 0, 0)") {
				t.Errorf("verdict backgrounds %q: PASS, FAIL and SKIP are not styled apart", bg)
			}

			if len(p.r.Load.StartMS) == 0 {
				if got.SVG || !got.NoPicture {
					t.Errorf("without samples: svg %v, notice %v; want the notice instead of a picture", got.SVG, got.NoPicture)
				}
				return
			}
			if !got.SVG || got.NoPicture {
				t.Fatalf("svg#start-times %v, no-picture notice %v", got.SVG, got.NoPicture)
			}
			if got.Width <= 0 || got.Height <= 0 {
				t.Errorf("the picture renders %.0f x %.0f px, want a nonzero size", got.Width, got.Height)
			}
			want := nonEmptyBins(p.r.Load.StartMS)
			if got.Bars != want || got.BarsDrawn != want {
				t.Errorf("the picture has %d bars, %d of them drawn with a nonzero box; want %d (one per non-empty bin)", got.Bars, got.BarsDrawn, want)
			}
			if !strings.Contains(got.FirstTooltip, " in ") || !strings.HasSuffix(got.FirstTooltip, " ms") {
				t.Errorf("first bar's tooltip %q, want \"N steps in A-B ms\"", got.FirstTooltip)
			}
		})
	}

	// Close the browser gracefully (Browser.close: Chromium stops its
	// children and removes its own temporary files), then let the
	// allocator wait for it and remove the profile. A plain cancel of bctx
	// would SIGKILL the main process and orphan its children.
	pid := chromedp.FromContext(bctx).Browser.Process().Pid
	if err := chromedp.Cancel(bctx); err != nil {
		t.Errorf("close Chromium: %v", err)
	}
	allocCancel() // waits for the browser to exit and its profile to go
	if err := ctx.Err(); err != nil {
		t.Fatalf("the browser test ran past %s: %v\n%s", browserTimeout, err, browserOut.String())
	}
	cancel()

	// Nothing left: no process of this browser (the main process, a
	// child that names the profile, an orphan that came to this test), no
	// profile, no temporary file.
	if err := unix.Kill(pid, 0); err == nil {
		t.Errorf("Chromium (pid %d) still runs after the allocator's cancel", pid)
	}
	if alive := reapOrphans(t, 5*time.Second); len(alive) > 0 {
		t.Errorf("Chromium left processes running after it closed (killed now): %q", alive)
	}
	for _, prof := range profiles {
		if pids := processesNaming(t, prof); len(pids) > 0 {
			t.Errorf("Chromium processes %v still name the profile %s", pids, prof)
		}
	}
	if left := dirEntries(t, tmp); len(left) > 0 {
		t.Errorf("the browser left %q in its TMPDIR %s", left, tmp)
	}
	if after := chromiumLeftovers(t, "/tmp"); len(after) > len(tmpBefore) {
		t.Errorf("Chromium files in /tmp before the test %q, after %q", tmpBefore, after)
	}
}

// chromiumLeftovers lists dir's entries that a Chromium run makes:
// chromedp's profile directories and Chromium's shared memory files.
func chromiumLeftovers(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, name := range dirEntries(t, dir) {
		if strings.HasPrefix(name, "chromedp-runner") || strings.HasPrefix(name, ".org.chromium.") || strings.HasPrefix(name, ".com.google.Chrome.") {
			out = append(out, filepath.Join(dir, name))
		}
	}
	return out
}

func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// processesNaming returns the pids whose command line holds
// --user-data-dir=profile (Chromium passes it to every child).
func processesNaming(t *testing.T, profile string) []int {
	t.Helper()
	want := []byte("--user-data-dir=" + profile + "\x00")
	var pids []int
	for _, name := range dirEntries(t, "/proc") {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", name, "cmdline"))
		if err == nil && bytes.Contains(cmdline, want) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// reapOrphans reaps the processes that were orphaned to this test (a
// child subreaper) and are not children it started itself: Chromium's
// children once the browser is gone. It waits up to grace for them to
// exit, then kills and reaps the rest and returns their command lines.
func reapOrphans(t *testing.T, grace time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(grace)
	for {
		var alive []int
		for _, pid := range childrenOf(t, os.Getpid()) {
			var ws unix.WaitStatus
			if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
				continue // exited: reaped now
			}
			alive = append(alive, pid)
		}
		if len(alive) == 0 {
			return nil
		}
		if time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		var left []string
		for _, pid := range alive {
			cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			left = append(left, fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
			_ = unix.Kill(pid, unix.SIGKILL)
			var ws unix.WaitStatus
			_, _ = unix.Wait4(pid, &ws, 0, nil)
		}
		return left
	}
}

// childrenOf lists the pids whose parent is ppid (/proc/PID/stat field 4).
func childrenOf(t *testing.T, ppid int) []int {
	t.Helper()
	var pids []int
	for _, name := range dirEntries(t, "/proc") {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", name, "stat"))
		if err != nil {
			continue
		}
		// "pid (comm) state ppid ...": comm may hold spaces and parens.
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		fields := strings.Fields(string(rest))
		if len(fields) > 1 && fields[1] == strconv.Itoa(ppid) {
			pids = append(pids, pid)
		}
	}
	return pids
}
