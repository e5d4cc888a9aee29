package qemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// Capabilities: passthrough under KVM only; every forward (PMI) the agent
// carries; the share limit of the machine type (MaxShares).
func (d *Driver) Capabilities() driver.Capabilities {
	c := driver.Capabilities{MaxShares: func(devices int) int { return MaxShares(devices > 0, devices) }}
	if d.o.Accel != "kvm" {
		c.Passthrough = d.noPassthrough()
	}
	return c
}

func (d *Driver) noPassthrough() string {
	return fmt.Sprintf("VFIO passthrough needs KVM, and QEMU runs under %s on this node (no kvm_intel or kvm_amd loaded)", d.o.Accel)
}

// Prepare finds or builds the guest kernel and initramfs (Options.Assets)
// unless Options.Kernel names them already. Errors name the asset.
func (d *Driver) Prepare(ctx context.Context, log *slog.Logger) error {
	if d.o.Kernel != "" || d.o.Assets == nil {
		return nil
	}
	o := *d.o.Assets
	o.Logger = log
	a, err := assets.Ensure(ctx, o)
	if err != nil {
		return fmt.Errorf("guest assets: %w", err)
	}
	d.o.Kernel, d.o.Initrd = a.Kernel, a.Initrd
	d.o.Cmdline = append(assets.KernelCmdline(d.o.Accel), d.o.Cmdline...)
	log.Info("guest assets", "kernel", a.KernelVersion, "accel", d.o.Accel)
	return nil
}

// Cleanup kills the VMM recorded in stateDir (state.VMMPidFile: pid and
// start time, so a reused pid is left alone) and gives the device files
// it had (vmm-devices.list) back to root. Errors: a VMM that survives
// SIGKILL for 5 s, a device file that cannot be given back.
func (d *Driver) Cleanup(ctx context.Context, stateDir string) error {
	vmm, err := state.ReadProc(filepath.Join(stateDir, state.VMMPidFile))
	if err == nil && vmm.Alive() {
		_ = vmm.Signal(unix.SIGKILL)
		deadline := time.Now().Add(5 * time.Second)
		for vmm.Alive() {
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("VMM pid %d survived SIGKILL", vmm.Pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	b, err := os.ReadFile(filepath.Join(stateDir, devicesFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the VMM's device files: %w", err)
	}
	return ReleaseDevices(strings.Fields(string(b)))
}
