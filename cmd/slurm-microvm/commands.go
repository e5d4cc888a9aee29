package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/fs"
	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/image"
	"github.com/slurm-microvm/slurm-microvm/launcher/runtime"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

var stepFlags = []cli.Flag{
	&cli.UintFlag{Name: "job", Required: true, Usage: "Slurm job id"},
	&cli.UintFlag{Name: "step", Required: true, Usage: "Slurm step id"},
	&cli.UintFlag{Name: "restart", Usage: "job restart count"},
	nodeFlag,
}

// nodeFlag names the Slurm node (SLURMD_NODENAME) whose part of the step a
// command works on: under multiple-slurmd several nodes share one host.
var nodeFlag = &cli.StringFlag{Name: "node", Usage: "Slurm node name (SLURMD_NODENAME); empty: a host with one slurmd"}

func stepID(c *cli.Context) (state.StepID, error) {
	id := state.StepID{Job: uint32(c.Uint("job")), Step: uint32(c.Uint("step")), Restart: uint32(c.Uint("restart")), Node: c.String("node")}
	if id.Node != "" {
		if err := state.CheckNodeName(id.Node); err != nil {
			return id, cli.Exit("--node: "+err.Error(), 2)
		}
	}
	return id, nil
}

// loadConfig reads the node configuration; a missing file means defaults
// only when missingOK (user-side commands on login nodes).
func loadConfig(c *cli.Context, missingOK bool) (*config.Config, error) {
	cfg, err := config.Load(c.String("config"), missingOK)
	if err != nil {
		return nil, cli.Exit(err.Error(), 2)
	}
	return cfg, nil
}

func newLogger(w io.Writer, debug bool) *slog.Logger {
	lvl := slog.LevelInfo
	if debug {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
}

func validateCommand() *cli.Command {
	return &cli.Command{
		Name:  "validate",
		Usage: "check a step's --microvm options as the submitting user, before the job is queued",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "image", Required: true},
			&cli.BoolFlag{Name: "debug"},
			&cli.StringFlag{Name: "mounts"}, &cli.StringFlag{Name: "workdir"}, &cli.StringFlag{Name: "mpi"},
			&cli.StringFlag{Name: "network"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c, true)
			if err != nil {
				return err
			}
			if _, err := cfg.Network.NetworkMode(c.String("network")); err != nil {
				return cli.Exit(err.Error(), 2)
			}
			uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
			if m := c.String("mpi"); m != "" && !slices.Contains(launcher.MPIModes, m) {
				return cli.Exit(fmt.Sprintf("--microvm-mpi: %q must be one of %s", m, strings.Join(launcher.MPIModes, ", ")), 2)
			}
			if _, err := fs.ParseWorkdir(c.String("workdir")); err != nil {
				return cli.Exit(err.Error(), 2)
			}
			mounts, origin := c.String("mounts"), fs.OptionName
			if mounts == "" {
				mounts, origin = os.Getenv(fs.EnvVar), fs.EnvVar
			}
			// The whole policy, as the submitting user: sources that are
			// not allowed, missing or unreadable fail before queueing.
			var groups []uint32
			if gs, err := os.Getgroups(); err == nil {
				for _, g := range gs {
					groups = append(groups, uint32(g))
				}
			}
			// The user's mounts against the policy, as the submitting
			// user: not allowed, unreadable or refused fails before
			// queueing, and so does a clash with the step's scratch
			// destination. Site mount sources are the node's business,
			// and a source missing here may exist on the compute nodes.
			// Scratch stays planned: Resolve creates no scratch directory
			// without a step name.
			if u, err := fs.LookupUser(uid, gid, groups); err == nil {
				p := cfg.Mounts
				p.Site = nil
				t, err := p.Resolve(c.Context, fs.Request{User: u, Mounts: mounts, Origin: origin})
				if err != nil && !errors.Is(err, fs.ErrNotFound) {
					return cli.Exit(err.Error(), 2)
				}
				if t != nil {
					t.Close()
				}
				if err := checkShareCount(cfg, u, mounts, origin, c.String("mpi")); err != nil {
					return cli.Exit(err.Error(), 2)
				}
			} else if _, err := fs.Parse(origin, mounts); err != nil {
				return cli.Exit(err.Error(), 2)
			}
			err = image.Check(c.Context, c.String("image"), image.Options{UID: uid, GID: gid, CacheRoot: filepath.Join(cfg.CacheDir, "images")})
			if err != nil {
				return cli.Exit("--microvm: "+err.Error(), 2)
			}
			return nil
		},
	}
}

// checkShareCount counts the host shares a step would get (site mounts,
// scratch, the user's mounts, the host MPI share where the MPI mode may
// inject) against what a sandbox of the configured runtime without GPUs
// takes (driver.Capabilities.MaxShares; QEMU: qemu.MaxSharesMicrovm): a
// step over it would fail on the node.
func checkShareCount(cfg *config.Config, u fs.User, mounts, origin, mpiMode string) error {
	drv, err := runtime.New(cfg, runtime.Options{})
	if err != nil {
		return err
	}
	limit := 0
	if f := drv.Capabilities().MaxShares; f != nil {
		limit = f(0)
	}
	if limit == 0 {
		return nil
	}
	entries, err := cfg.Mounts.Plan(u, mounts, origin, "")
	if err != nil {
		return nil // Resolve reported what matters
	}
	count := map[fs.Origin]int{}
	for _, e := range entries {
		count[e.Origin]++
	}
	if mpiMode == "" {
		mpiMode = cfg.MPI.Default
	}
	n, mpi := len(entries), 0
	if mpiMode == "auto" || mpiMode == "host" {
		n, mpi = n+1, 1
	}
	if n <= limit {
		return nil
	}
	return fmt.Errorf("%s: the step would have %d host shares (%d of %s, %d site mounts, %d scratch, %d host MPI with --microvm-mpi=%s): a microVM takes at most %d (the %s runtime's device slots); mount a common parent instead of several directories under it",
		origin, n, count[fs.OriginUser], origin, count[fs.OriginSite], count[fs.OriginScratch], mpi, mpiMode, limit, drv.Name())
}

func prepareCommand() *cli.Command {
	return &cli.Command{
		Name:  "prepare",
		Usage: "record a step's sandbox (SPANK init_post_opt, root); nothing boots",
		Flags: append(append([]cli.Flag{}, stepFlags...),
			&cli.UintFlag{Name: "uid", Required: true}, &cli.UintFlag{Name: "gid", Required: true},
			&cli.StringFlag{Name: "groups", Usage: "supplementary gids, comma separated"},
			&cli.StringFlag{Name: "user", Usage: "user name of --uid"},
			&cli.StringFlag{Name: "image", Required: true},
			&cli.StringFlag{Name: "cores", Usage: "S_STEP_ALLOC_CORES"},
			&cli.Uint64Flag{Name: "mem-mb", Usage: "S_STEP_ALLOC_MEM (MiB, 0: no limit)"},
			&cli.StringFlag{Name: "mem-per-node", Usage: "the job's --mem (SLURM_MEM_PER_NODE), sizes the guest when --mem-mb is 0"},
			&cli.StringFlag{Name: "mem-per-cpu", Usage: "the job's --mem-per-cpu (SLURM_MEM_PER_CPU), sizes the guest when --mem-mb is 0"},
			&cli.StringFlag{Name: "gpus", Usage: "SLURM_STEP_GPUS"},
			&cli.IntFlag{Name: "tasks", Usage: "local task count"},
			&cli.StringFlag{Name: "hostname"},
			&cli.PathFlag{Name: "cwd", Usage: "directory a relative image path (./img) is relative to: where srun ran"},
			&cli.BoolFlag{Name: "debug"},
			&cli.StringFlag{Name: "mounts"}, &cli.StringFlag{Name: "workdir"}, &cli.StringFlag{Name: "mpi"},
			&cli.StringFlag{Name: "mounts-env", Usage: "SLURM_MICROVM_MOUNTS of the job, used when --mounts is not given"},
			&cli.StringFlag{Name: "nodes", Usage: "SLURM_STEP_NODELIST: the step's nodes (hostlist)"},
			&cli.IntFlag{Name: "nnodes", Usage: "S_JOB_NNODES: the step's node count, as slurmstepd knows it (0: unknown)"},
			&cli.IntFlag{Name: "node-index", Usage: "S_JOB_NODEID: this node's index in the step"},
			&cli.StringFlag{Name: "network", Usage: "--microvm-network: the step network mode"},
			&cli.PathFlag{Name: "slurm-conf", Usage: "slurm.conf of the node's slurmd (SLURM_CONF), for scontrol"},
		),
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c, true)
			if err != nil {
				return err
			}
			groups, err := parseGids(c.String("groups"))
			if err != nil {
				return cli.Exit(err.Error(), 2)
			}
			name := c.String("user")
			if name == "" {
				if u, err := user.LookupId(strconv.FormatUint(uint64(c.Uint("uid")), 10)); err == nil {
					name = u.Username
				}
			}
			host := c.String("hostname")
			if host == "" {
				host = c.String("node")
			}
			if host == "" {
				host, _ = os.Hostname()
			}
			if m := c.String("mpi"); m != "" && !slices.Contains(launcher.MPIModes, m) {
				return cli.Exit(fmt.Sprintf("--microvm-mpi: %q must be one of %s", m, strings.Join(launcher.MPIModes, ", ")), 2)
			}
			workdir, err := fs.ParseWorkdir(c.String("workdir"))
			if err != nil {
				return cli.Exit(err.Error(), 2)
			}
			mounts, origin := c.String("mounts"), fs.OptionName
			if mounts == "" && c.String("mounts-env") != "" {
				mounts, origin = c.String("mounts-env"), fs.EnvVar
			}
			if _, err := fs.Parse(origin, mounts); err != nil {
				return cli.Exit(err.Error(), 2)
			}
			perNode, err := launcher.ParseSlurmMiB("SLURM_MEM_PER_NODE", c.String("mem-per-node"))
			if err != nil {
				return cli.Exit(err.Error(), 2)
			}
			perCPU, err := launcher.ParseSlurmMiB("SLURM_MEM_PER_CPU", c.String("mem-per-cpu"))
			if err != nil {
				return cli.Exit(err.Error(), 2)
			}
			id, err := stepID(c)
			if err != nil {
				return err
			}
			img := c.String("image")
			if (strings.HasPrefix(img, "./") || strings.HasPrefix(img, "../")) && c.String("cwd") != "" {
				img = filepath.Join(c.String("cwd"), img)
			}
			s := &launcher.Spec{
				ID: id, UID: uint32(c.Uint("uid")), GID: uint32(c.Uint("gid")), Groups: groups, User: name,
				Image: img, Cores: c.String("cores"), MemMiB: c.Uint64("mem-mb"), GPUs: c.String("gpus"),
				MemPerNodeMiB: perNode, MemPerCPUMiB: perCPU,
				LocalTasks: c.Int("tasks"), Hostname: host, Debug: c.Bool("debug"),
				Mounts: mounts, MountsOrigin: origin, Workdir: workdir, MPI: c.String("mpi"),
				Nodes: c.String("nodes"), NNodes: c.Int("nnodes"), NodeIndex: c.Int("node-index"),
				Network: c.String("network"), SlurmConf: c.String("slurm-conf"),
			}
			l := &launcher.Launcher{Config: cfg}
			if err := l.Prepare(c.Context, s); err != nil {
				return cli.Exit(err.Error(), 1)
			}
			return nil
		},
	}
}

func parseGids(s string) ([]uint32, error) {
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--groups: %q is not a numeric gid", f)
		}
		out = append(out, uint32(n))
	}
	return out, nil
}

func startCommand() *cli.Command {
	return &cli.Command{
		Name:  "start",
		Usage: "boot and supervise a prepared step's sandbox (run detached by the SPANK plugin)",
		Flags: stepFlags,
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c, true)
			if err != nil {
				return err
			}
			id, err := stepID(c)
			if err != nil {
				return err
			}
			d := state.Dir{Root: cfg.RuntimeDir, ID: id}
			logf, err := launcher.OpenSupervisorLog(cfg, id, time.Now())
			if logf == nil {
				return cli.Exit(err.Error(), 1)
			}
			defer logf.Close()
			if err != nil {
				fmt.Fprintf(logf, "%v\n", err)
			}
			s, err := launcher.ReadSpec(d.Path())
			debug := c.Bool("debug") || (err == nil && s.Debug)
			l := &launcher.Launcher{Config: cfg, Log: newLogger(logf, debug), Trampoline: selfPath()}
			// Only `slurm-microvm stop` ends the supervisor: it marks the
			// state first. TERM or INT without the mark (sent to every
			// process of the step, e.g. by a job's scancel) are the
			// workload's, forwarded by the task; they are ignored here.
			ctx, stop := context.WithCancel(c.Context)
			defer stop()
			signal.Ignore(unix.SIGHUP, unix.SIGPIPE)
			sigs := make(chan os.Signal, 4)
			signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)
			go func() {
				for sig := range sigs {
					if d.Stopped() {
						stop()
						return
					}
					if l := logf; l != nil {
						fmt.Fprintf(l, "ignoring %v: no stop was requested (the step's own signals go to its tasks)\n", sig)
					}
				}
			}()
			if err := l.Start(ctx, id); err != nil {
				l.Log.Error("sandbox failed", "err", err)
				return cli.Exit(err.Error(), 1)
			}
			return nil
		},
	}
}

// teardown runs a stop or gc: with the defaults when the node has no
// config file, and finishing even when the step's own signals
// (proctrack/linuxproc sends TERM to the whole step) reach it.
func teardown(c *cli.Context, fn func(*launcher.Launcher) error) error {
	signal.Ignore(unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	cfg, err := loadConfig(c, true)
	if err != nil {
		return err
	}
	log := newLogger(os.Stderr, c.Bool("debug"))
	err = fn(&launcher.Launcher{Config: cfg, Log: log})
	// A conversion killed with its step (or earlier) leaves its work
	// directory, unlocked, in the image cache.
	if gone, cerr := image.CleanAbandoned(c.Context, filepath.Join(cfg.CacheDir, "images")); cerr != nil {
		log.Warn("clean abandoned image conversions", "err", cerr)
	} else if len(gone) > 0 {
		log.Info("removed abandoned image conversions", "dirs", gone)
	}
	if err != nil {
		return cli.Exit(err.Error(), 1)
	}
	return nil
}

func stopCommand() *cli.Command {
	return &cli.Command{
		Name:  "stop",
		Usage: "stop a step's sandbox and remove its state (idempotent)",
		Flags: stepFlags,
		Action: func(c *cli.Context) error {
			id, err := stepID(c)
			if err != nil {
				return err
			}
			return teardown(c, func(l *launcher.Launcher) error { return l.Stop(c.Context, id) })
		},
	}
}

func gcCommand() *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "stop and remove everything left of a job on this node (epilog)",
		Flags: []cli.Flag{&cli.UintFlag{Name: "job", Required: true}, nodeFlag},
		Action: func(c *cli.Context) error {
			node := c.String("node")
			if node != "" {
				if err := state.CheckNodeName(node); err != nil {
					return cli.Exit("--node: "+err.Error(), 2)
				}
			}
			return teardown(c, func(l *launcher.Launcher) error {
				err := l.GC(c.Context, uint32(c.Uint("job")), node)
				// The job's steps released their images: prune past the
				// limits, bounded (image.go gcPrune).
				gcPrune(c.Context, l.Config, l.Log)
				return err
			})
		},
	}
}

func execCommand() *cli.Command {
	return &cli.Command{
		Name:      "exec",
		Usage:     "run a command in a running step's sandbox, as a task",
		ArgsUsage: "-- CMD [ARGS...]",
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "state", EnvVars: []string{launcher.EnvState}, Usage: "the step's state directory (default: from " + launcher.EnvStep + " and runtime_dir)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return cli.Exit("exec: no command given", 2)
			}
			os.Exit(runTask(c.Context, c.String("config"), c.String("state"), c.Args().Slice()))
			return nil
		},
	}
}

// runTask runs one task in the sandbox of stateDir and returns the exit
// code for this process (or ends it by the workload's signal).
func runTask(ctx context.Context, configPath, stateDir string, argv []string) int {
	if configPath == "" {
		configPath = config.DefaultPath
	}
	cfg, err := config.Load(configPath, true)
	if err != nil {
		fmt.Fprintln(os.Stderr, "slurm-microvm:", err)
		return 125
	}
	if stateDir == "" {
		id, err := state.ParseStepID(os.Getenv(launcher.EnvStep))
		if err != nil {
			fmt.Fprintf(os.Stderr, "slurm-microvm: no step to run in (%s: %v)\n", launcher.EnvStep, err)
			return 125
		}
		stateDir = state.Dir{Root: cfg.RuntimeDir, ID: id}.Path()
	}
	l := &launcher.Launcher{Config: cfg}
	st, err := l.Exec(ctx, stateDir, argv, os.Environ(), launcher.Stdio{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	if s, serr := launcher.ReadSpec(stateDir); serr == nil && s.Debug && os.Getenv("SLURM_LOCALID") == "0" {
		printDebug(stateDir)
	}
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			return reportTaskError(argv[0], err)
		}
		return 125
	}
	launcher.ExitLike(st)
	return st.Code
}

// printDebug writes the guest console and the supervisor log of the step to
// stderr (--microvm-debug), for local task 0.
func printDebug(stateDir string) {
	for _, f := range []string{state.ConsoleLog, state.LauncherLog} {
		b, err := os.ReadFile(filepath.Join(stateDir, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
			fmt.Fprintf(os.Stderr, "microvm %s: %s\n", strings.TrimSuffix(f, ".log"), line)
		}
	}
}

func runCommand() *cli.Command {
	return &cli.Command{
		Name:      "run",
		Usage:     "boot a microVM with an image, run one command in it, tear it down (no Slurm needed)",
		ArgsUsage: "-- CMD [ARGS...]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "image", Required: true, Usage: "OCI archive, OCI layout, squashfs, root filesystem directory or registry reference"},
			&cli.IntFlag{Name: "cpus", Value: 1, Usage: "vCPUs"},
			&cli.Uint64Flag{Name: "mem", Usage: "memory of the whole sandbox in MiB, VMM included (default: the configured default guest memory)"},
			&cli.StringFlag{Name: "workdir", Usage: "working directory in the guest"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return cli.Exit("run: no command given (usage: slurm-microvm run --image IMG -- CMD [ARGS...])", 2)
			}
			cfg, err := loadConfig(c, true)
			if err != nil {
				return err
			}
			personalize(cfg)
			cleanup := func() {} // before os.Exit: what Run leaves of the private run directory
			if os.Geteuid() != 0 {
				rt, err := privateRuntimeDir()
				if err != nil {
					return cli.Exit("run: "+err.Error(), 1)
				}
				// Run removes it once empty. The step's scratch lives
				// in it too, not in the node's root-owned scratch base
				// (fs.CheckScratchBase: a non-root launcher's own base).
				cfg.RuntimeDir = rt
				if cfg.Mounts.ScratchBase != "" {
					cfg.Mounts.ScratchBase = filepath.Join(rt, "scratch")
				}
				cleanup = func() { _ = os.Remove(cfg.Mounts.ScratchBase); _ = os.Remove(rt) }
			}
			defer cleanup()
			uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
			name := ""
			if u, err := user.Current(); err == nil {
				name = u.Username
			}
			groups, _ := os.Getgroups()
			var gids []uint32
			for _, g := range groups {
				gids = append(gids, uint32(g))
			}
			host, _ := os.Hostname()
			s := &launcher.Spec{
				ID:  state.StepID{Job: 0, Step: uint32(os.Getpid()), Restart: uint32(time.Now().Unix() & 0xffff)},
				UID: uid, GID: gid, Groups: gids, User: name, Image: c.String("image"),
				CPUs: c.Int("cpus"), MemMiB: c.Uint64("mem"), LocalTasks: 1,
				Hostname: host, Debug: c.Bool("debug"), Workdir: c.String("workdir"),
			}
			if c.Int("cpus") < 1 {
				return cli.Exit(fmt.Sprintf("run: --cpus %d: need at least 1", c.Int("cpus")), 2)
			}
			l := &launcher.Launcher{Config: cfg, Log: newLogger(io.Discard, false), Trampoline: selfPath()}
			if c.Bool("debug") {
				l.Log = newLogger(os.Stderr, true)
			}
			ctx, stop := signal.NotifyContext(c.Context, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
			defer stop()
			st, err := l.Run(ctx, s, c.Args().Slice(), os.Environ(), launcher.Stdio{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
			cleanup()
			if err != nil {
				os.Exit(reportTaskError(c.Args().First(), err))
			}
			launcher.ExitLike(st)
			return nil
		},
	}
}

// privateRuntimeDir makes the state root of a non-root `run`: a new
// directory with a random name, 0700, under $XDG_RUNTIME_DIR when that is
// the caller's own (not under `su`, which keeps the original user's), else
// under $TMPDIR or /tmp. Never a predictable name another user could create
// first (package launcher/state).
func privateRuntimeDir() (string, error) {
	prefix := fmt.Sprintf("slurm-microvm-%d-", os.Getuid())
	if rt := os.Getenv("XDG_RUNTIME_DIR"); rt != "" && filepath.IsAbs(rt) && state.CheckDir(rt) == nil {
		return state.PrivateTempDir(rt, prefix)
	}
	return state.PrivateTempDir("", prefix)
}

// personalize points the caches of a non-root caller at places the user
// owns (a non-root `run` also gets its own state root, privateRuntimeDir,
// which holds its scratch too).
func personalize(cfg *config.Config) {
	if os.Geteuid() == 0 {
		return
	}
	if dir, err := os.UserCacheDir(); err == nil {
		cfg.CacheDir = filepath.Join(dir, "slurm-microvm")
	}
}

func configCommand() *cli.Command {
	return &cli.Command{
		Name:  "config",
		Usage: "node configuration",
		Subcommands: []*cli.Command{{
			Name:  "check",
			Usage: "validate microvm.toml and what it names on this node: unknown keys and bad values are errors naming the key and line",
			Flags: append(append([]cli.Flag{}, kataCheckFlags...), &cli.BoolFlag{Name: "json", Usage: "print the result as JSON (configCheckReport; the exit status is the same)"}),
			Action: func(c *cli.Context) error {
				path := c.String("config")
				_, statErr := os.Stat(path)
				missing := errors.Is(statErr, os.ErrNotExist)
				if missing && !c.Bool("json") {
					fmt.Fprintf(c.App.Writer, "%s: no such file: the defaults apply (etc/microvm.toml lists them)\n", path)
				}
				cfg, err := config.Load(path, true)
				if err == nil {
					err = cfg.CheckHost(path)
					if cfg.Driver == "kata" {
						err = errors.Join(err, checkKata(c, cfg))
					}
				}
				// Slurm's cgroup configuration on this node (SLURM_CONF or
				// /etc/slurm/slurm.conf, and cgroup.conf beside it).
				sc := cgroup.CheckSlurm("", cgroup.Detect(), "")
				for _, p := range sc.Problems {
					err = errors.Join(err, errors.New("cgroup: "+p))
				}
				if c.Bool("json") {
					return printConfigCheck(c, path, !missing, cfg, &sc, err)
				}
				printCgroupCheck(c.App.Writer, sc)
				if err != nil {
					return cli.Exit(err.Error(), 1)
				}
				fmt.Fprintf(c.App.Writer, "%s: ok (driver %s, runtime %s, cache %s)\n", c.String("config"), cfg.Driver, cfg.RuntimeDir, cfg.CacheDir)
				return nil
			},
		}},
	}
}

// configCheckReport is `config check --json`: OK with no problems, else
// each problem with the key and line it was found at (0: none). Cgroup is
// the node's hierarchy and Slurm's cgroup settings (its problems are also
// in Problems, key "cgroup"; its missing settings are warnings only).
type configCheckReport struct {
	Path       string               `json:"path"`
	Exists     bool                 `json:"exists"`
	OK         bool                 `json:"ok"`
	Driver     string               `json:"driver,omitempty"`
	RuntimeDir string               `json:"runtime_dir,omitempty"`
	CacheDir   string               `json:"cache_dir,omitempty"`
	Cgroup     *cgroup.SlurmCheck   `json:"cgroup,omitempty"`
	Problems   []configCheckProblem `json:"problems"`
}

// printCgroupCheck writes the hierarchy, the Slurm settings that decide the
// sandbox's limits, and a warning line for each missing one.
func printCgroupCheck(w io.Writer, sc cgroup.SlurmCheck) {
	fmt.Fprintf(w, "cgroup: %s\n", sc.Describe)
	var set []string
	for _, k := range []string{"CgroupPlugin", "ConstrainRAMSpace", "ConstrainDevices", "ConstrainCores", "ProctrackType", "TaskPlugin"} {
		set = append(set, k+"="+sc.Settings[k])
	}
	fmt.Fprintf(w, "slurm: %s\n", strings.Join(set, " "))
	for _, m := range sc.Missing {
		fmt.Fprintf(w, "warning: missing %s\n", m)
	}
	for _, n := range sc.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

type configCheckProblem struct {
	Key     string `json:"key,omitempty"`
	Line    int    `json:"line,omitempty"`
	Message string `json:"message"`
}

// printConfigCheck writes the report of a check that ended with err and
// exits 1 when err is not nil.
func printConfigCheck(c *cli.Context, path string, exists bool, cfg *config.Config, sc *cgroup.SlurmCheck, err error) error {
	r := configCheckReport{Path: path, Exists: exists, OK: err == nil, Cgroup: sc, Problems: []configCheckProblem{}}
	if cfg != nil {
		r.Driver, r.RuntimeDir, r.CacheDir = cfg.Driver, cfg.RuntimeDir, cfg.CacheDir
	}
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		if e == nil {
			return
		}
		if m, ok := strings.CutPrefix(e.Error(), "cgroup: "); ok {
			r.Problems = append(r.Problems, configCheckProblem{Key: "cgroup", Message: m})
			return
		}
		var ce *config.Error
		if errors.As(e, &ce) {
			r.Problems = append(r.Problems, configCheckProblem{Key: ce.Key, Line: ce.Line, Message: ce.Msg})
			return
		}
		r.Problems = append(r.Problems, configCheckProblem{Message: e.Error()})
	}
	walk(err)
	enc := json.NewEncoder(c.App.Writer)
	enc.SetIndent("", "  ")
	if eerr := enc.Encode(r); eerr != nil {
		return eerr
	}
	if err != nil {
		return cli.Exit("", 1)
	}
	return nil
}

// selfPath is this binary, the VMM's trampoline ("" when it cannot be
// found: QEMU is then started directly).
func selfPath() string {
	p, err := os.Executable()
	if err != nil {
		return ""
	}
	return p
}
