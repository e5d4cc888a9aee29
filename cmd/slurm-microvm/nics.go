package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/launcher/network/sriov"
)

// nicsCommand is `slurm-microvm nics`: the node's SR-IOV physical
// functions ([network.sriov] pfs), their VFs, which are free or claimed by
// a step, and each VF's IOMMU group verdict (package
// launcher/network/sriov). Read-only. It exits 1 when the configuration
// or a configured PF cannot be used (sriov.Report.Err).
func nicsCommand() *cli.Command {
	return &cli.Command{
		Name:  "nics",
		Usage: "show this node's SR-IOV NICs (network.sriov.pfs), their VFs and whether a step could get each",
		Description: "Per configured PF: PCI address, driver, interfaces and RDMA devices, VFs enabled of the most offered;\n" +
			"per VF: driver, IOMMU group and members, host names, and free, claimed (by which step) or unusable (which rule).\n" +
			"Checked against fake sysfs trees only: no SR-IOV adapter was at hand. Exit status 1 when a configured PF cannot be used.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the report as JSON"},
			&cli.StringSliceFlag{Name: "pf", Usage: "physical function to look at (PCI address, interface or RDMA device; default: network.sriov.pfs of the configuration)"},
			&cli.BoolFlag{Name: "allow-rebind", Usage: "judge VFs as a node with network.sriov.allow_rebind would (default: the configuration's)"},
			&cli.StringFlag{Name: "node", Usage: "Slurm node name whose claims to read (default: short host name)"},
			&cli.PathFlag{Name: "claim-dir", Usage: "the node's VF claim directory (default: <runtime_dir>/sriov-claims/<node>)"},
			&cli.PathFlag{Name: "sysfs-root", Aliases: []string{"sysfs"}, Value: "/sys", Usage: "where sysfs is mounted (a fake tree in tests)"},
			&cli.PathFlag{Name: "procfs-root", Value: "/proc", Usage: "where procfs is mounted"},
			&cli.PathFlag{Name: "dev-root", Value: "/dev", Usage: "where /dev is"},
		},
		Action: func(c *cli.Context) error {
			conf, err := loadConfig(c, true)
			if err != nil {
				return err
			}
			cfg, runtimeDir := conf.Network.SRIOV, conf.RuntimeDir
			if c.IsSet("pf") {
				cfg.PFs = c.StringSlice("pf")
			}
			if c.IsSet("allow-rebind") {
				cfg.AllowRebind = c.Bool("allow-rebind")
			}
			claimDir := c.String("claim-dir")
			if claimDir == "" {
				node := c.String("node")
				if node == "" {
					h, _ := os.Hostname()
					node, _, _ = strings.Cut(h, ".")
				}
				if runtimeDir == "" {
					runtimeDir = "/run/slurm-microvm"
				}
				claimDir = sriov.DefaultClaimDir(runtimeDir, node)
			}
			rep := sriov.Inspect(sriov.InspectRequest{
				Config: cfg, ClaimDir: claimDir,
				Roots: sriov.Roots{Sys: c.String("sysfs-root"), Proc: c.String("procfs-root"), Dev: c.String("dev-root")},
			})
			if c.Bool("json") {
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				printNICReport(c.App.Writer, rep)
			}
			if err := rep.Err(); err != nil {
				return cli.Exit("nics: "+err.Error(), 1)
			}
			return nil
		},
	}
}

func printNICReport(w io.Writer, rep *sriov.Report) {
	for _, h := range rep.Host {
		mark := "ok"
		if !h.OK {
			mark = "NO"
		}
		fmt.Fprintf(w, "host %-14s %-2s %s\n", h.Name, mark, h.Detail)
	}
	if rep.ConfigError != "" {
		fmt.Fprintf(w, "config: %s\n", rep.ConfigError)
	}
	if rep.NoPFs != "" {
		fmt.Fprintln(w, rep.NoPFs)
	}
	fmt.Fprintf(w, "claims: %s", rep.ClaimDir)
	if rep.ClaimError != "" {
		fmt.Fprintf(w, " (%s)", rep.ClaimError)
	}
	fmt.Fprintln(w)
	for _, pf := range rep.PFs {
		fmt.Fprintf(w, "PF %s", pf.Config)
		if pf.BDF != "" && pf.BDF != pf.Config {
			fmt.Fprintf(w, " = %s", pf.BDF)
		}
		if pf.Desc != "" {
			fmt.Fprintf(w, " %s, %d of %d VFs, netdevs [%s] rdma [%s]", pf.Desc, pf.NumVFs, pf.TotalVFs, strings.Join(pf.Netdevs, " "), strings.Join(pf.RDMA, " "))
		}
		fmt.Fprintln(w)
		if pf.Error != "" {
			fmt.Fprintf(w, "  unusable: %s\n", pf.Error)
		}
		for _, vf := range pf.VFs {
			state := vf.State
			switch {
			case vf.Claim != nil:
				state += " by " + vf.Claim.Owner
			case vf.Rebind:
				state += " (rebind to vfio-pci)"
			}
			fmt.Fprintf(w, "  vf %-2d %s driver %-9s group %-3d %s\n", vf.Index, vf.BDF, orNone(vf.Driver), vf.IOMMUGroup, state)
			if vf.Why != "" {
				fmt.Fprintf(w, "        %s\n", vf.Why)
			}
		}
	}
	fmt.Fprintf(w, "free VFs: %d\n", rep.Free)
}
