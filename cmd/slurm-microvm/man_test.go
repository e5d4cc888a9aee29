package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestManPagesMatchHelp: `slurm-microvm man` writes slurm-microvm(1) and
// one page per visible command, and each page names every visible flag of
// its command and every subcommand, as --help does.
func TestManPagesMatchHelp(t *testing.T) {
	dir := t.TempDir()
	app := newApp()
	if err := app.Run([]string{"slurm-microvm", "man", "--dir", dir}); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	top := read("slurm-microvm.1")
	if !strings.Contains(top, ".TH slurm-microvm 1") {
		t.Errorf("slurm-microvm.1 is not a section 1 page:\n%.200s", top)
	}
	n := 0
	for _, cmd := range app.VisibleCommands() {
		if cmd.Name == "help" {
			continue
		}
		n++
		page := read("slurm-microvm-" + cmd.Name + ".1")
		if !strings.Contains(top, cmd.Name) {
			t.Errorf("slurm-microvm.1 lacks command %s", cmd.Name)
		}
		checkFlags(t, cmd.Name, page, cmd.VisibleFlags())
		for _, sub := range cmd.VisibleCommands() {
			if !strings.Contains(page, ".SH "+sub.Name) {
				t.Errorf("slurm-microvm-%s.1 lacks subcommand %s", cmd.Name, sub.Name)
			}
			checkFlags(t, cmd.Name+" "+sub.Name, page, sub.VisibleFlags())
		}
	}
	if n < 10 {
		t.Errorf("%d command pages, want every admin command (at least 10)", n)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != n+1 {
		t.Errorf("%d pages written, want %d", len(entries), n+1)
	}
	if _, err := os.Stat(filepath.Join(dir, "slurm-microvm-man.1")); err == nil {
		t.Error("the hidden man command got a page")
	}
}

func checkFlags(t *testing.T, where, page string, flags []cli.Flag) {
	t.Helper()
	for _, f := range flags {
		name := f.Names()[0]
		if name == "help" {
			continue
		}
		if !strings.Contains(page, `\fB--`+name) && !strings.Contains(page, `\fB-`+name) {
			t.Errorf("%s: page lacks --%s", where, name)
		}
	}
}

// TestBashCompletion: the completion script's request
// (--generate-bash-completion) lists the commands and a command's
// subcommands.
func TestBashCompletion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"slurm-microvm", "--generate-bash-completion"}, []string{"config", "image", "assets", "version"}},
		{[]string{"slurm-microvm", "image", "--generate-bash-completion"}, []string{"prepare", "check", "rm"}},
	} {
		// cli's completion reads os.Args (DefaultCompleteWithFlags), not
		// Run's arguments: the test binary's flags would be taken for a
		// flag being completed.
		saved := os.Args
		os.Args = tc.args
		var out strings.Builder
		app := newApp()
		app.Writer = &out
		err := app.Run(tc.args)
		os.Args = saved
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Fields(out.String())
		for _, w := range tc.want {
			if !strings.Contains(" "+strings.Join(got, " ")+" ", " "+w+" ") {
				t.Errorf("%v: %q lacks %s", tc.args, got, w)
			}
		}
	}
}
