package main

import (
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/bench/benchreport"
)

func TestSplice(t *testing.T) {
	doc := "# x\n\n" + BeginMarker + "\nold figures\n" + EndMarker + "\n\nafter\n"
	out, err := Splice([]byte(doc), "new table")
	if err != nil {
		t.Fatal(err)
	}
	want := "# x\n\n" + BeginMarker + "\nnew table\n" + EndMarker + "\n\nafter\n"
	if string(out) != want {
		t.Fatalf("got %q\nwant %q", out, want)
	}
	for _, bad := range []string{"no markers", BeginMarker + BeginMarker + EndMarker, EndMarker + " " + BeginMarker} {
		if _, err := Splice([]byte(bad), "x"); err == nil {
			t.Errorf("%q spliced", bad)
		}
	}
}

func TestRender(t *testing.T) {
	yes, no := true, false
	r := &benchreport.Report{Accel: "tcg", Rounds: 5, Figures: []benchreport.Figure{
		{Section: "exec", Name: "exec p50", Value: 7.25, Unit: "ms", Target: "<= 10", Met: &yes, Command: "a|b"},
		{Section: "launch", Name: "srun / bare", Value: 1.51, Unit: "ratio", Target: "<= 1.15", Met: &no, Command: "c"},
		{Section: "launch", Name: "  kernel", Value: 2012, Unit: "ms", Command: "d"},
	}}
	got := Render(r)
	for _, want := range []string{"**Step launch**", "| srun / bare | 1.51 ratio | <= 1.15 (**not met**) | c |", "| &nbsp;&nbsp;&nbsp;&nbsp;kernel | 2012 ms |", "| exec p50 | 7.25 ms | <= 10 (met) | a\\|b |"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	if strings.Index(got, "Step launch") > strings.Index(got, "Exec round trip") {
		t.Error("sections out of order")
	}
}
