package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/image"
	"github.com/slurm-microvm/slurm-microvm/launcher/image/auth"
)

// imageCommand is `slurm-microvm image`: prepare, check, list and remove
// cached image disks (package launcher/image), plus the hidden helper the
// launcher re-executes as the job's user to read user-named paths.
func imageCommand() *cli.Command {
	cacheFlag := &cli.PathFlag{Name: "cache-root", Usage: "image cache directory, one subdirectory per uid (default: <cache_dir>/images of the config, the one jobs use)"}
	uidFlag := &cli.Uint64Flag{Name: "uid", Usage: "the job user's uid (default: the caller's)"}
	return &cli.Command{
		Name:  "image",
		Usage: "convert, check and manage cached image disks",
		Subcommands: []*cli.Command{
			{
				Name:      "prepare",
				Usage:     "convert IMAGE to a cached erofs disk for a user (root), print it as JSON",
				ArgsUsage: "IMAGE",
				Description: "A registry image is pulled with the user's own credentials, read as that user, from the first of\n" +
					"$REGISTRY_AUTH_FILE (else ~/.config/containers/auth.json), $DOCKER_CONFIG/config.json (else\n" +
					"~/.docker/config.json) and $ENROOT_CONFIG_PATH/.credentials (else ~/.config/enroot/.credentials)\n" +
					"that holds an entry for its registry; anonymously when none does. With --uid, the variables are not\n" +
					"used (they are the caller's): that user's home directory is read, as in a job.",
				Flags: []cli.Flag{
					cacheFlag, uidFlag,
					&cli.Uint64Flag{Name: "gid", Usage: "the job user's primary gid (default: the caller's)"},
					&cli.StringFlag{Name: "groups", Usage: "the job user's supplementary gids, comma-separated (default: the caller's when --uid is not given, none otherwise)"},
					&cli.StringFlag{Name: "compression", Usage: "mkfs.erofs compressor (lz4, lz4hc); default: none"},
					&cli.BoolFlag{Name: "insecure", Usage: "allow plain http to a registry on a loopback address"},
					&cli.BoolFlag{Name: "debug", Usage: "log debug records to stderr"},
				},
				Action: func(c *cli.Context) error {
					ref, err := imageOneArg(c, "IMAGE")
					if err != nil {
						return err
					}
					o, err := imageOptions(c)
					if err != nil {
						return err
					}
					img, err := image.Prepare(c.Context, ref, o)
					if err != nil {
						return cli.Exit(err.Error(), 1)
					}
					enc := json.NewEncoder(c.App.Writer)
					enc.SetIndent("", "  ")
					return enc.Encode(img)
				},
			},
			{
				Name:      "check",
				Usage:     "validate IMAGE quickly, as the calling user, without converting it",
				ArgsUsage: "IMAGE",
				Flags: []cli.Flag{&cli.BoolFlag{Name: "insecure", Usage: "allow plain http to a registry on a loopback address"}, &cli.BoolFlag{Name: "debug"},
					&cli.BoolFlag{Name: "json", Usage: `print {"image", "ok", "error"} as JSON (the exit status is the same)`}},
				Action: func(c *cli.Context) error {
					ref, err := imageOneArg(c, "IMAGE")
					if err != nil {
						return err
					}
					o, err := imageOptions(c)
					if err != nil {
						return err
					}
					checkErr := image.Check(c.Context, ref, o)
					if c.Bool("json") {
						r := struct {
							Image string `json:"image"`
							OK    bool   `json:"ok"`
							Error string `json:"error,omitempty"`
						}{Image: ref, OK: checkErr == nil}
						if checkErr != nil {
							r.Error = checkErr.Error()
						}
						if err := json.NewEncoder(c.App.Writer).Encode(r); err != nil {
							return err
						}
						if checkErr != nil {
							return cli.Exit("", 1)
						}
						return nil
					}
					if checkErr != nil {
						return cli.Exit(checkErr.Error(), 1)
					}
					return nil
				},
			},
			{
				Name:  "ls",
				Usage: "list the caller's (or --uid's) cached images; --all: every user's (root)",
				Flags: []cli.Flag{cacheFlag, uidFlag, &cli.BoolFlag{Name: "json", Usage: "print JSON"},
					&cli.BoolFlag{Name: "all", Usage: "list every user's cached images (root only)"}},
				Action: func(c *cli.Context) error {
					uid := uint32(os.Getuid())
					all := c.Bool("all")
					if all && c.IsSet("uid") {
						return cli.Exit("image ls: --all and --uid exclude each other: drop one", 2)
					}
					if all && os.Geteuid() != 0 {
						return cli.Exit("image ls --all: other users' caches are theirs; run it as root, or drop --all to list your own", 2)
					}
					if c.IsSet("uid") {
						uid = uint32(c.Uint64("uid"))
					}
					root, node, err := imageCacheRoot(c)
					if err != nil {
						return err
					}
					entries, err := image.List(root, uid, all)
					if err != nil {
						return cli.Exit(err.Error(), 1)
					}
					if node != "" {
						// A non-root caller: their jobs' images are in the
						// node's cache, root's alone (launcher/image doc).
						more, err := image.List(node, uid, false)
						switch {
						case errors.Is(err, fs.ErrPermission):
							fmt.Fprintf(c.App.ErrWriter, "image ls: listed %s only; %s\n", root, nodeCacheAdvice(node, uid, "DIGEST"))
						case err != nil:
							return cli.Exit(err.Error(), 1)
						default:
							entries = append(entries, more...)
						}
					}
					if c.Bool("json") {
						return json.NewEncoder(c.App.Writer).Encode(entries)
					}
					tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "UID\tDIGEST\tKIND\tSIZE\tCREATED\tREF")
					for _, e := range entries {
						fmt.Fprintf(tw, "%d\t%.19s\t%s\t%s\t%s\t%s\n", e.UID, e.Digest, e.Kind, imageHumanBytes(e.Size), e.Created.Local().Format(time.DateTime), printable(e.Ref))
					}
					return tw.Flush()
				},
			},
			{
				Name:      "rm",
				Usage:     "remove cached images by digest (12+ hex digits) or by the reference they were prepared from",
				ArgsUsage: "DIGEST|REF...",
				Flags:     []cli.Flag{cacheFlag, uidFlag},
				Action: func(c *cli.Context) error {
					if c.NArg() == 0 {
						return cli.Exit("image rm: name at least one digest or reference", 2)
					}
					uid := uint32(os.Getuid())
					if c.IsSet("uid") {
						uid = uint32(c.Uint64("uid"))
					}
					root, node, err := imageCacheRoot(c)
					if err != nil {
						return err
					}
					for _, what := range c.Args().Slice() {
						removed, err := image.Remove(c.Context, root, uid, what)
						for _, e := range removed {
							fmt.Fprintf(c.App.Writer, "removed %s %s\n", e.Digest, printable(e.Ref))
						}
						if err != nil && node != "" && errors.Is(err, image.ErrNotFound) {
							return cli.Exit(fmt.Sprintf("%v; %s", err, nodeCacheAdvice(node, uid, what)), 1)
						}
						if err != nil {
							return cli.Exit(err.Error(), 1)
						}
					}
					return nil
				},
			},
			{
				Name: "prune",
				Usage: "remove the least recently used cached images that no running step uses, until each user is within " +
					"images.user_cache_mib and all within images.cache_mib; --all also prunes the guest assets (images.assets_cache_mib)",
				Flags: []cli.Flag{cacheFlag, uidFlag,
					&cli.BoolFlag{Name: "all", Usage: "prune every user's images and the guest assets (root only)"},
					&cli.BoolFlag{Name: "dry-run", Usage: "print what would be removed, remove nothing"},
					&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
				Action: func(c *cli.Context) error {
					all := c.Bool("all")
					if all && c.IsSet("uid") {
						return cli.Exit("image prune: --all and --uid exclude each other: drop one", 2)
					}
					if all && os.Geteuid() != 0 {
						return cli.Exit("image prune --all: other users' caches are theirs; run it as root, or drop --all to prune your own", 2)
					}
					uid := uint32(os.Getuid())
					if c.IsSet("uid") {
						uid = uint32(c.Uint64("uid"))
					}
					root, _, err := imageCacheRoot(c)
					if err != nil {
						return err
					}
					cfg, err := loadConfig(c, true)
					if err != nil {
						return err
					}
					res, err := pruneCaches(c.Context, cfg, root, pruneScope{uid: uid, all: all, dryRun: c.Bool("dry-run")}, nil)
					if res != nil {
						if c.Bool("json") {
							enc := json.NewEncoder(c.App.Writer)
							if perr := enc.Encode(res); perr != nil {
								return perr
							}
						} else {
							printPrune(c.App.Writer, res)
						}
					}
					if err != nil {
						return cli.Exit("image prune: "+err.Error(), 1)
					}
					return nil
				},
			},
			{
				// The launcher re-executes itself as the job's user with
				// this subcommand to read user-named paths; see
				// image.RunHelper. Not for people.
				Name:            "helper",
				Hidden:          true,
				SkipFlagParsing: true,
				HideHelp:        true,
				Action: func(c *cli.Context) error {
					if code := image.RunHelper(c.Context, c.Args().Slice(), os.Stdout, os.Stderr); code != 0 {
						return cli.Exit("", code)
					}
					return nil
				},
			},
		},
	}
}

// imageOptions builds image.Options from the flags of prepare/check; the
// credentials default to the caller's own.
func imageOptions(c *cli.Context) (image.Options, error) {
	root, _, err := imageCacheRoot(c)
	if err != nil {
		return image.Options{}, err
	}
	level := slog.LevelWarn
	if c.Bool("debug") {
		level = slog.LevelDebug
	}
	o := image.Options{
		UID:         uint32(os.Getuid()),
		GID:         uint32(os.Getgid()),
		CacheRoot:   root,
		Insecure:    c.Bool("insecure"),
		Compression: c.String("compression"),
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}
	if !c.IsSet("uid") {
		// The caller's own image: its own credential files, as podman
		// and enroot find them (REGISTRY_AUTH_FILE, DOCKER_CONFIG,
		// ENROOT_CONFIG_PATH, HOME). Never root's for another uid.
		o.Auth = auth.EnvFrom(os.Getenv)
		gs, err := os.Getgroups()
		if err != nil {
			return o, fmt.Errorf("read the caller's groups: %w", err)
		}
		for _, g := range gs {
			o.Groups = append(o.Groups, uint32(g))
		}
	} else {
		o.UID = uint32(c.Uint64("uid"))
	}
	if c.IsSet("gid") {
		o.GID = uint32(c.Uint64("gid"))
	}
	if c.IsSet("groups") {
		o.Groups = nil
		for _, s := range strings.Split(c.String("groups"), ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			g, err := strconv.ParseUint(s, 10, 32)
			if err != nil {
				return o, cli.Exit(fmt.Sprintf("--groups: %q is not a numeric gid (in %q)", s, c.String("groups")), 2)
			}
			o.Groups = append(o.Groups, uint32(g))
		}
	}
	return o, nil
}

func imageOneArg(c *cli.Context, what string) (string, error) {
	if c.NArg() != 1 {
		return "", cli.Exit(fmt.Sprintf("%s: want exactly one %s argument, got %d", c.Command.FullName(), what, c.NArg()), 2)
	}
	return c.Args().First(), nil
}

func imageHumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// imageCacheRoot is --cache-root, or the image cache of the node's config
// (<cache_dir>/images, where jobs keep their images), personalized for a
// non-root caller as `run` does. node is the node's cache when that differs
// from root (a non-root caller without --cache-root), else "". A config
// that cannot be read or parsed is an error naming it; a missing one means
// the defaults, as for every user-side command (loadConfig).
func imageCacheRoot(c *cli.Context) (root, node string, err error) {
	if v := c.String("cache-root"); v != "" {
		return v, "", nil
	}
	cfg, err := loadConfig(c, true)
	if err != nil {
		return "", "", err
	}
	nodeRoot := filepath.Join(cfg.CacheDir, "images")
	personalize(cfg)
	root = filepath.Join(cfg.CacheDir, "images")
	if root != nodeRoot {
		node = nodeRoot
	}
	return root, node, nil
}

// nodeCacheAdvice tells a non-root caller how to list or remove their
// images in the node's cache, which only root can read or change (see
// launcher/image, "Cache").
func nodeCacheAdvice(node string, uid uint32, what string) string {
	return fmt.Sprintf("the images your jobs converted are in the node image cache %s/%d, which only root can read or change: "+
		"a node administrator lists them with `sudo slurm-microvm image ls --uid %d` and removes one with `sudo slurm-microvm image rm --uid %d %s`",
		node, uid, uid, uid, what)
}

// pruneScope says whose images a prune may remove: uid's, or everyone's
// (all, which also prunes the guest assets); max bounds the images
// removed (0: no bound).
type pruneScope struct {
	uid    uint32
	all    bool
	dryRun bool
	max    int
}

// pruneReport is what `image prune` prints: the image cache's result and,
// for --all, the asset cache's.
type pruneReport struct {
	DryRun bool                `json:"dry_run"`
	Images *image.PruneResult  `json:"images"`
	Assets *assets.PruneResult `json:"assets,omitempty"`
}

// pruneCaches prunes the image cache at root (and, for scope.all, the
// node's asset cache) to cfg's [images] limits. It reports what was done
// even when some removal failed.
func pruneCaches(ctx context.Context, cfg *config.Config, root string, scope pruneScope, log *slog.Logger) (*pruneReport, error) {
	rep := &pruneReport{DryRun: scope.dryRun}
	var errs []error
	res, err := image.Prune(ctx, root, image.PruneOptions{UID: scope.uid, All: scope.all, Limits: launcher.ImageLimits(cfg.Images),
		MaxRemove: scope.max, DryRun: scope.dryRun, Logger: log})
	rep.Images = res
	if err != nil {
		errs = append(errs, err)
	}
	if scope.all {
		a, err := assets.Prune(ctx, filepath.Join(cfg.CacheDir, "assets"), assets.PruneOptions{
			MaxBytes: int64(cfg.Images.AssetsCacheMiB) << 20, DryRun: scope.dryRun, Logger: log})
		rep.Assets = a
		if err != nil {
			errs = append(errs, err)
		}
	}
	return rep, errors.Join(errs...)
}

func printPrune(w io.Writer, r *pruneReport) {
	verb := "removed"
	if r.DryRun {
		verb = "would remove"
	}
	if im := r.Images; im != nil {
		for _, e := range im.Removed {
			fmt.Fprintf(w, "%s image %s uid %d %s (last used %s) %s\n", verb, e.Digest, e.UID, imageHumanBytes(e.Size), e.LastUsed.Local().Format(time.DateTime), printable(e.Ref))
		}
		for _, e := range im.InUse {
			fmt.Fprintf(w, "kept image %s uid %d: in use by a running step or a conversion\n", e.Digest, e.UID)
		}
		fmt.Fprintf(w, "images: %s freed, %s cached (limit %s)\n", imageHumanBytes(im.FreedBytes), imageHumanBytes(im.UsedBytes), imageHumanBytes(im.LimitBytes))
	}
	if a := r.Assets; a != nil {
		for _, n := range a.Removed {
			fmt.Fprintf(w, "%s guest assets %s\n", verb, n)
		}
		fmt.Fprintf(w, "assets: %s freed, %s cached (limit %s)\n", imageHumanBytes(a.FreedBytes), imageHumanBytes(a.UsedBytes), imageHumanBytes(a.LimitBytes))
	}
}

// Epilog prune bounds: `gc` prunes only when a cache is past a limit, at
// most this many images, within this time, so that the epilog ends
// promptly; the daily timer (etc/systemd/slurm-microvm-prune.timer)
// prunes without bound.
const (
	gcPruneMax     = 1024
	gcPruneTimeout = 20 * time.Second
)

// gcPrune is the epilog's bounded prune of the node's caches.
func gcPrune(ctx context.Context, cfg *config.Config, log *slog.Logger) {
	root := filepath.Join(cfg.CacheDir, "images")
	over, err := image.OverLimit(root, launcher.ImageLimits(cfg.Images))
	if err != nil {
		log.Warn("measure the image cache", "err", err)
		return
	}
	if !over {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, gcPruneTimeout)
	defer cancel()
	rep, err := pruneCaches(ctx, cfg, root, pruneScope{all: true, max: gcPruneMax}, log)
	if err != nil {
		log.Warn("prune the image cache", "err", err)
	}
	if rep != nil && rep.Images != nil {
		log.Info("pruned the image cache", "images", len(rep.Images.Removed), "freed_bytes", rep.Images.FreedBytes,
			"in_use", len(rep.Images.InUse), "cached_bytes", rep.Images.UsedBytes, "limit_bytes", rep.Images.LimitBytes)
	}
}
