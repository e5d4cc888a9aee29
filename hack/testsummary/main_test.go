package main

import (
	"strings"
	"testing"
)

func TestSummary(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:9: needs root: mount(2)\n"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"--- SKIP: TestA (0.00s)\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:3: boom\n"}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"--- FAIL: TestB (0.00s)\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestB"}`,
		`{"Action":"output","Package":"p","Test":"TestC","Output":"quiet\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestC"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\n"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\tp\t0.1s\n"}`,
		`{"Action":"fail","Package":"p"}`,
		`not json`,
	}, "\n")
	var b strings.Builder
	s := &summarizer{w: &b, pkgs: map[string]*pkgState{}}
	if err := s.run(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{
		"b_test.go:3: boom\n--- FAIL: TestB",
		"FAIL\tp\t0.1s\n",
		"summary p: 2 ran (1 passed, 1 failed), 1 skipped\n",
		"    skipped TestA: needs root: mount(2)\n",
		"not json\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet") || strings.Contains(got, "=== RUN") {
		t.Errorf("a passing test's output was printed:\n%s", got)
	}
	if !s.failed {
		t.Error("a failed package did not make the run fail")
	}
}
