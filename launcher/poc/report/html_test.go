package report

import (
	"bytes"
	"strings"
	"testing"

	"golang.org/x/net/html"
)

// render renders r and parses the page back as a browser would.
func render(t *testing.T, r *Report) (string, *html.Node) {
	t.Helper()
	var buf bytes.Buffer
	if err := renderHTML(&buf, r); err != nil {
		t.Fatalf("renderHTML: %v", err)
	}
	doc, err := html.Parse(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("parse the page: %v", err)
	}
	return buf.String(), doc
}

// find returns the nodes under n for which match holds, in document order.
func find(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	for d := range n.Descendants() {
		if match(d) {
			out = append(out, d)
		}
	}
	return out
}

func element(tag string) func(*html.Node) bool {
	return func(n *html.Node) bool { return n.Type == html.ElementNode && n.Data == tag }
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func byID(doc *html.Node, id string) *html.Node {
	if ns := find(doc, func(n *html.Node) bool { return n.Type == html.ElementNode && attr(n, "id") == id }); len(ns) > 0 {
		return ns[0]
	}
	return nil
}

func text(n *html.Node) string {
	var b strings.Builder
	for d := range n.Descendants() {
		if d.Type == html.TextNode {
			b.WriteString(d.Data)
		}
	}
	return b.String()
}

// TestHTMLEscapesEvidence: evidence, titles, reasons and notes are plain
// text: a <script> in them stays text, nothing becomes an element.
func TestHTMLEscapesEvidence(t *testing.T) {
	r := sampleReport(30)
	page, doc := render(t, r)
	if s := find(doc, element("script")); len(s) != 0 {
		t.Errorf("the page has %d <script> elements, want none (evidence must stay text)", len(s))
	}
	for _, tag := range []string{"i", "quickly"} {
		if s := find(doc, element(tag)); len(s) != 0 {
			t.Errorf("markup from the report's strings became a <%s> element", tag)
		}
	}
	if strings.Contains(strings.ToLower(page), "<script") {
		t.Errorf("the page holds a raw <script")
	}
	for _, c := range r.Checks {
		sec := byID(doc, "evidence-"+c.ID)
		if sec == nil {
			t.Fatalf("no evidence section for %s", c.ID)
		}
		pres := find(sec, element("pre"))
		if len(c.Evidence) == 0 {
			if len(pres) != 0 {
				t.Errorf("%s: a <pre> without evidence", c.ID)
			}
			continue
		}
		if len(pres) != 1 {
			t.Fatalf("%s: %d <pre>, want 1", c.ID, len(pres))
		}
		if got, want := text(pres[0]), strings.Join(c.Evidence, "\n"); got != want {
			t.Errorf("%s: evidence reads back as\n%q\nwant\n%q", c.ID, got, want)
		}
	}
	if got := text(byID(doc, "notes")); !strings.Contains(got, "note with <i>markup</i>") {
		t.Errorf("notes read back as %q", got)
	}
}

// TestHTMLPage: the header, the summary, one row per check with its
// verdict styled, the load table, and the picture or its absence.
func TestHTMLPage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		r       *Report
		picture bool
	}{
		{"full", sampleReport(120), true},
		{"one sample", sampleReport(1), true},
		{"no start samples", sampleReport(0), false},
		{"no load", &Report{Checks: sampleReport(0).Checks}, false},
		{"no checks", &Report{Cluster: "c"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			page, doc := render(t, tc.r)
			// Self-contained: nothing fetched, nothing run; the page's
			// policy says so to the browser too.
			if !strings.Contains(page, `content="default-src 'none'; style-src 'unsafe-inline'"`) {
				t.Error("the page has no Content-Security-Policy forbidding everything but its inline style")
			}
			for _, bad := range []string{"<script", "<link", "src=", "@import", "url("} {
				if strings.Contains(page, bad) {
					t.Errorf("the page holds %q: it must open offline, without JavaScript", bad)
				}
			}
			if n := strings.Count(page, "http") - strings.Count(page, `http-equiv=`); n != strings.Count(page, `xmlns="http://www.w3.org/2000/svg"`) {
				t.Errorf("the page names a URL other than the SVG namespace")
			}
			if got := text(byID(doc, "summary")); got != Summary(tc.r) {
				t.Errorf("summary %q, want %q", got, Summary(tc.r))
			}
			run := text(byID(doc, "run"))
			for _, want := range []string{tc.r.Cluster, tc.r.Node, tc.r.Image, tc.r.Driver, tc.r.Accel, tc.r.Version} {
				if !strings.Contains(run, want) {
					t.Errorf("header %q lacks %q", run, want)
				}
			}
			table := byID(doc, "checks")
			if table == nil {
				t.Fatal("no table#checks")
			}
			rows := find(table, func(n *html.Node) bool {
				return n.Type == html.ElementNode && n.Data == "tr" && n.Parent.Data == "tbody"
			})
			if len(rows) != len(tc.r.Checks) {
				t.Fatalf("table#checks has %d body rows, want %d", len(rows), len(tc.r.Checks))
			}
			for i, row := range rows {
				c := tc.r.Checks[i]
				cells := find(row, element("td"))
				if len(cells) != 6 {
					t.Fatalf("%s: %d cells, want 6", c.ID, len(cells))
				}
				if got := text(cells[0]); got != c.ID {
					t.Errorf("row %d id %q, want %q", i, got, c.ID)
				}
				if got := text(cells[2]); got != string(c.Verdict) {
					t.Errorf("%s verdict %q, want %q", c.ID, got, c.Verdict)
				}
				if cls := attr(cells[2], "class"); !strings.Contains(cls, verdictClass(c.Verdict)) {
					t.Errorf("%s verdict cell class %q, want %s", c.ID, cls, verdictClass(c.Verdict))
				}
				if got := text(cells[3]); got != c.Reason {
					t.Errorf("%s reason %q, want %q", c.ID, got, c.Reason)
				}
			}
			if (byID(doc, "load") != nil) != (tc.r.Load != nil) {
				t.Errorf("table#load present: %v, load ran: %v", byID(doc, "load") != nil, tc.r.Load != nil)
			}
			svg, none := byID(doc, "start-times"), byID(doc, "start-times-none")
			if !tc.picture {
				if svg != nil || none == nil {
					t.Errorf("without samples: svg %v, notice %v; want no svg and the notice", svg != nil, none != nil)
				}
				return
			}
			if svg == nil || none != nil {
				t.Fatalf("with samples: svg %v, notice %v; want the svg only", svg != nil, none != nil)
			}
			bars := find(svg, func(n *html.Node) bool { return n.Data == "rect" && attr(n, "class") == "bar" })
			if want := nonEmptyBins(tc.r.Load.StartMS); len(bars) != want {
				t.Errorf("svg has %d bars, want %d (one per non-empty bin)", len(bars), want)
			}
			steps := 0
			for _, b := range bars {
				titles := find(b, element("title"))
				if len(titles) != 1 {
					t.Fatalf("bar without its <title> tooltip")
				}
				var n, a, z int
				if _, err := fmtSscanf(text(titles[0]), &n, &a, &z); err != nil {
					t.Errorf("tooltip %q is not \"N steps in A-B ms\": %v", text(titles[0]), err)
				}
				steps += n
			}
			if steps != len(tc.r.Load.StartMS) {
				t.Errorf("the tooltips count %d steps, want %d", steps, len(tc.r.Load.StartMS))
			}
			for _, class := range []string{"p50", "p95"} {
				if ls := find(svg, func(n *html.Node) bool { return n.Data == "line" && attr(n, "class") == class }); len(ls) != 1 {
					t.Errorf("svg has %d %s lines, want 1", len(ls), class)
				}
			}
		})
	}
}
