package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata/katacfg"
)

// kataCheckFlags size the step config check checks Kata's configuration
// for (runtime = "kata"); zero skips the rules that depend on the size.
var kataCheckFlags = []cli.Flag{
	&cli.IntFlag{Name: "kata-cpus", Usage: "with runtime = \"kata\": check for a step of this many CPUs (default_maxvcpus)"},
	&cli.Uint64Flag{Name: "kata-mem-mib", Usage: "with runtime = \"kata\": check for a guest of this many MiB (default_maxmemory, and that it fits /dev/shm or file_mem_backend now)"},
	&cli.IntFlag{Name: "kata-gpus", Usage: "with runtime = \"kata\": check for a step with this many GPU PCIe devices (cold_plug_vfio, pcie_root_port)"},
}

// checkKata loads the Kata configuration cfg names (Kata's search path
// when it names none), prints each problem katacfg.Check finds for the
// step the flags describe, or one ok line, and returns an error when
// there is a problem.
func checkKata(c *cli.Context, cfg *config.Config) error {
	w := c.App.Writer
	kc, err := katacfg.Load(cfg.Kata.Configuration)
	if err != nil {
		return fmt.Errorf("kata: %w", err)
	}
	need := katacfg.Need{
		CPUs:      c.Int("kata-cpus"),
		MemoryMiB: c.Uint64("kata-mem-mib"),
		GPUs:      c.Int("kata-gpus"),
		FreeMiB:   katacfg.StatfsFreeMiB,
	}
	ps := katacfg.Check(kc, need)
	for _, p := range ps {
		fmt.Fprintf(w, "kata: %s\n", p)
	}
	if len(ps) > 0 {
		return fmt.Errorf("kata: %s: %d problem(s) above", kc.Path, len(ps))
	}
	summary := kc.Summary()
	if dir, _ := kc.MemoryBackingDir(); dir != "" {
		if free, err := katacfg.StatfsFreeMiB(dir); err == nil {
			summary += fmt.Sprintf(" (%d MiB free: the largest guest that fits now)", free)
		} else {
			summary += fmt.Sprintf(" (%v)", err)
		}
	}
	fmt.Fprintf(w, "kata: %s: ok (%s)\n", kc.Path, summary)
	return nil
}
