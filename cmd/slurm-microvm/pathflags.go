package main

import (
	"fmt"
	"path/filepath"

	"github.com/urfave/cli/v2"
)

// absOnlyFlags are path flags that name a directory of another process
// (--cwd: where srun ran, given by the plugin): a relative value cannot
// be resolved here and is refused.
var absOnlyFlags = map[string]bool{"cwd": true}

// withPathFlags makes every host path flag (a *cli.PathFlag) of app and
// its commands absolute before the command runs, against the working
// directory, so that no code below sees a relative path (the image cache,
// for one, hands its paths to a helper in another directory). A value
// that cannot be resolved, or a relative one of absOnlyFlags, is refused
// with exit status 2, naming the flag. Every path flag of the command line
// is declared as a cli.PathFlag; TestPathFlagsAreAbsolute checks each.
func withPathFlags(app *cli.App) *cli.App {
	app.Before = chainBefore(func(c *cli.Context) error { return absPathFlags(c, app.Flags) }, app.Before)
	var walk func([]*cli.Command)
	walk = func(cmds []*cli.Command) {
		for _, cmd := range cmds {
			flags := cmd.Flags
			cmd.Before = chainBefore(func(c *cli.Context) error { return absPathFlags(c, flags) }, cmd.Before)
			walk(cmd.Subcommands)
		}
	}
	walk(app.Commands)
	return app
}

func chainBefore(first, then cli.BeforeFunc) cli.BeforeFunc {
	if then == nil {
		return first
	}
	return func(c *cli.Context) error {
		if err := first(c); err != nil {
			return err
		}
		return then(c)
	}
}

// absPathFlags resolves the path flags among flags in c (see withPathFlags).
func absPathFlags(c *cli.Context, flags []cli.Flag) error {
	for _, f := range flags {
		pf, ok := f.(*cli.PathFlag)
		if !ok {
			continue
		}
		v := c.String(pf.Name)
		if v == "" || filepath.IsAbs(v) {
			continue
		}
		if absOnlyFlags[pf.Name] {
			return cli.Exit(fmt.Sprintf("--%s %q: must be an absolute path", pf.Name, v), 2)
		}
		abs, err := filepath.Abs(v)
		if err != nil {
			return cli.Exit(fmt.Sprintf("--%s %q: cannot make it absolute (%v): give an absolute path", pf.Name, v, err), 2)
		}
		if err := c.Set(pf.Name, abs); err != nil {
			return cli.Exit(fmt.Sprintf("--%s %q: %v", pf.Name, v, err), 2)
		}
	}
	return nil
}
