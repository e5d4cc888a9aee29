package report

import (
	"fmt"
	"testing"
)

// fmtSscanf reads a bar tooltip, "N steps in A-B ms" ("step" for one).
func fmtSscanf(s string, n, a, z *int) (int, error) {
	if k, err := fmt.Sscanf(s, "%d steps in %d-%d ms", n, a, z); err == nil {
		return k, nil
	}
	k, err := fmt.Sscanf(s, "%d step in %d-%d ms", n, a, z)
	if err == nil && *n != 1 {
		return k, fmt.Errorf("%q: %d is plural", s, *n)
	}
	return k, err
}

func seq(from, to int64) []int64 {
	var s []int64
	for v := from; v <= to; v++ {
		s = append(s, v)
	}
	return s
}

func TestBinning(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []int64
		lo, w   int64
		n       int
	}{
		{"one sample: one 1-ms bin", []int64{420}, 420, 1, 1},
		{"equal samples", []int64{7, 7, 7}, 7, 1, 1},
		{"span below minBins: 1-ms bins", []int64{100, 105}, 100, 1, 6},
		{"100 samples over 100 ms: 10 bins", seq(0, 99), 0, 10, 10},
		{"sqrt(N) bins: 225 samples, 15 bins", seq(1000, 1224), 1000, 15, 15},
		{"many samples: at most maxBins", seq(0, 999), 0, 50, 20},
		{"span not a multiple", append(seq(10, 19), 1010), 10, 101, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, w, n := binning(tc.samples)
			if lo != tc.lo || w != tc.w || n != tc.n {
				t.Errorf("binning = lo %d width %d bins %d, want %d %d %d", lo, w, n, tc.lo, tc.w, tc.n)
			}
			for _, v := range tc.samples {
				if i := (v - lo) / w; i < 0 || i >= int64(n) {
					t.Errorf("sample %d falls in bin %d of %d", v, i, n)
				}
			}
		})
	}
}

func TestHistogram(t *testing.T) {
	if h := newHistogram(nil); h != nil {
		t.Errorf("a nil load has a picture")
	}
	if h := newHistogram(&Load{}); h != nil {
		t.Errorf("a load without samples has a picture")
	}
	for _, tc := range []struct {
		name    string
		samples []int64
	}{
		{"one", []int64{420}},
		{"spread", sampleReport(120).Load.StartMS},
		{"gap in the middle", append(seq(100, 140), seq(900, 940)...)},
		{"wide", []int64{5, 60_000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &Load{StartMS: tc.samples}
			l.Summarize()
			h := newHistogram(l)
			if h == nil {
				t.Fatal("no picture")
			}
			total, tallest := 0, 0.0
			for _, b := range h.Bars {
				if b.Count == 0 {
					t.Errorf("an empty bin has a bar")
				}
				if b.W <= 0 || b.H <= 0 {
					t.Errorf("bar %s is %.1f x %.1f: invisible", b.Tooltip(), b.W, b.H)
				}
				if b.X < h.PlotLeft || b.X+b.W > h.PlotRight+0.01 || b.Y < h.PlotTop-0.01 || b.Y+b.H > h.PlotBot+0.01 {
					t.Errorf("bar %s at %.1f,%.1f %.1fx%.1f leaves the plot", b.Tooltip(), b.X, b.Y, b.W, b.H)
				}
				total += b.Count
				tallest = max(tallest, b.H)
			}
			if total != len(tc.samples) || len(h.Bars) != nonEmptyBins(tc.samples) {
				t.Errorf("%d bars count %d samples, want %d bars and %d", len(h.Bars), total, nonEmptyBins(tc.samples), len(tc.samples))
			}
			if tallest < (h.PlotBot-h.PlotTop)/2 {
				t.Errorf("the tallest bar is %.1f of %.1f: the y axis wastes the plot", tallest, h.PlotBot-h.PlotTop)
			}
			for i := 1; i < len(h.Bars); i++ {
				if h.Bars[i].X < h.Bars[i-1].X+h.Bars[i-1].W || h.Bars[i].LoMS <= h.Bars[i-1].HiMS {
					t.Errorf("bars %s and %s overlap", h.Bars[i-1].Tooltip(), h.Bars[i].Tooltip())
				}
			}
			if first, last := h.XTicks[0], h.XTicks[len(h.XTicks)-1]; first.Pos != h.PlotLeft || last.Pos < h.PlotRight-0.01 {
				t.Errorf("x ticks from %.1f to %.1f, want the whole axis %.1f-%.1f", first.Pos, last.Pos, h.PlotLeft, h.PlotRight)
			}
			if len(h.XTicks) > maxXTicks+1 || len(h.YTicks) > maxYTicks+1 {
				t.Errorf("%d x ticks, %d y ticks: too many labels", len(h.XTicks), len(h.YTicks))
			}
			// Each percentile line lies over the bar of its sample.
			for _, m := range h.Markers {
				ms := l.P50MS
				if m.Class == "p95" {
					ms = l.P95MS
				}
				found := false
				for _, b := range h.Bars {
					if b.LoMS <= ms && ms <= b.HiMS {
						found = m.X >= b.X && m.X <= b.X+b.W+1
					}
				}
				if !found {
					t.Errorf("%s line at x %.1f is not over the bar of %d ms", m.Class, m.X, ms)
				}
			}
		})
	}
}
