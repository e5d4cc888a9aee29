package main

import (
	"fmt"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
)

func assetsCommand() *cli.Command {
	return &cli.Command{
		Name:  "assets",
		Usage: "build (once) the guest kernel and initramfs into the cache and print where they are",
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "agent", Usage: "guest agent binary (default: qemu.agent of the config)"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c, true)
			if err != nil {
				return err
			}
			personalize(cfg)
			agent := c.String("agent")
			if agent == "" {
				agent = cfg.QEMU.Agent
			}
			a, err := assets.Ensure(c.Context, assets.Options{
				KernelImage: cfg.QEMU.Kernel, Agent: agent,
				CacheDir: filepath.Join(cfg.CacheDir, "assets"),
			})
			if err != nil {
				return cli.Exit(fmt.Sprintf("assets: %v", err), 1)
			}
			fmt.Printf("kernel %s\nvmlinux %s\ninitrd %s\n", a.KernelVersion, a.Kernel, a.Initrd)
			return nil
		},
	}
}
