package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// readmeCommands returns every slurm-microvm command line README.md shows:
// the lines of code blocks that start with it, and the inline code spans
// (also those inside code blocks, as in "How it works") that do.
func readmeCommands(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var out []string
	add := func(s string) {
		s = strings.TrimSpace(s)
		if i := strings.Index(s, " #"); i >= 0 {
			s = strings.TrimSpace(s[:i])
		}
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	inBlock := false
	for _, line := range strings.Split(string(b), "\n") {
		trim := strings.TrimSpace(line)
		if strings.HasPrefix(trim, "```") {
			inBlock = !inBlock
			continue
		}
		if inBlock && strings.HasPrefix(trim, "slurm-microvm ") {
			add(trim)
		}
	}
	// Inline spans may wrap across lines: join the text first.
	text := strings.Join(strings.Fields(string(b)), " ")
	for _, m := range regexp.MustCompile("`(slurm-microvm [^`]+)`").FindAllStringSubmatch(text, -1) {
		add(m[1])
	}
	return out
}

// placeholder is an upper-case word the README uses for a value (SPEC,
// IMG, U, DIGEST|REF).
var placeholder = regexp.MustCompile(`^[A-Z][A-Z|.]*$`)

// helpArgs turns a README command line into argv ending in --help, which
// the command parses with every flag before it. What follows the first
// positional argument or "--" is dropped: those are no flags, and with
// them urfave/cli would read --help as an argument or a help topic. Optional
// parts ([--all]) are kept, alternatives (a|b) give their first, and a
// placeholder given to a numeric flag becomes 1.
func helpArgs(app *cli.App, line string) []string {
	line = strings.NewReplacer("[", "", "]", "").Replace(line)
	var toks []string
	for _, f := range strings.Fields(line)[1:] {
		if strings.Contains(f, "|") && !strings.HasPrefix(f, "-") {
			f, _, _ = strings.Cut(f, "|")
		}
		toks = append(toks, f)
	}
	flags := app.Flags
	cmds := app.Commands
	args := []string{"slurm-microvm"}
toks:
	for i := 0; i < len(toks); i++ {
		tok := toks[i]
		if tok == "--" || (!strings.HasPrefix(tok, "-") && findCommand(cmds, tok) == nil) {
			break toks
		}
		if c := findCommand(cmds, tok); c != nil && !strings.HasPrefix(tok, "-") {
			args = append(args, tok)
			flags, cmds = c.Flags, c.Subcommands
			continue
		}
		args = append(args, tok)
		name := strings.TrimLeft(tok, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := findFlag(flags, name)
		if f == nil || isBool(f) || i+1 >= len(toks) {
			continue
		}
		i++
		v := toks[i]
		if placeholder.MatchString(v) && isNumeric(f) {
			v = "1"
		}
		args = append(args, v)
	}
	return append(args, "--help")
}

func findCommand(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

func findFlag(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

func isBool(f cli.Flag) bool {
	_, ok := f.(*cli.BoolFlag)
	return ok
}

func isNumeric(f cli.Flag) bool {
	switch f.(type) {
	case *cli.UintFlag, *cli.Uint64Flag, *cli.IntFlag, *cli.Int64Flag, *cli.Float64Flag:
		return true
	}
	return false
}

// TestREADMECommandsParse runs every slurm-microvm command line of
// README.md with --help: the binary must know each command and flag the
// README documents.
func TestREADMECommandsParse(t *testing.T) {
	lines := readmeCommands(t)
	if len(lines) < 8 {
		t.Fatalf("found only %d slurm-microvm command lines in README.md: %q", len(lines), lines)
	}
	for _, line := range lines {
		t.Run(line, func(t *testing.T) {
			app := newApp()
			var out bytes.Buffer
			app.Writer, app.ErrWriter = &out, &out
			argv := helpArgs(app, line)
			if err := app.Run(argv); err != nil {
				t.Fatalf("README shows %q; %q fails: %v\n%s", line, strings.Join(argv, " "), err, out.String())
			}
			if !strings.Contains(out.String(), "USAGE:") {
				t.Fatalf("%q printed no help:\n%s", strings.Join(argv, " "), out.String())
			}
			t.Logf("%s", strings.Join(argv, " "))
		})
	}
}
