package report

import (
	"fmt"
	"math"
	"slices"
	"strconv"
)

// The picture's geometry (SVG user units, about CSS px at 100 %).
const (
	svgWidth   = 720
	svgHeight  = 320
	plotLeft   = 64
	plotRight  = svgWidth - 24
	plotTop    = 28
	plotBottom = svgHeight - 52
	// minBins and maxBins bound the number of bins (sqrt(N) between
	// them); fewer when the samples span fewer ms than minBins.
	minBins = 10
	maxBins = 20
	// maxXTicks bounds the labelled bin edges on the x axis, so that
	// labels like "12345" never overlap at svgWidth.
	maxXTicks = 7
	// maxYTicks bounds the labelled counts on the y axis.
	maxYTicks = 5
)

// histogram is the start-time picture, laid out for the template: every
// coordinate is computed here, the template only prints them.
type histogram struct {
	Width, Height                         int
	PlotLeft, PlotRight, PlotTop, PlotBot float64
	Samples                               int
	BinMS                                 int64 // width of a bin (ms)
	Bars                                  []bar // non-empty bins only
	XTicks, YTicks                        []tick
	Markers                               []marker
}

// bar is one non-empty bin: Count samples in [LoMS, HiMS] (ms, both
// inclusive: samples are whole ms).
type bar struct {
	X, Y, W, H float64
	Count      int
	LoMS, HiMS int64
}

// Tooltip is the bar's <title>: "N steps in A-B ms".
func (b bar) Tooltip() string {
	steps := "steps"
	if b.Count == 1 {
		steps = "step"
	}
	return fmt.Sprintf("%d %s in %d-%d ms", b.Count, steps, b.LoMS, b.HiMS)
}

// tick is an axis label at Pos (x for the x axis, y for the y axis).
type tick struct {
	Pos   float64
	Label string
}

// marker is a vertical line at X for a percentile.
type marker struct {
	X      float64
	Class  string  // p50, p95
	Label  string  // "p50 420 ms"
	LabelY float64 // one row per marker above the plot: labels never overlap
	Anchor string  // text-anchor: "end" right of the middle, to stay inside
}

// binning splits the whole-ms samples' range [min, max] into n bins of
// width ms each, starting at lo: about sqrt(len(samples)) bins, clamped
// to [minBins, maxBins], of a whole number of ms (at least 1), so that
// n*width covers max-min+1 ms. samples must not be empty.
func binning(samples []int64) (lo, width int64, n int) {
	lo, hi := slices.Min(samples), slices.Max(samples)
	span := hi - lo + 1
	target := int64(math.Ceil(math.Sqrt(float64(len(samples)))))
	target = max(minBins, min(maxBins, target))
	width = max(1, (span+target-1)/target)
	return lo, width, int((span + width - 1) / width)
}

// newHistogram lays out the picture of l's start times with its p50 and
// p95 marked (l.P50MS, l.P95MS: what the report's tables say); nil when
// there are no samples.
func newHistogram(l *Load) *histogram {
	if l == nil || len(l.StartMS) == 0 {
		return nil
	}
	lo, width, n := binning(l.StartMS)
	counts := make([]int, n)
	for _, v := range l.StartMS {
		counts[(v-lo)/width]++
	}
	h := &histogram{
		Width: svgWidth, Height: svgHeight,
		PlotLeft: plotLeft, PlotRight: plotRight, PlotTop: plotTop, PlotBot: plotBottom,
		Samples: len(l.StartMS), BinMS: width,
	}
	// x: continuous ms; whole-ms sample v occupies [v, v+1).
	total := float64(int64(n) * width)
	xOf := func(ms float64) float64 {
		return plotLeft + (ms-float64(lo))/total*(plotRight-plotLeft)
	}
	// y: counts up to the top tick, a multiple of the tick step.
	maxCount := slices.Max(counts)
	step := max(1, (maxCount+maxYTicks-1)/maxYTicks)
	top := step * ((maxCount + step - 1) / step)
	yOf := func(count int) float64 {
		return plotBottom - float64(count)/float64(top)*(plotBottom-plotTop)
	}
	for i, c := range counts {
		if c == 0 {
			continue
		}
		binLo := lo + int64(i)*width
		x0, x1 := xOf(float64(binLo)), xOf(float64(binLo+width))
		// A 1-unit gap between neighbours, unless that would leave no bar.
		w := x1 - x0
		if w > 2 {
			w--
		}
		h.Bars = append(h.Bars, bar{
			X: x0, Y: yOf(c), W: w, H: plotBottom - yOf(c),
			Count: c, LoMS: binLo, HiMS: binLo + width - 1,
		})
	}
	// Every few bin edges, and always the last one (the axis' end), which
	// replaces a labelled edge too close to it.
	every := (n + maxXTicks - 1) / maxXTicks
	edges := []int{}
	for i := 0; i <= n; i += every {
		edges = append(edges, i)
	}
	if last := edges[len(edges)-1]; last != n {
		if last != 0 && n-last < every {
			edges = edges[:len(edges)-1]
		}
		edges = append(edges, n)
	}
	for _, i := range edges {
		edge := lo + int64(i)*width
		h.XTicks = append(h.XTicks, tick{Pos: xOf(float64(edge)), Label: strconv.FormatInt(edge, 10)})
	}
	for c := 0; c <= top; c += step {
		h.YTicks = append(h.YTicks, tick{Pos: yOf(c), Label: strconv.Itoa(c)})
	}
	for i, m := range []struct {
		class string
		ms    int64
	}{{"p50", l.P50MS}, {"p95", l.P95MS}} {
		// The middle of the sample's ms, clamped into the plot (a P50MS
		// that Summarize did not set may lie outside the samples).
		x := min(plotRight, max(plotLeft, xOf(float64(m.ms)+0.5)))
		anchor := "start"
		if x > (plotLeft+plotRight)/2 {
			anchor = "end"
		}
		h.Markers = append(h.Markers, marker{
			X: x, Class: m.class, Label: fmt.Sprintf("%s %d ms", m.class, m.ms),
			LabelY: plotTop - 16 + float64(i)*12, Anchor: anchor,
		})
	}
	return h
}
