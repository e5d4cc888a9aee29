// Command slurm-microvm is the launcher: the SPANK plugin's hand-off
// target (prepare, start, exec, stop, gc), the standalone runner (run), and
// the admin and integrator tools (config check, image, version).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

// execName is the name of the exec entry (a link to this binary) that the
// SPANK plugin puts in a task's argv[0].
const execName = "slurm-microvm-exec"

func main() {
	if len(os.Args) > 1 && os.Args[1] == qemu.TrampolineArg {
		// The VMM's trampoline (the supervisor starts QEMU through it).
		err := qemu.Trampoline(os.Args[2:])
		fmt.Fprintln(os.Stderr, "slurm-microvm:", err)
		os.Exit(127)
	}
	if filepath.Base(os.Args[0]) == execName {
		os.Exit(execEntry(os.Args[1:]))
	}
	if err := newApp().Run(os.Args); err != nil {
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			if msg := ec.Error(); msg != "" {
				fmt.Fprintln(os.Stderr, "slurm-microvm:", msg)
			}
			os.Exit(ec.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "slurm-microvm:", err)
		os.Exit(1)
	}
}

// newApp is the command line: global flags and every command.
func newApp() *cli.App {
	return withPathFlags(&cli.App{
		Name:    "slurm-microvm",
		Usage:   "run Slurm job steps inside microVMs",
		Version: version,
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "config", Value: "/etc/slurm/microvm.toml", Usage: "node configuration file", EnvVars: []string{"SLURM_MICROVM_CONFIG"}},
			&cli.BoolFlag{Name: "debug", Usage: "log at debug level"},
		},
		Commands: []*cli.Command{
			validateCommand(),
			prepareCommand(),
			startCommand(),
			execCommand(),
			stopCommand(),
			gcCommand(),
			runCommand(),
			configCommand(),
			imageCommand(),
			assetsCommand(),
			mpiCommand(),
			gpusCommand(),
			nicsCommand(),
			mountsCommand(),
			psCommand(),
			inspectCommand(),
			metricsCommand(),
			pocCommand(),
			pocProbeCommand(),
			versionCommand(),
			manCommand(),
		},
		ExitErrHandler: func(c *cli.Context, err error) {},

		// `slurm-microvm <TAB>` in bash (the package's completion script,
		// etc/bash-completion/slurm-microvm, asks --generate-bash-completion).
		EnableBashCompletion: true,
	})
}

// versionCommand prints what --version prints (cli's VersionPrinter: the
// name and the version the Makefile's ldflags set), for the scripts and
// documents that call `slurm-microvm version`.
func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version (as --version does)",
		Action: func(c *cli.Context) error {
			cli.VersionPrinter(c)
			return nil
		},
	}
}

// execEntry runs a task from the argv the plugin left: the original argv[0]
// is in SLURM_MICROVM_ARGV0 and the rest of the arguments follow.
func execEntry(args []string) int {
	argv0 := os.Getenv(launcher.EnvArgv0)
	if argv0 == "" {
		fmt.Fprintln(os.Stderr, "slurm-microvm: "+execName+" runs only as a task started by the microvm SPANK plugin ("+launcher.EnvArgv0+" is not set)")
		return 125
	}
	return runTask(context.Background(), os.Getenv(launcher.EnvConfig), os.Getenv(launcher.EnvState), append([]string{argv0}, args...))
}

// exitStatus turns a task result into this process's end, as a shell would:
// 127 for a command missing from the image, 125 when the sandbox failed.
func reportTaskError(argv0 string, err error) int {
	if errors.Is(err, driver.ErrCommandNotFound) {
		fmt.Fprintf(os.Stderr, "slurm-microvm: %s: command not found in the image\n", argv0)
		return 127
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "slurm-microvm") {
		msg = "slurm-microvm: " + msg
	}
	fmt.Fprintln(os.Stderr, msg)
	return 125
}
