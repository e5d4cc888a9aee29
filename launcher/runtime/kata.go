package runtime

import (
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata"
)

// newKata returns the Kata driver (launcher/kata) of cfg's [kata].
func newKata(cfg *config.Config, _ Options) (driver.Driver, error) {
	k := cfg.Kata
	return kata.New(kata.Options{
		Mode: k.Mode, Shim: k.Shim, Configuration: k.Configuration,
		ContainerdAddress: k.ContainerdAddress, RuntimeHandler: k.RuntimeHandler,
		Namespace: k.Namespace, Init: cfg.QEMU.Agent,
		StopGrace: cfg.Timeouts.StopGrace.Duration,
	}), nil
}
