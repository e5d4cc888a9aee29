package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/launcher/poc"
	"github.com/slurm-microvm/slurm-microvm/launcher/poc/report"
)

// pocCommand is the proof a site runs before trusting the product:
//
//	slurm-microvm poc --users A,B --image IMG [--partition P] [--gres gpu:N] [--report DIR]
//
// It runs real jobs through the configured Slurm as two test accounts,
// prints one line per check and `N passed, N failed, N skipped`, writes
// DIR/report.json and DIR/report.html, and exits 1 when a check failed.
func pocCommand() *cli.Command {
	return &cli.Command{
		Name:      "poc",
		Usage:     "prove isolation, fault handling and load on this node's Slurm, as two test accounts (run as root on a node)",
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "users", Usage: "two unprivileged test accounts, A,B (required)"},
			&cli.StringFlag{Name: "image", Usage: "image every job boots: a POSIX shell with cat, dd, sleep, nproc, grep, sha256sum (required)"},
			&cli.StringFlag{Name: "partition", Usage: "partition to submit to (default: Slurm's default)"},
			&cli.StringFlag{Name: "reservation", Usage: "reservation to submit to (recommended on a production partition: an otherwise idle node)"},
			&cli.StringFlag{Name: "node", Usage: "node the jobs are pinned to; the poc must run on it (default: this host's short name)"},
			&cli.StringFlag{Name: "gres", Usage: "all GPUs of the node as a request, gpu:N or gpu:TYPE:N (default: the node's Gres)"},
			&cli.StringFlag{Name: "report", Value: "slurm-microvm-poc", Usage: "directory for report.json and report.html"},
			&cli.StringFlag{Name: "checks", Usage: "run only the checks whose id starts with one of these, comma separated (e.g. isolation,fault.vmm)"},
			&cli.IntFlag{Name: "array-tasks", Value: 100, Usage: "tasks of the job-array load check"},
			&cli.IntFlag{Name: "back-to-back", Value: 20, Usage: "steps of the back-to-back load check"},
			&cli.StringFlag{Name: "tmp-ignore", Usage: "names in /tmp and /var/tmp that other programs on the node make, not counted as left behind: glob patterns, colon separated"},
			&cli.BoolFlag{Name: "keep", Usage: "keep the poc's files (job outputs) under the accounts' homes, for inspection"},
			&cli.BoolFlag{Name: "list", Usage: "list the check ids and exit"},
		},
		Action: func(c *cli.Context) error {
			if c.Bool("list") {
				for _, id := range poc.CheckIDs() {
					fmt.Println(id)
				}
				return nil
			}
			if c.Args().Present() {
				return cli.Exit(fmt.Sprintf("poc: unexpected argument %q: every input is a flag (see --help)", c.Args().First()), 2)
			}
			cfg, err := loadConfig(c, true)
			if err != nil {
				return err
			}
			if err := report.CheckDir(c.String("report")); err != nil {
				return cli.Exit("--report: "+err.Error(), 2)
			}
			users := strings.Split(c.String("users"), ",")
			if len(users) != 2 {
				return cli.Exit(fmt.Sprintf("--users %q: want two accounts, A,B", c.String("users")), 2)
			}
			for _, f := range []string{"array-tasks", "back-to-back"} {
				if c.Int(f) < 1 || c.Int(f) > 10000 {
					return cli.Exit(fmt.Sprintf("--%s %d: want 1 to 10000", f, c.Int(f)), 2)
				}
			}
			var only []string
			if s := c.String("checks"); s != "" {
				only = strings.Split(s, ",")
			}
			self, err := os.Executable()
			if err != nil {
				return cli.Exit(fmt.Sprintf("poc: find this binary: %v", err), 2)
			}
			ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
			defer stop()
			env := []string{"PATH=" + os.Getenv("PATH"), "LANG=C.UTF-8"}
			for _, k := range []string{"SLURM_CONF", "SLURM_MICROVM_CONFIG"} {
				if v, ok := os.LookupEnv(k); ok {
					env = append(env, k+"="+v)
				}
			}
			rep, err := poc.Run(ctx, poc.Options{
				Config: cfg, Launcher: self, Users: [2]string{users[0], users[1]}, Image: c.String("image"),
				Node: c.String("node"), Partition: c.String("partition"), Reservation: c.String("reservation"),
				GRES: c.String("gres"), ArrayTasks: c.Int("array-tasks"), BackToBack: c.Int("back-to-back"),
				Only: only, Keep: c.Bool("keep"), Env: env, TmpIgnore: filepath.SplitList(c.String("tmp-ignore")), Version: version, Out: os.Stdout,
				Log: newLogger(os.Stderr, c.Bool("debug")),
			})
			if err != nil {
				return cli.Exit(err.Error(), 2)
			}
			fmt.Println()
			report.Print(os.Stdout, rep)
			jsonPath, htmlPath, werr := report.Write(c.String("report"), rep)
			if werr != nil {
				fmt.Fprintf(os.Stderr, "slurm-microvm poc: write the report: %v\n", werr)
			} else {
				fmt.Printf("report: %s, %s\n", jsonPath, htmlPath)
			}
			if ctx.Err() != nil {
				return cli.Exit("slurm-microvm poc: interrupted; its jobs are cancelled and its files removed", 130)
			}
			if _, failed, _ := rep.Counts(); failed > 0 || werr != nil {
				return cli.Exit("", 1)
			}
			return nil
		},
	}
}

// pocProbeCommand is what the poc runs as the other tenant: `poc-probe
// connect SOCKET` exits 0 when it could connect to SOCKET and a byte
// exchange was not refused at once, 1 otherwise. Hidden: not for users.
func pocProbeCommand() *cli.Command {
	return &cli.Command{
		Name:   "poc-probe",
		Hidden: true,
		Action: func(c *cli.Context) error {
			if c.Args().Get(0) != "connect" || c.Args().Len() != 2 {
				return cli.Exit("poc-probe connect SOCKET", 2)
			}
			conn, err := net.DialTimeout("unix", c.Args().Get(1), 5*time.Second)
			if err != nil {
				return cli.Exit("refused: "+err.Error(), 1)
			}
			defer conn.Close()
			// The supervisor closes a connection of another uid at once.
			_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
			var b [1]byte
			if _, err := conn.Read(b[:]); err != nil && !isTimeout(err) {
				return cli.Exit("closed by the peer: "+err.Error(), 1)
			}
			return nil
		},
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
