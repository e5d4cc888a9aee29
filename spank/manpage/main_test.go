package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestPageListsEveryOption: every option args.c registers (each
// spank_option name in its table, counted independently of Parse by a
// plain scan) is on the rendered page with its value forms and text.
func TestPageListsEveryOption(t *testing.T) {
	src, err := os.ReadFile("../args.c")
	if err != nil {
		t.Fatal(err)
	}
	opts, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`(?m)^\s*\{ "(microvm[a-z-]*)",`).FindAllStringSubmatch(string(src), -1)
	if len(names) < 6 || len(names) != len(opts) {
		t.Fatalf("args.c registers %d options, Parse found %d", len(names), len(opts))
	}
	page := string(Render(opts))
	for i, n := range names {
		o := opts[i]
		if o.Name != n[1] {
			t.Errorf("option %d: Parse read %q, args.c has %q", i, o.Name, n[1])
		}
		if !strings.Contains(page, `\fB\-\-`+roff(n[1])+`\fR`) {
			t.Errorf("page lacks --%s", n[1])
		}
		if o.Usage == "" || !strings.Contains(page, roff(o.Usage)) {
			t.Errorf("page lacks the usage of --%s (%q)", n[1], o.Usage)
		}
		if o.HasArg != 0 && (o.ArgInfo == "" || !strings.Contains(page, roff(o.ArgInfo))) {
			t.Errorf("page lacks the value forms of --%s (%q)", n[1], o.ArgInfo)
		}
	}
}

// TestParseRefusesUnknownTable: an entry the parser cannot read, or an
// enum value without an entry, fails instead of leaving an option out.
func TestParseRefusesUnknownTable(t *testing.T) {
	src, err := os.ReadFile("../args.c")
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(string) string{
		"unreadable entry": func(s string) string {
			return strings.Replace(s, `1, MV_OPT_MOUNTS, mv_option_cb }`, `1, MV_OPT_MOUNTS, mv_option_cb, 0 }`, 1)
		},
		"enum value without entry": func(s string) string {
			return strings.Replace(s, "MV_OPT_NETWORK,\n};", "MV_OPT_NETWORK,\n\tMV_OPT_NEW,\n};", 1)
		},
	} {
		t.Run(name, func(t *testing.T) {
			edited := edit(string(src))
			if edited == string(src) {
				t.Fatal("edit did not apply: update the test to args.c")
			}
			if _, err := Parse([]byte(edited)); err == nil {
				t.Fatal("Parse accepted it")
			}
		})
	}
}
