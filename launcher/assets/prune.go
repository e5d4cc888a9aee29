package assets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// DefaultInUseGrace is how long after its last Ensure an entry counts as
// in use: the VMM reads the kernel and initramfs while it starts, after
// Ensure returned, and not after the guest booted. It is longer than the
// default boot timeout (timeouts.boot, 90 s) with room for the steps
// before the boot.
const DefaultInUseGrace = 15 * time.Minute

// PruneOptions bound the asset cache.
type PruneOptions struct {
	// MaxBytes bounds the cache: entries and extracted kernels together
	// (images.assets_cache_mib). Required (> 0).
	MaxBytes int64
	// InUseGrace: an entry used (Ensure) more recently is never removed
	// (DefaultInUseGrace when 0).
	InUseGrace time.Duration
	// DryRun reports what would go and removes nothing.
	DryRun bool
	// Logger receives a record per removed entry (discarded when nil).
	Logger *slog.Logger
	// Now is the clock (time.Now when nil); tests move it.
	Now func() time.Time
}

// PruneResult is what Prune removed: entry and kernel directory names,
// least recently used first, and the bytes freed.
type PruneResult struct {
	Removed    []string `json:"removed"`
	FreedBytes int64    `json:"freed_bytes"`
	UsedBytes  int64    `json:"used_bytes"`
	LimitBytes int64    `json:"limit_bytes"`
}

type assetEntry struct {
	name   string
	kernel string // the kernel directory it uses ("" for a kernel directory itself)
	used   time.Time
	bytes  int64
}

// Prune removes least recently used boot pairs (by the mtime of their
// manifest, which Ensure sets at every use) until cacheDir holds at most
// o.MaxBytes, then every extracted kernel that no remaining entry uses.
// An entry used within o.InUseGrace is never removed, nor is the most
// recently used one. It works under the cache's build lock, so no build
// runs meanwhile. A missing cache is empty.
func Prune(ctx context.Context, cacheDir string, o PruneOptions) (*PruneResult, error) {
	if o.MaxBytes <= 0 {
		return nil, errors.New("prune guest assets: no size limit given")
	}
	if o.InUseGrace <= 0 {
		o.InUseGrace = DefaultInUseGrace
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if cacheDir == "" {
		cacheDir = DefaultCacheDir
	}
	res := &PruneResult{LimitBytes: o.MaxBytes}
	if _, err := os.Lstat(cacheDir); errors.Is(err, fs.ErrNotExist) {
		return res, nil
	}
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, ".lock"))
	if err != nil {
		return nil, fmt.Errorf("prune guest assets: %w", err)
	}
	defer unlock()
	return prune(cacheDir, o, res)
}

// prune is Prune under the cache lock.
func prune(cacheDir string, o PruneOptions, res *PruneResult) (*PruneResult, error) {
	des, err := os.ReadDir(cacheDir)
	if err != nil {
		return nil, fmt.Errorf("prune guest assets: %w", err)
	}
	var entries []assetEntry
	kernels := map[string]int64{}
	for _, de := range des {
		if !de.IsDir() || strings.HasPrefix(de.Name(), ".") {
			continue
		}
		p := filepath.Join(cacheDir, de.Name())
		n := dirBytes(p)
		res.UsedBytes += n
		if strings.HasPrefix(de.Name(), kernelPrefix) {
			kernels[de.Name()] = n
			continue
		}
		e := assetEntry{name: de.Name(), bytes: n}
		if fi, err := os.Stat(filepath.Join(p, ManifestFile)); err == nil {
			e.used = fi.ModTime()
		}
		if b, err := os.ReadFile(filepath.Join(p, ManifestFile)); err == nil {
			var m manifest
			if json.Unmarshal(b, &m) == nil {
				e.kernel = m.KernelDir
			}
		}
		entries = append(entries, e)
	}
	sort.Slice(entries, func(i, j int) bool {
		if !entries[i].used.Equal(entries[j].used) {
			return entries[i].used.Before(entries[j].used)
		}
		return entries[i].name < entries[j].name
	})
	now := o.Now()
	var errs []error
	remove := func(name string, n int64) {
		if !o.DryRun {
			if err := os.RemoveAll(filepath.Join(cacheDir, name)); err != nil {
				errs = append(errs, fmt.Errorf("prune guest assets: %w", err))
				return
			}
		}
		res.Removed = append(res.Removed, name)
		res.FreedBytes += n
		res.UsedBytes -= n
		o.Logger.Info("pruned guest assets", "entry", name, "bytes", n, "dry_run", o.DryRun)
	}
	keptKernels := map[string]bool{}
	for i, e := range entries {
		newest := i == len(entries)-1
		if res.UsedBytes > o.MaxBytes && !newest && now.Sub(e.used) >= o.InUseGrace && !usedSince(cacheDir, e) {
			remove(e.name, e.bytes)
			continue
		}
		keptKernels[e.kernel] = true
	}
	if len(res.Removed) == 0 && res.UsedBytes <= o.MaxBytes {
		return res, nil
	}
	names := make([]string, 0, len(kernels))
	for k := range kernels {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fi, err := os.Stat(filepath.Join(cacheDir, k))
		if keptKernels[k] || err != nil || now.Sub(fi.ModTime()) < o.InUseGrace {
			continue // used, or being used by an entry about to be built
		}
		remove(k, kernels[k])
	}
	return res, errors.Join(errs...)
}

// usedSince reports whether an Ensure touched e after it was measured
// (Ensure's fast path takes no lock: it touches, then reads the entry).
func usedSince(cacheDir string, e assetEntry) bool {
	fi, err := os.Stat(filepath.Join(cacheDir, e.name, ManifestFile))
	return err == nil && fi.ModTime().After(e.used)
}

// dirBytes is the bytes of the regular files under p.
func dirBytes(p string) int64 {
	var n int64
	filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// touch records a use of the entry key: its manifest's mtime is the clock
// of Prune's least recently used order.
func touch(cacheDir, key string, log *slog.Logger) {
	now := time.Now()
	if err := os.Chtimes(filepath.Join(cacheDir, key, ManifestFile), now, now); err != nil {
		log.Debug("record the use of guest assets", "key", key, "err", err)
	}
}
