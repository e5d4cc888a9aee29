package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/inventory"
	"github.com/slurm-microvm/slurm-microvm/launcher/metrics"
)

// printable is s for a table cell, quoted (Go syntax: \n, \x1b) when it
// holds a character that is not printable or a tab: values users chose (an
// image path, a reference) must not add rows or send terminal escapes to
// an admin's terminal. JSON output escapes them by itself.
func printable(s string) string {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// psCommand is `slurm-microvm ps [--json]`: every sandbox with state on
// this node (package launcher/inventory).
func psCommand() *cli.Command {
	return &cli.Command{
		Name:  "ps",
		Usage: "list the sandboxes on this node: job, step, user, image, vCPUs, memory, uptime, phase, VMM pid (root)",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print a JSON array (memory_mib, uptime_s, ...)"}},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c, true)
			if err != nil {
				return err
			}
			list, err := inventory.List(cfg.RuntimeDir, time.Now())
			if err != nil {
				return cli.Exit("ps: "+err.Error(), 1)
			}
			if c.Bool("json") {
				if list == nil {
					list = []inventory.Sandbox{}
				}
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "JOB.STEP\tRESTART\tNODE\tUSER\tIMAGE\tDIGEST\tVCPUS\tMEMORY\tUPTIME\tPHASE\tVMM PID")
			for _, s := range list {
				digest, vmm := "-", "-"
				if s.ImageDigest != "" {
					digest = fmt.Sprintf("%.19s", s.ImageDigest)
				}
				if s.VMMPid != 0 {
					vmm = fmt.Sprint(s.VMMPid)
				}
				node := s.Node
				if node == "" {
					node = "-"
				}
				fmt.Fprintf(tw, "%d.%d\t%d\t%s\t%s(%d)\t%s\t%s\t%d\t%dMiB\t%s\t%s\t%s\n", s.Job, s.Step, s.Restart, printable(node), printable(s.User), s.UID,
					printable(s.Image), printable(digest), s.VCPUs, s.MemoryMiB, time.Duration(s.UptimeS)*time.Second, s.Phase, vmm)
			}
			return tw.Flush()
		},
	}
}

// inspectCommand is `slurm-microvm inspect JOB.STEP[.RESTART] [--node N]`:
// one sandbox's full record as JSON.
func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:      "inspect",
		Usage:     "print one sandbox's full record as JSON (root)",
		ArgsUsage: "JOB.STEP[.RESTART]",
		Flags:     []cli.Flag{&cli.StringFlag{Name: "node", Usage: "the Slurm node name, where several slurmd share this host"}},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("inspect: name one step as JOB.STEP[.RESTART] (e.g. 1234.0; `slurm-microvm ps` lists them)", 2)
			}
			cfg, err := loadConfig(c, true)
			if err != nil {
				return err
			}
			d, err := inventory.Find(cfg.RuntimeDir, c.Args().First(), c.String("node"))
			if err != nil {
				return cli.Exit("inspect: "+err.Error(), 1)
			}
			r, err := inventory.Read(d, time.Now())
			if err != nil {
				return cli.Exit("inspect: "+err.Error(), 1)
			}
			enc := json.NewEncoder(c.App.Writer)
			enc.SetIndent("", "  ")
			return enc.Encode(r)
		},
	}
}

// metricsCommand is `slurm-microvm metrics`: the node's metrics in the
// Prometheus text format, the counters from [metrics] textfile's state
// and the gauges as they are now (package launcher/metrics).
func metricsCommand() *cli.Command {
	return &cli.Command{
		Name:  "metrics",
		Usage: "print this node's metrics in the Prometheus text format (root): starts, failures by stage, phase durations, running sandboxes, cache size",
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c, true)
			if err != nil {
				return err
			}
			if err := metrics.Write(c.App.Writer, launcher.MetricsOptions(cfg)); err != nil {
				return cli.Exit("metrics: "+err.Error(), 1)
			}
			return nil
		},
	}
}
