package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/launcher/image"
	"github.com/slurm-microvm/slurm-microvm/mpi"
)

// mpiCommand is `slurm-microvm mpi`: `check` compares an image's MPI stack
// (MPI, UCX, libfabric, PMIx, glibc) with the host's and says whether
// injecting the host's MPI into the guest is safe (package mpi). It needs
// no Slurm; the image is prepared like a step's, for the calling user.
func mpiCommand() *cli.Command {
	return &cli.Command{
		Name:  "mpi",
		Usage: "MPI integration: ABI check between an image and the host",
		Subcommands: []*cli.Command{{
			Name:  "check",
			Usage: "compare the image's MPI stack with the host's; exit 0 when injecting the host MPI is safe",
			Description: "Prints, per library (MPI, UCX ucp/uct/ucs/ucm, libfabric, PMIx, glibc), the host and image\n" +
				"path and version and a verdict with its reason, then the injection plan. Exit status: 0 safe,\n" +
				"1 not safe (including \"image has no MPI library\"), 2 bad input.",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "image", Usage: "image to check (anything --microvm accepts); prepared and cached for the calling user"},
				&cli.PathFlag{Name: "image-root", Usage: "check an unpacked image root directory instead of --image"},
				&cli.PathFlag{Name: "host-root", Value: "/", Usage: "root directory of the host side (tests compare two directories)"},
				&cli.StringFlag{Name: "mode", Value: string(mpi.DefaultMode), Usage: "MPI version rule: major, full (host minor >= image minor) or strict (equal minors)"},
				&cli.StringFlag{Name: "program", Usage: "the step's program: a path inside the image, else on the host; its MPI imports are checked too"},
				&cli.StringFlag{Name: "host-mpi", Usage: "host MPI library to inject (default: the host's library of the image's MPI family)"},
				&cli.StringFlag{Name: "access", Value: "auto", Usage: "how to read the prepared disk: auto (read, else extract), read (in this process, no mount) or extract (fsck.erofs, a private copy)"},
				&cli.BoolFlag{Name: "insecure", Usage: "allow plain http to a registry on a loopback address"},
				&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
			},
			Action: mpiCheck,
		}},
	}
}

func mpiCheck(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("mpi check: unexpected argument %q (the image is given with --image)", c.Args().First()), 2)
	}
	mode, err := mpi.ParseMode(c.String("mode"))
	if err != nil {
		return cli.Exit("mpi check: --mode: "+err.Error(), 2)
	}
	ref, dir := c.String("image"), c.String("image-root")
	if (ref == "") == (dir == "") {
		return cli.Exit("mpi check: give exactly one of --image IMG or --image-root DIR", 2)
	}
	access := map[string]mpi.DiskAccess{"auto": mpi.DiskAuto, "read": mpi.DiskRead, "extract": mpi.DiskExtract}
	acc, ok := access[c.String("access")]
	if c.String("access") == "mount" {
		return cli.Exit("mpi check: --access mount: no longer offered (a mounted image is open to every local user while mounted); use read, which reads the disk without mounting it", 2)
	}
	if !ok {
		return cli.Exit(fmt.Sprintf("mpi check: --access %q: want auto, read or extract", c.String("access")), 2)
	}
	level := slog.LevelWarn
	if c.Bool("debug") {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	co := mpi.CheckOptions{Mode: mode, Program: c.String("program"), HostMPI: c.String("host-mpi"), Logger: log}
	var rep *mpi.Report
	if dir != "" {
		rep, err = mpi.Check(c.Context, c.String("host-root"), dir, co)
	} else {
		cfg, cerr := loadConfig(c, true)
		if cerr != nil {
			return cerr
		}
		personalize(cfg)
		io := image.Options{
			UID: uint32(os.Getuid()), GID: uint32(os.Getgid()),
			CacheRoot: filepath.Join(cfg.CacheDir, "images"),
			Insecure:  c.Bool("insecure"),
			Logger:    log,
		}
		gs, gerr := os.Getgroups()
		if gerr != nil {
			return cli.Exit("mpi check: read the caller's groups: "+gerr.Error(), 1)
		}
		for _, g := range gs {
			io.Groups = append(io.Groups, uint32(g))
		}
		rep, err = mpi.CheckImage(c.Context, ref, mpi.ImageCheckOptions{CheckOptions: co, HostRoot: c.String("host-root"), Image: io, Disk: mpi.DiskOptions{Access: acc}})
	}
	if err != nil {
		var ie *image.Error
		if errors.As(err, &ie) {
			return cli.Exit("mpi check: --image: "+err.Error(), 2)
		}
		return cli.Exit("mpi check: "+err.Error(), 1)
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return cli.Exit("mpi check: "+err.Error(), 1)
		}
	} else if err := rep.WriteText(c.App.Writer); err != nil {
		return cli.Exit("mpi check: "+err.Error(), 1)
	}
	if err := rep.Err(); err != nil {
		if errors.Is(err, mpi.ErrNoImageMPI) {
			return cli.Exit("mpi check: "+mpi.ErrNoImageMPI.Error(), 1)
		}
		return cli.Exit("mpi check: "+err.Error(), 1)
	}
	return nil
}
