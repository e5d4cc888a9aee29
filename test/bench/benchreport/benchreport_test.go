package benchreport

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReportTargets(t *testing.T) {
	cases := []struct {
		target string
		value  float64
		met    *bool
	}{
		{"<= 1.15", 1.15, ptr(true)},
		{"<= 1.15", 1.16, ptr(false)},
		{"< 10", 9.9, ptr(true)},
		{">= 0.5", 0.4, ptr(false)},
		{"> 0.5", 0.6, ptr(true)},
		{"", 3, nil},
	}
	for _, c := range cases {
		r := &Report{}
		r.Add(Figure{Section: "launch", Name: "x", Value: c.value, Unit: "ratio", Target: c.target})
		got := r.Figures[0].Met
		if (got == nil) != (c.met == nil) || (got != nil && *got != *c.met) {
			t.Errorf("target %q value %g: met %v, want %v", c.target, c.value, deref(got), deref(c.met))
		}
	}
}

func TestReportWrite(t *testing.T) {
	r := &Report{Accel: "tcg", Rounds: 5}
	r.Add(Figure{Section: "exec", Name: "exec round trip p50", Value: 7.5, Unit: "ms", Target: "<= 10", Command: "x"})
	p := filepath.Join(t.TempDir(), "bench.json")
	if err := r.Write(p); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Figures) != 1 || back.Figures[0].Value != 7.5 || back.Figures[0].Met == nil || !*back.Figures[0].Met {
		t.Fatalf("round trip: %+v", back.Figures)
	}
	if !strings.Contains(r.Text(), "target <= 10 (met)") {
		t.Fatalf("text:\n%s", r.Text())
	}
}

func ptr(b bool) *bool { return &b }

func deref(b *bool) string {
	if b == nil {
		return "nil"
	}
	if *b {
		return "true"
	}
	return "false"
}
