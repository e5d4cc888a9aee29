package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"
)

// manCommand writes the manual pages of the command line into a directory:
// slurm-microvm.1 (every command) and slurm-microvm-<command>.1 for each
// visible command, all rendered by urfave/cli's ToManWithSection from the
// same App that --help prints, so a page cannot drift from --help. `make
// man` runs it (bin/man); the Debian package ships the result. Hidden: a
// build tool, not an admin command.
//
// Design decision: generated at build time, never committed (a committed
// page goes stale with the next flag); the alternative, hand-written
// troff, is what drifted from --help before.
func manCommand() *cli.Command {
	return &cli.Command{
		Name:   "man",
		Usage:  "write the manual pages (section 1) into --dir",
		Hidden: true,
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "dir", Required: true, Usage: "directory the pages go to (created)"},
		},
		Action: func(c *cli.Context) error {
			return writeManPages(c.App, c.Path("dir"))
		},
	}
}

// writeManPages renders app's pages into dir: <app>.1 and <app>-<cmd>.1
// for every visible top-level command. Errors: dir cannot be created or
// written, or a page does not render.
func writeManPages(app *cli.App, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("man pages: %w", err)
	}
	top := *app
	if top.Description == "" {
		top.Description = "Each command has its own page, " + app.Name + "-COMMAND(1); the options the SPANK plugin adds to srun, sbatch and salloc (--microvm and --microvm-*) are in spank-microvm(8)."
	}
	pages := map[string]*cli.App{app.Name: &top}
	for _, cmd := range app.VisibleCommands() {
		if cmd.Name == "help" {
			continue // cli's own, added by Run: nothing a page would add to --help
		}
		sub := &cli.App{
			Name:        app.Name + "-" + cmd.Name,
			Usage:       cmd.Usage,
			UsageText:   app.Name + " [global options] " + cmd.Name + " [options]" + argsOf(cmd),
			Description: cmd.Description,
			Flags:       cmd.Flags,
			Commands:    cmd.Subcommands,
			Authors:     app.Authors,
		}
		if sub.Description == "" {
			sub.Description = fmt.Sprintf("%s %s: %s. The global options of %s(1) (--config, --debug) apply too.", app.Name, cmd.Name, cmd.Usage, app.Name)
		}
		pages[sub.Name] = sub
	}
	for name, a := range pages {
		page, err := a.ToManWithSection(1)
		if err != nil {
			return fmt.Errorf("man page %s(1): %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".1"), []byte(page), 0o644); err != nil {
			return fmt.Errorf("man page %s(1): %w", name, err)
		}
	}
	return nil
}

func argsOf(cmd *cli.Command) string {
	if cmd.ArgsUsage != "" {
		return " " + cmd.ArgsUsage
	}
	if len(cmd.Subcommands) > 0 {
		return " command [options]"
	}
	return ""
}
