package report

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"strconv"
	"strings"
	"time"
)

//go:embed report.html.tmpl
var pageTemplate string

// page is what report.html.tmpl renders.
type page struct {
	R       *Report
	Summary string
	Elapsed string // Finished - Started, "" when either is unknown
	PSS     string // the VMM PSS cell of the load table
	Hist    *histogram
}

// renderHTML writes r as one self-contained HTML page (inline CSS and
// SVG, no script, no external resource) to w. Every string of r is
// escaped by html/template: evidence is plain text and stays text.
func renderHTML(w io.Writer, r *Report) error {
	tmpl, err := template.New("report.html").Funcs(template.FuncMap{
		"join":         strings.Join,
		"when":         when,
		"duration":     durationText,
		"verdictClass": verdictClass,
		"conversions":  conversions,
		"f":            func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
		"add":          func(a, b float64) float64 { return a + b },
		"half":         func(a, b float64) float64 { return (a + b) / 2 },
	}).Parse(pageTemplate)
	if err != nil {
		return fmt.Errorf("parse the report's HTML template: %w", err)
	}
	p := page{R: r, Summary: Summary(r), Hist: newHistogram(r.Load)}
	if !r.Started.IsZero() && !r.Finished.IsZero() && !r.Finished.Before(r.Started) {
		p.Elapsed = r.Finished.Sub(r.Started).Round(time.Second).String()
	}
	if r.Load != nil {
		p.PSS = "not measured"
		if mean, maxPSS, ok := pssStats(r.Load.VMMPSSMiB); ok {
			p.PSS = fmt.Sprintf("%.1f MiB mean, %.1f MiB max (%d sandboxes)", mean, maxPSS, len(r.Load.VMMPSSMiB))
		}
	}
	if err := tmpl.Execute(w, p); err != nil {
		return fmt.Errorf("render the report's HTML: %w", err)
	}
	return nil
}

// when formats a report time, "—" when unknown.
func when(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.Format("2006-01-02 15:04:05 MST")
}

// durationText formats a duration in ms: "850 ms" below 10 s, "12.3 s"
// above, "" for 0 (not measured).
func durationText(ms int64) string {
	switch {
	case ms <= 0:
		return ""
	case ms < 10_000:
		return fmt.Sprintf("%d ms", ms)
	default:
		return fmt.Sprintf("%.1f s", float64(ms)/1000)
	}
}

// verdictClass is the CSS class of a verdict's cell.
func verdictClass(v Verdict) string {
	switch v {
	case Pass:
		return "verdict-pass"
	case Fail:
		return "verdict-fail"
	default:
		return "verdict-skip"
	}
}
