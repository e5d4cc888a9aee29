// Command testsummary runs `go test -json ...`, prints what plain `go test`
// prints (each package's closing ok/FAIL line, the output of failed
// tests, build errors) and after each package one line that says how many
// tests ran, passed, failed and skipped, followed by each skipped test and
// its reason. It exits with go test's status, or 1 when a test failed
// although go test exited 0.
//
//	go run ./hack/testsummary [-v] -- go test -json -count=1 ./...
//
// -v prints every test's output, as `go test -v` does.
//
// Design decision: a small program over test2json's events rather than
// grepping `go test -v` text: the events attribute each line to its test
// (parallel subtests interleave in the text), and the closing lines are
// passed through unchanged, so CI still recognizes them.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string
}

// pkgState collects one package's tests until its closing event.
type pkgState struct {
	output         map[string][]string // test name -> its output lines
	passed, failed int
	skipped        []string // "name: reason"
}

type summarizer struct {
	w       io.Writer
	verbose bool
	pkgs    map[string]*pkgState
	failed  bool
}

func (s *summarizer) pkg(name string) *pkgState {
	p := s.pkgs[name]
	if p == nil {
		p = &pkgState{output: map[string][]string{}}
		s.pkgs[name] = p
	}
	return p
}

// skipReason is the message t.Skip logged: the last "file.go:N: ..." line
// of the test's output.
func skipReason(lines []string) string {
	reason := ""
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if i := strings.Index(t, ".go:"); i > 0 && !strings.HasPrefix(t, "---") && !strings.HasPrefix(t, "===") {
			if _, rest, ok := strings.Cut(t[i+4:], ": "); ok {
				reason = rest
			}
		}
	}
	if reason == "" {
		return "no reason given"
	}
	return reason
}

func (s *summarizer) handle(ev event) {
	switch ev.Action {
	case "build-output":
		fmt.Fprint(s.w, ev.Output)
		return
	case "build-fail":
		s.failed = true
		return
	}
	if ev.Package == "" {
		return
	}
	p := s.pkg(ev.Package)
	if ev.Test == "" {
		switch ev.Action {
		case "output":
			// The package's own lines: "ok  pkg 1.2s", "FAIL pkg",
			// "PASS", panics outside a test. Kept as they are.
			if s.verbose || !isNoise(ev.Output) {
				fmt.Fprint(s.w, ev.Output)
			}
		case "pass", "fail", "skip":
			if ev.Action == "fail" {
				s.failed = true
			}
			s.summary(ev.Package, p)
			delete(s.pkgs, ev.Package)
		}
		return
	}
	switch ev.Action {
	case "output":
		if s.verbose {
			fmt.Fprint(s.w, ev.Output)
		}
		p.output[ev.Test] = append(p.output[ev.Test], ev.Output)
	case "pass":
		p.passed++
		delete(p.output, ev.Test)
	case "skip":
		p.skipped = append(p.skipped, ev.Test+": "+skipReason(p.output[ev.Test]))
		delete(p.output, ev.Test)
	case "fail":
		p.failed++
		s.failed = true
		if !s.verbose {
			fmt.Fprint(s.w, strings.Join(p.output[ev.Test], ""))
		}
		delete(p.output, ev.Test)
	}
}

// isNoise is a package-level line that plain `go test` does not print
// either (test2json sees the -v stream).
func isNoise(line string) bool {
	t := strings.TrimSpace(line)
	return t == "PASS" || strings.HasPrefix(t, "=== ") || t == "testing: warning: no tests to run"
}

func (s *summarizer) summary(name string, p *pkgState) {
	ran := p.passed + p.failed
	if ran == 0 && len(p.skipped) == 0 {
		return
	}
	fmt.Fprintf(s.w, "summary %s: %d ran (%d passed, %d failed), %d skipped\n", name, ran, p.passed, p.failed, len(p.skipped))
	sort.Strings(p.skipped)
	for _, sk := range p.skipped {
		fmt.Fprintf(s.w, "    skipped %s\n", sk)
	}
}

// run reads events from r until EOF. Lines that are not JSON (go test's
// own errors before any package ran) are printed as they are.
func (s *summarizer) run(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Action == "" {
			fmt.Fprintln(s.w, sc.Text())
			continue
		}
		s.handle(ev)
	}
	for name, p := range s.pkgs { // a package cut short (timeout, crash)
		s.failed = true
		for _, lines := range p.output {
			fmt.Fprint(s.w, strings.Join(lines, ""))
		}
		s.summary(name, p)
	}
	return sc.Err()
}

func main() {
	verbose := flag.Bool("v", false, "print every test's output")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: testsummary [-v] -- go test -json [flags] [packages]")
	}
	flag.Parse()
	args := flag.Args()
	if len(args) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "testsummary: start %s: %v\n", args[0], err)
		os.Exit(2)
	}
	s := &summarizer{w: os.Stdout, verbose: *verbose, pkgs: map[string]*pkgState{}}
	readErr := s.run(out)
	err = cmd.Wait()
	if readErr != nil {
		fmt.Fprintln(os.Stderr, "testsummary: reading go test's output:", readErr)
		os.Exit(2)
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		os.Exit(exit.ExitCode())
	case err != nil:
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	case s.failed:
		os.Exit(1)
	}
}
