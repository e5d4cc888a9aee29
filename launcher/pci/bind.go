package pci

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"
)

// BindWait bounds waiting for a driver change or /dev/vfio/<group> (the
// kernel does both synchronously; udev may rename later). A context
// deadline shortens it.
const BindWait = 5 * time.Second

// Writer writes one sysfs attribute. nil writes the file itself
// (WriteAttr); tests pass a fake kernel.
type Writer func(path, value string) error

// WriteAttr writes value to the sysfs attribute path through w, or
// directly when w is nil.
func WriteAttr(w Writer, path, value string) error {
	if w != nil {
		return w(path, value)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", strings.TrimSpace(value), path, err)
	}
	return nil
}

// ToVFIO moves the function at bdf to vfio-pci as driverctl does:
// driver_override = vfio-pci, unbind from the current driver,
// drivers_probe, then waits (BindWait) for the driver link. moved reports
// whether its driver was changed, so that a later failure can undo it
// (Restore). A function already on vfio-pci is left alone. The error
// says which write failed ("unbind from mlx5_core: ..."); callers wrap it
// with their device and rule. Deciding whether a function may be moved
// at all is the caller's (allow_rebind).
func ToVFIO(ctx context.Context, r Roots, w Writer, bdf string) (moved bool, err error) {
	cur, err := LinkBase(r.DevicePath(bdf, "driver"))
	if err != nil {
		return false, fmt.Errorf("read driver: %v", err)
	}
	if cur == VFIODriver {
		return false, nil
	}
	if err := WriteAttr(w, r.DevicePath(bdf, "driver_override"), VFIODriver); err != nil {
		return false, fmt.Errorf("set driver_override: %v", err)
	}
	if cur != "" {
		if err := WriteAttr(w, r.SysPath("bus", "pci", "drivers", cur, "unbind"), bdf); err != nil {
			_ = WriteAttr(w, r.DevicePath(bdf, "driver_override"), "\n")
			return false, fmt.Errorf("unbind from %s: %v", cur, err)
		}
	}
	moved = true
	if err := WriteAttr(w, r.SysPath("bus", "pci", "drivers_probe"), bdf); err != nil {
		return moved, fmt.Errorf("probe with driver_override=%s: %v", VFIODriver, err)
	}
	if !Poll(ctx, BindWait, func() bool { d, _ := LinkBase(r.DevicePath(bdf, "driver")); return d == VFIODriver }) {
		d, _ := LinkBase(r.DevicePath(bdf, "driver"))
		return moved, fmt.Errorf("still bound to %q after probing with driver_override=%s", d, VFIODriver)
	}
	return moved, nil
}

// Restore moves the function at bdf from vfio-pci back to driver ("" =
// leave it unbound) and clears driver_override; it binds explicitly
// (drivers_probe might pick another driver). A function on a third
// driver is left alone (error). Idempotent: a function already on driver
// with no override is not written to. The error says which step failed;
// callers wrap it with their device and rule.
func Restore(ctx context.Context, r Roots, w Writer, bdf, driver string) error {
	cur, err := LinkBase(r.DevicePath(bdf, "driver"))
	if err != nil {
		return fmt.Errorf("read driver: %v", err)
	}
	if ov, err := os.ReadFile(r.DevicePath(bdf, "driver_override")); err == nil {
		if s := strings.TrimSpace(string(ov)); s != "" && s != "(null)" {
			if err := WriteAttr(w, r.DevicePath(bdf, "driver_override"), "\n"); err != nil {
				return fmt.Errorf("clear driver_override: %v", err)
			}
		}
	}
	if cur == driver {
		return nil
	}
	if cur == VFIODriver {
		if err := WriteAttr(w, r.SysPath("bus", "pci", "drivers", VFIODriver, "unbind"), bdf); err != nil {
			return fmt.Errorf("unbind from %s: %v", VFIODriver, err)
		}
		cur = ""
	}
	if cur != "" {
		return fmt.Errorf("bound to %s, expected %s or %s: left alone", cur, VFIODriver, or(driver, "no driver"))
	}
	if driver == "" {
		return nil
	}
	if err := WriteAttr(w, r.SysPath("bus", "pci", "drivers", driver, "bind"), bdf); err != nil {
		return fmt.Errorf("bind back to %s: %v", driver, err)
	}
	if !Poll(ctx, BindWait, func() bool { d, _ := LinkBase(r.DevicePath(bdf, "driver")); return d == driver }) {
		d, _ := LinkBase(r.DevicePath(bdf, "driver"))
		return fmt.Errorf("bound to %q after binding it back to %s", d, driver)
	}
	return nil
}

// OpenClose opens path read-write and closes it (does the device open?).
func OpenClose(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// Poll calls cond every 20 ms until it holds, limit passes or ctx ends;
// it reports whether cond held.
func Poll(ctx context.Context, limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}
