package main

import (
	"fmt"
	"os"
	"os/exec"

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

// kataNode is what a step's start needs on this node besides Kata's
// configuration: the shim (mode shim), containerd's socket (mode
// containerd), the directory holding the guest's RAM.
func kataNode(cfg *config.Config, kc *katacfg.Config) []string {
	var ps []string
	switch cfg.Kata.Mode {
	case "shim":
		if _, err := exec.LookPath(cfg.Kata.Shim); err != nil {
			ps = append(ps, fmt.Sprintf("kata.shim: %q: %v; install Kata Containers' containerd-shim-kata-v2, or set kata.shim to it", cfg.Kata.Shim, err))
		}
	case "containerd":
		if st, err := os.Stat(cfg.Kata.ContainerdAddress); err != nil {
			ps = append(ps, fmt.Sprintf("kata.containerd_address: %v; start containerd, or set kata.containerd_address to its socket", err))
		} else if st.Mode()&os.ModeSocket == 0 {
			ps = append(ps, fmt.Sprintf("kata.containerd_address: %q is not a socket", cfg.Kata.ContainerdAddress))
		}
	}
	if dir, key := kc.MemoryBackingDir(); dir != "" {
		if _, err := katacfg.StatfsFreeMiB(dir); err != nil {
			ps = append(ps, fmt.Sprintf("%s: %s: the guest's RAM is kept in %s: %v; create it, or change %s", kc.Path, key, dir, err, key))
		}
	}
	return ps
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
	var ps []string
	for _, p := range katacfg.Check(kc, need) {
		ps = append(ps, p.String())
	}
	ps = append(ps, kataNode(cfg, kc)...)
	for _, p := range ps {
		fmt.Fprintf(w, "kata: %s\n", p)
	}
	if len(ps) > 0 {
		return fmt.Errorf("kata: %s: %d problem(s) above", kc.Path, len(ps))
	}
	if cfg.Network.Mode == "step" {
		fmt.Fprintf(w, "kata: note: [network] mode = \"step\": a step on several nodes is refused under kata (the step network is not carried); one-node steps get loopback only. Set mode = \"none\" to say so\n")
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
