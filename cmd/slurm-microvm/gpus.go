package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu/driverset"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu/gpunvml"
)

// gpusCommand is `slurm-microvm gpus`: the node's GPU readiness for VFIO
// passthrough (package launcher/gpu). It exits 1 when gres.conf cannot be
// used or a GPU that it configures for this node cannot be passed through
// now (gpu.Report.Err).
func gpusCommand() *cli.Command {
	return &cli.Command{
		Name:  "gpus",
		Usage: "show this node's GPUs (gres.conf) and whether each can be passed to a microVM",
		Description: "Per GPU of gres.conf: PCI address, IOMMU group and members, bound driver, NVML UUID and MIG mode\n" +
			"where the NVIDIA driver is loaded, the gres.conf entry, and whether a step could get it now;\n" +
			"plus host checks (IOMMU, vfio-pci, /dev/vfio). Exit status 1 when gres.conf cannot be used or a configured GPU is not passable.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
			&cli.PathFlag{Name: "gres-conf", Value: gpu.DefaultGresConf, Usage: "gres.conf to read"},
			&cli.StringFlag{Name: "node", Usage: "Slurm node name for NodeName= lines (default: short host name)"},
			&cli.PathFlag{Name: "sysfs-root", Value: "/sys", Usage: "where sysfs is mounted (a fake tree in tests)"},
			&cli.PathFlag{Name: "procfs-root", Value: "/proc", Usage: "where procfs is mounted"},
			&cli.PathFlag{Name: "dev-root", Value: "/dev", Usage: "where /dev is"},
			&cli.BoolFlag{Name: "allow-rebind", Usage: "judge GPUs as a node that lets slurm-microvm rebind them to vfio-pci would"},
			&cli.BoolFlag{Name: "no-nvml", Usage: "do not load libnvidia-ml"},
			&cli.PathFlag{Name: "driver-root", Usage: "where the NVIDIA driver is installed (default: gpu.driver.root of the configuration)"},
			&cli.StringFlag{Name: "kernel-release", Usage: "guest kernel release to find the driver's modules for (default: the kernel guests boot)"},
		},
		Action: func(c *cli.Context) error {
			req := gpu.InspectRequest{
				GresConf: c.String("gres-conf"), Node: c.String("node"), AllowRebind: c.Bool("allow-rebind"),
				Roots: gpu.Roots{Sys: c.String("sysfs-root"), Proc: c.String("procfs-root"), Dev: c.String("dev-root")},
			}
			if !c.Bool("no-nvml") {
				req.NVML = gpunvml.New()
			}
			rep := gpu.Inspect(c.Context, req)
			cfg, err := loadConfig(c, true)
			if err != nil {
				return cli.Exit("gpus: "+err.Error(), 1)
			}
			rep.Driver = inspectDriver(c, cfg)
			if c.Bool("json") {
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				printGPUReport(c.App.Writer, rep)
			}
			if rep.GresConfAbsent && c.IsSet("gres-conf") {
				return cli.Exit(fmt.Sprintf("gpus: --gres-conf %s does not exist: name the gres.conf Slurm reads", c.String("gres-conf")), 1)
			}
			if err := rep.Err(); err != nil {
				return cli.Exit("gpus: "+err.Error(), 1)
			}
			return nil
		},
	}
}

// inspectDriver finds the driver set a GPU step of this node would get,
// as the launcher does at step start (launcher.planGPUDriver).
func inspectDriver(c *cli.Context, cfg *config.Config) *gpu.DriverReport {
	d := cfg.GPU.Driver
	r := &gpu.DriverReport{Inject: d.Inject == nil || *d.Inject, Root: d.Root, KernelRelease: c.String("kernel-release")}
	if c.IsSet("driver-root") {
		r.Root = c.String("driver-root")
	}
	if r.KernelRelease == "" {
		rel, err := assets.GuestKernelRelease(cfg.QEMU.Kernel)
		if err != nil {
			r.Error = err.Error()
			return r
		}
		r.KernelRelease = rel
	}
	set, err := driverset.Discover(c.Context, driverset.Options{Root: r.Root, KernelRelease: r.KernelRelease, Modules: d.Modules, Params: d.Params})
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Set = set
	r.GuestLibDir, r.GuestBinDir = driverset.GuestLibDir, driverset.GuestBinDir
	r.Devices = set.DeviceNodes(1)
	return r
}

func printGPUReport(w io.Writer, r *gpu.Report) {
	fmt.Fprintf(w, "node %s, gres.conf %s", r.Node, r.GresConf)
	if r.AutoDetect != "" {
		fmt.Fprintf(w, " (AutoDetect=%s)", r.AutoDetect)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "host:")
	for _, c := range r.Host {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %-14s %s\n", mark, c.Name, c.Detail)
	}
	if r.NoGPUs != "" {
		fmt.Fprintf(w, "GPUs: none: %s\n", r.NoGPUs)
	}
	for _, g := range r.GPUs {
		fmt.Fprintf(w, "GPU %d  %s", g.Index, g.File)
		if g.BDF != "" {
			fmt.Fprintf(w, "  %s", g.BDF)
		}
		if g.Name != "" {
			fmt.Fprintf(w, "  %s", g.Name)
		}
		if g.NVMLIndex >= 0 {
			fmt.Fprintf(w, "  nvml %d", g.NVMLIndex)
		}
		if g.UUID != "" {
			fmt.Fprintf(w, "  %s", g.UUID)
		}
		if g.MIG != "" {
			fmt.Fprintf(w, "  MIG %s", g.MIG)
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "  %s  %s\n", g.GresWhere, g.Gres)
		if g.IOMMUGroup >= 0 {
			var ms []string
			for _, m := range g.Members {
				ms = append(ms, fmt.Sprintf("%s %s (%s)", m.BDF, m.Role, orNone(m.Driver)))
			}
			fmt.Fprintf(w, "  driver %s", orNone(g.Driver))
			if g.Minor >= 0 {
				fmt.Fprintf(w, ", minor %d", g.Minor)
			}
			fmt.Fprintf(w, ", IOMMU group %d: %s\n", g.IOMMUGroup, strings.Join(ms, ", "))
		}
		switch {
		case g.Passable && len(g.Rebind) > 0:
			fmt.Fprintf(w, "  passable: yes (moves %s to vfio-pci at step start, back at stop)\n", strings.Join(g.Rebind, " "))
		case g.Passable:
			fmt.Fprintln(w, "  passable: yes")
		default:
			fmt.Fprintf(w, "  passable: no: %s\n", g.Why)
		}
	}
	for _, u := range r.Unlisted {
		fmt.Fprintf(w, "not in gres.conf: %s, IOMMU group %d\n", u.Desc, u.IOMMUGroup)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	printDriver(w, r.Driver)
}

// printDriver shows the driver set GPU steps get.
func printDriver(w io.Writer, d *gpu.DriverReport) {
	if d == nil {
		return
	}
	if !d.Inject {
		fmt.Fprintln(w, "driver: not injected (gpu.driver.inject = false): the guest kernel and the image drive the GPUs")
		return
	}
	if d.Error != "" {
		fmt.Fprintf(w, "driver: FAIL (root %s, guest kernel %s): %s\n", d.Root, orNone(d.KernelRelease), d.Error)
		return
	}
	s := d.Set
	fmt.Fprintf(w, "driver: %s (root %s)\n", s.Version, d.Root)
	if s.LoadedVersion != "" {
		fmt.Fprintf(w, "  loaded on the node: %s\n", s.LoadedVersion)
	}
	for _, m := range s.Modules {
		fmt.Fprintf(w, "  module %-16s %s", m.Name, m.Path)
		if m.Params != "" {
			fmt.Fprintf(w, " (%s)", m.Params)
		}
		fmt.Fprintln(w)
	}
	for _, f := range s.Firmware {
		fmt.Fprintf(w, "  firmware %s\n", f.Path)
	}
	for _, l := range s.Libraries {
		fmt.Fprintf(w, "  library %-28s %s\n", l.Soname, l.Path)
	}
	for _, b := range s.Binaries {
		fmt.Fprintf(w, "  tool %s\n", b.Path)
	}
	var nodes []string
	for _, n := range d.Devices {
		nodes = append(nodes, "/dev/"+n.Path)
	}
	fmt.Fprintf(w, "  guest: libraries at %s, tools at %s (first in LD_LIBRARY_PATH and PATH); devices %s (one nvidia<i> per GPU)\n",
		d.GuestLibDir, d.GuestBinDir, strings.Join(nodes, " "))
	for _, n := range s.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
