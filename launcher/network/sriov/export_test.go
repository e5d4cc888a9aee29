package sriov

import (
	"context"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// SetSysfsWriter makes p write sysfs attributes through w (a fake kernel
// in tests) instead of the files themselves.
func SetSysfsWriter(p *Plan, w func(path, value string) error) { p.write = w }

// GCWithWriter is GC writing sysfs through w.
var GCWithWriter = func(ctx context.Context, dir string, r Roots, stale func(Claim) bool, w func(path, value string) error) ([]string, error) {
	return gc(ctx, dir, r, stale, pci.Writer(w))
}
