package bench

import (
	"context"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
)

// benchDriver finds (or builds, in cacheDir) the guest kernel and
// initramfs with agent, records the run's accelerator and kernel in the
// report, and returns a QEMU driver that boots them as the product does
// (its kernel command line, seccomp), outside Slurm.
func benchDriver(ctx context.Context, b *testing.B, agent, cacheDir string) (*qemu.Driver, *assets.Assets, string) {
	b.Helper()
	accel := qemu.DetectAccel()
	a, err := assets.Ensure(ctx, assets.Options{Agent: agent, CacheDir: cacheDir})
	if err != nil {
		b.Fatal(err)
	}
	report.Environment(accel, a.KernelVersion)
	d := qemu.New(qemu.Options{
		Binary: "qemu-system-x86_64", Accel: accel, Kernel: a.Kernel, Initrd: a.Initrd,
		Cmdline: assets.KernelCmdline(accel), Seccomp: true, PinTCG: true,
		BootTimeout: 2 * time.Minute, StopGrace: 5 * time.Second,
	})
	return d, a, accel
}
