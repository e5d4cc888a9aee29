package gpu

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// Bounds of the waits in Bind and Release (a context deadline shortens them).
const (
	// bindWait bounds waiting for a driver change or /dev/vfio/<group>
	// (the kernel does both synchronously; udev may rename later).
	bindWait = 5 * time.Second
	// releaseWait bounds waiting for the step's processes to close the
	// VFIO groups after the VMM was told to stop.
	releaseWait = 10 * time.Second
)

// Bind moves every function the plan marked Rebind to vfio-pci, through
// sysfs as driverctl does: driver_override = vfio-pci, unbind from the
// current driver, drivers_probe. Before touching a GPU it checks again
// that NVML lists no process on it and that nobody holds /dev/nvidia<minor>.
// It then waits for each /dev/vfio/<group>. Idempotent: functions already
// on vfio-pci are left alone. On failure what was moved is moved back and
// the error names the device (ErrBusy, ErrVFIO, ErrRebind).
func (p *Plan) Bind(ctx context.Context) error {
	r := p.Roots
	var errs []error
	if p.NeedsBind() {
		if err := p.checkIdle(ctx); err != nil {
			return err
		}
		if _, err := os.Stat(r.SysPath("bus", "pci", "drivers", VFIODriver)); err != nil {
			return &DeviceError{Index: -1, Rule: ErrVFIO, Detail: "the vfio-pci driver is not loaded: modprobe vfio-pci", Err: err}
		}
		var done []*Function
		for gi := range p.GPUs {
			g := &p.GPUs[gi]
			for fi := range g.Functions {
				f := &g.Functions[fi]
				if !f.Rebind {
					continue
				}
				moved, err := p.toVFIO(ctx, g, f)
				if moved {
					done = append(done, f)
				}
				if err != nil {
					errs = append(errs, err)
					break
				}
			}
			if len(errs) > 0 {
				break
			}
		}
		if len(errs) > 0 {
			for i := len(done) - 1; i >= 0; i-- {
				if err := p.restore(ctx, nil, done[i]); err != nil {
					errs = append(errs, fmt.Errorf("undo: %w", err))
				}
			}
			return joinErrors("bind GPUs to vfio-pci", errs)
		}
	}
	for _, g := range p.GPUs {
		dev := r.DevPath(g.VFIOGroupFile)
		if !pci.Poll(ctx, bindWait, func() bool { _, err := os.Stat(dev); return err == nil }) {
			errs = append(errs, &DeviceError{Index: g.Index, File: g.File, BDF: g.BDF, Rule: ErrNoDevice,
				Detail: fmt.Sprintf("VFIO group device %s did not appear", g.VFIOGroupFile)})
		}
	}
	return joinErrors("bind GPUs to vfio-pci", errs)
}

// checkIdle refuses to rebind a GPU that NVML shows processes on or whose
// /dev/nvidia<minor> is open.
func (p *Plan) checkIdle(ctx context.Context) error {
	var devs []NVMLDevice
	if p.nvml != nil {
		devs, _ = p.nvml.Devices(ctx) // unavailable: the open-file scan still runs
	}
	var paths []string
	for _, g := range p.GPUs {
		if g.Minor >= 0 && g.Functions[0].Rebind {
			paths = append(paths, nvidiaDevFile(g.Minor))
		}
	}
	held, err := p.Roots.Holders(paths...)
	if err != nil {
		return fmt.Errorf("scan open device files: %w", err)
	}
	var errs []error
	for _, g := range p.GPUs {
		if !g.Functions[0].Rebind {
			continue
		}
		for _, d := range devs {
			if d.BDF == g.BDF && len(d.Processes) > 0 {
				var ps []string
				for _, pr := range d.Processes {
					ps = append(ps, fmt.Sprint(pr.PID))
				}
				errs = append(errs, &DeviceError{Index: g.Index, File: g.File, BDF: g.BDF, Rule: ErrBusy,
					Detail: "NVML lists processes running on it: pid " + strings.Join(ps, ", ")})
			}
		}
		if g.Minor >= 0 {
			if hs := held[nvidiaDevFile(g.Minor)]; len(hs) > 0 {
				errs = append(errs, &DeviceError{Index: g.Index, File: g.File, BDF: g.BDF, Rule: ErrBusy,
					Detail: fmt.Sprintf("%s is held open by %s", nvidiaDevFile(g.Minor), pci.HolderList(hs))})
			}
		}
	}
	return joinErrors("bind GPUs to vfio-pci", errs)
}

// toVFIO moves one function to vfio-pci (pci.ToVFIO). moved reports
// whether its driver was changed (so that a failure later can undo it).
func (p *Plan) toVFIO(ctx context.Context, g *GPU, f *Function) (moved bool, err error) {
	moved, err = pci.ToVFIO(ctx, p.Roots, p.write, f.BDF)
	if err != nil {
		return moved, &DeviceError{Index: g.Index, File: g.File, BDF: f.BDF, Rule: ErrRebind, Detail: err.Error()}
	}
	return moved, nil
}

// Release undoes the step's hold on its GPUs and checks that the next job
// can use them: it waits (up to 10 s or the context's deadline) until no
// process holds the plan's /dev/vfio/<group> files, moves every function
// the plan marked Rebind back to its planned driver, and verifies each
// GPU: back on its driver (and, for an nvidia GPU, listed again with the
// same device minor and /dev/nvidia<minor> opens), or, for a GPU that
// stays on vfio-pci, /dev/vfio/<group> opens. Works on a plan read back
// from JSON by a fresh process, whether or not Bind ran or finished;
// idempotent. Errors name the device and wrap ErrRelease (with ErrBusy
// when a process still holds it).
func (p *Plan) Release(ctx context.Context) error {
	r := p.Roots
	groups := p.VFIOGroupFiles()
	var held map[string][]Holder
	free := pci.Poll(ctx, releaseWait, func() bool {
		var err error
		held, err = r.Holders(groups...)
		return err == nil && len(held) == 0
	})
	if !free {
		var errs []error
		for _, g := range p.GPUs {
			if hs := held[g.VFIOGroupFile]; len(hs) > 0 {
				errs = append(errs, &DeviceError{Index: g.Index, File: g.File, BDF: g.BDF, Rule: ErrRelease,
					Detail: fmt.Sprintf("VFIO group %s is still held open by %s", g.VFIOGroupFile, pci.HolderList(hs)), Err: ErrBusy})
			}
		}
		if len(errs) > 0 {
			return joinErrors("release GPUs", errs)
		}
	}
	var errs []error
	for gi := range p.GPUs {
		g := &p.GPUs[gi]
		rebound := false
		for fi := len(g.Functions) - 1; fi >= 0; fi-- {
			f := &g.Functions[fi]
			if !f.Rebind {
				continue
			}
			rebound = true
			if err := p.restore(ctx, g, f); err != nil {
				errs = append(errs, err)
			}
		}
		if err := p.verifyReleased(ctx, g, rebound); err != nil {
			errs = append(errs, err)
		}
	}
	return joinErrors("release GPUs", errs)
}

// restore moves f from vfio-pci back to f.Driver ("" = leave unbound)
// and clears driver_override (pci.Restore). g may be nil (undo inside Bind).
func (p *Plan) restore(ctx context.Context, g *GPU, f *Function) error {
	idx, file := -1, ""
	if g != nil {
		idx, file = g.Index, g.File
	}
	if err := pci.Restore(ctx, p.Roots, p.write, f.BDF, f.Driver); err != nil {
		return &DeviceError{Index: idx, File: file, BDF: f.BDF, Rule: ErrRelease, Detail: err.Error()}
	}
	return nil
}

// verifyReleased checks that the next job can open g.
func (p *Plan) verifyReleased(ctx context.Context, g *GPU, rebound bool) error {
	r := p.Roots
	fail := func(format string, a ...any) error {
		return &DeviceError{Index: g.Index, File: g.File, BDF: g.BDF, Rule: ErrRelease, Detail: fmt.Sprintf(format, a...)}
	}
	gpuFn := g.Functions[0]
	for _, f := range g.Functions {
		if f.BDF == g.BDF {
			gpuFn = f
		}
	}
	if !rebound || gpuFn.Driver == VFIODriver {
		if err := pci.OpenClose(r.DevPath(g.VFIOGroupFile)); err != nil {
			return fail("VFIO group %s does not open: %v", g.VFIOGroupFile, err)
		}
		return nil
	}
	for _, f := range g.Functions {
		if d, _ := pci.LinkBase(r.DevicePath(f.BDF, "driver")); d != f.Driver {
			return fail("%s is bound to %q, not back on %q", f.BDF, d, or(f.Driver, "no driver"))
		}
	}
	if gpuFn.Driver != "nvidia" || g.Minor < 0 {
		return nil
	}
	var got int = -1
	if !pci.Poll(ctx, bindWait, func() bool {
		infos, _ := nvidiaGPUs(r)
		for _, in := range infos {
			if in.BDF == g.BDF {
				got = in.Minor
				return true
			}
		}
		return false
	}) {
		return fail("back on nvidia but not listed in %s", r.ProcPath("driver", "nvidia", "gpus"))
	}
	if got != g.Minor {
		return fail("back on nvidia with device minor %d, not %d: %s now names another GPU; restart slurmd's GPU mapping (reboot or rebind all GPUs)", got, g.Minor, g.File)
	}
	if err := pci.OpenClose(r.DevPath(nvidiaDevFile(g.Minor))); err != nil {
		return fail("%s does not open: %v", nvidiaDevFile(g.Minor), err)
	}
	return nil
}
