package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// leaf is a command that runs an action, with the names that lead to it.
type leaf struct {
	path []string
	cmd  *cli.Command
}

func leaves(prefix []string, cmds []*cli.Command) []leaf {
	var out []leaf
	for _, c := range cmds {
		p := append(append([]string{}, prefix...), c.Name)
		if c.Action != nil && !c.SkipFlagParsing {
			out = append(out, leaf{p, c})
		}
		out = append(out, leaves(p, c.Subcommands)...)
	}
	return out
}

// requiredArgs gives a value to each required flag of cmd but skip.
func requiredArgs(cmd *cli.Command, skip string) []string {
	var args []string
	for _, f := range cmd.Flags {
		if rf, ok := f.(cli.RequiredFlag); ok && rf.IsRequired() && f.Names()[0] != skip {
			args = append(args, "--"+f.Names()[0], "1")
		}
	}
	return args
}

// pathLike are flag names that name host paths.
var pathLike = regexp.MustCompile(`^(config|agent|cwd|state)$|-(root|conf|dir|file|path)$|^cache-`)

// TestPathFlagsAreAbsolute runs every command with each of its path flags
// (and the global --config) relative: the action sees it absolute against
// the working directory, or the command is refused naming the flag (--cwd).
// Every flag named like a path must be a path flag.
func TestPathFlagsAreAbsolute(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	probe := func(cmdPath []string, global bool, name string) {
		t.Run(strings.Join(cmdPath, " ")+" --"+name, func(t *testing.T) {
			app := newApp()
			var got string
			var target *cli.Command
			for _, l := range leaves(nil, app.Commands) {
				if strings.Join(l.path, " ") == strings.Join(cmdPath, " ") {
					target = l.cmd
				}
			}
			target.Action = func(c *cli.Context) error { got = c.String(name); return nil }
			args := []string{"slurm-microvm"}
			if global {
				args = append(append(args, "--"+name, "rel/x"), cmdPath...)
				args = append(args, requiredArgs(target, "")...)
			} else {
				args = append(append(args, cmdPath...), "--"+name, "rel/x")
				args = append(args, requiredArgs(target, name)...)
			}
			err := app.Run(args)
			if absOnlyFlags[name] {
				if ec, ok := err.(cli.ExitCoder); !ok || ec.ExitCode() != 2 || !strings.Contains(err.Error(), "--"+name) {
					t.Fatalf("%v: err %v, want exit 2 naming --%s", args, err, name)
				}
				return
			}
			if err != nil || got != filepath.Join(wd, "rel/x") {
				t.Fatalf("%v: the action saw --%s %q (err %v), want %q", args, name, got, err, filepath.Join(wd, "rel/x"))
			}
		})
	}
	app := newApp()
	for _, f := range app.Flags {
		if _, ok := f.(*cli.PathFlag); ok {
			probe([]string{"config", "check"}, true, f.Names()[0])
			seen = append(seen, f.Names()[0])
		}
	}
	for _, l := range leaves(nil, app.Commands) {
		for _, f := range l.cmd.Flags {
			name := f.Names()[0]
			if _, ok := f.(*cli.PathFlag); ok {
				probe(l.path, false, name)
				seen = append(seen, strings.Join(l.path, " ")+" --"+name)
			} else if pathLike.MatchString(name) {
				t.Errorf("%s --%s names a path but is a %T, not a *cli.PathFlag: it would stay relative", strings.Join(l.path, " "), name, f)
			}
		}
	}
	if len(seen) < 10 {
		t.Errorf("only %d path flags found: %v", len(seen), seen)
	}
	t.Logf("path flags: %v", seen)
}

// TestImagePrepareRelativeCacheRoot: a relative --cache-root (resolved in
// another directory by the user-side helper) failed with "confine: bind
// rel/0/tmp-...: no such file or directory" and left its lock file.
func TestImagePrepareRelativeCacheRoot(t *testing.T) {
	prereq.Root(t, "image prepare reads the image as the job's user")
	fixture.Require(t, "mkfs.erofs", "busybox")
	dir := t.TempDir()
	bin := filepath.Join(dir, "slurm-microvm")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	fixture.BusyboxRootfs(t, filepath.Join(dir, "img"), "Relative Cache")
	cmd := exec.Command(bin, "--config", "none.toml", "image", "prepare", "--cache-root", "rel", "./img")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), filepath.Join(dir, "rel", "0")+"/") {
		t.Fatalf("image prepare --cache-root rel: %v\n%s", err, out)
	}
	disks, _ := filepath.Glob(filepath.Join(dir, "rel", "0", "*.erofs"))
	if len(disks) != 1 {
		t.Fatalf("disks in rel/0: %v\n%s", disks, out)
	}
}
