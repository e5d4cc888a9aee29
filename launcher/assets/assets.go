package assets

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
	"github.com/slurm-microvm/slurm-microvm/launcher/flock"
)

// DefaultCacheDir is where Ensure keeps built boot pairs when Options sets none.
const DefaultCacheDir = "/var/cache/slurm-microvm/assets"

// Defaults for where the host's kernels live.
const (
	DefaultBootDir     = "/boot"
	DefaultModulesRoot = "/lib/modules"
)

// Cache layout: <CacheDir>/kernel-<sha256 of the bzImage>/vmlinux is shared
// by every entry of that kernel; <CacheDir>/<Key>/ holds one initramfs and
// its manifest.
const (
	KernelFile   = "vmlinux"
	InitrdFile   = "initrd.img"
	ManifestFile = "manifest.json"
	kernelPrefix = "kernel-"
)

// formatVersion changes whenever the layout or content rules of a cache
// entry change, so old entries are not reused.
const formatVersion = "slurm-microvm-assets/4"

// Options say what to build the guest boot pair from.
type Options struct {
	// KernelImage is a bzImage; "" means the newest /boot/vmlinuz-* that has
	// a /lib/modules directory.
	KernelImage string
	// Agent is the static binary that becomes /init. Required.
	Agent string
	// Modules to pack with their dependencies; nil means DefaultModules.
	Modules []string
	// Required modules: a requested module in this list that the kernel does
	// not have is an error; nil means RequiredModules.
	Required []string
	// CacheDir holds built pairs; "" means DefaultCacheDir.
	CacheDir string
	// CacheBytes bounds CacheDir (images.assets_cache_mib): after a build,
	// Ensure prunes the least recently used entries (Prune). 0: no bound.
	CacheBytes int64
	// ModulesRoot is where /lib/modules/<release> lives; "" means DefaultModulesRoot.
	ModulesRoot string
	// Compression of the initramfs; "" means DefaultInitrdCompression.
	Compression InitrdCompression
	// KeepModuleSignatures packs the .ko files as they are. By default the
	// appended signatures are dropped (about 120 ms less boot under TCG; the
	// guest kernel is tainted "E"), unless the kernel's config enforces them.
	KeepModuleSignatures bool
	// Logger gets build progress and skipped modules; nil discards.
	Logger *slog.Logger
}

// Assets is a built, cached guest boot pair. Files are world-readable
// (QEMU runs as the job's user) and must not be modified.
type Assets struct {
	KernelVersion string // e.g. "6.1.0-57-amd64"
	Kernel        string // uncompressed vmlinux (ELF), for QEMU -kernel
	Initrd        string // newc cpio initramfs, for QEMU -initrd
	Key           string // hex SHA-256 of every input; the cache directory's name
	Compression   InitrdCompression
	Modules       []guestmod.Entry // load order packed into the initramfs
}

// manifest is ManifestFile: what an entry was built from, for people and
// for reading Assets back from the cache.
type manifest struct {
	Format        string            `json:"format"`
	KernelVersion string            `json:"kernel_version"`
	KernelImage   string            `json:"kernel_image"`
	KernelDir     string            `json:"kernel_dir"` // relative to the cache directory
	Compression   string            `json:"kernel_compression"`
	Signatures    string            `json:"module_signatures"` // "kept" or "stripped"
	Agent         string            `json:"agent"`
	Initrd        InitrdCompression `json:"initrd_compression"`
	Requested     []string          `json:"requested_modules"`
	Modules       []guestmod.Entry  `json:"modules"`
	Built         time.Time         `json:"built"`
	InitrdMillis  int64             `json:"initrd_ms"`
}

// Ensure returns the boot pair for o, building it once when the cache has
// no entry for it. The key is a SHA-256 over the kernel image's bytes, the
// agent's bytes, the module lists, the initramfs options, modules.dep and
// modules.softdep, and the cache format, so a new kernel, agent or module
// list gets a new entry; the vmlinux is extracted once per kernel image and
// shared. Concurrent callers (in one process or many) build once: the
// builder holds an exclusive flock on <CacheDir>/.lock, builds in a
// temporary directory and renames it into place; the others wait for the
// lock (or ctx) and then find the entry. Every call records the entry's
// use (its manifest's mtime); with o.CacheBytes set, a build prunes the
// least recently used entries past it (Prune).
func Ensure(ctx context.Context, o Options) (*Assets, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	bz, err := ReadBzImage(o.KernelImage)
	if err != nil {
		return nil, fmt.Errorf("guest assets: %w", err)
	}
	if bz.Version == "" {
		bz.Version = strings.TrimPrefix(filepath.Base(o.KernelImage), "vmlinuz-")
	}
	modDir := filepath.Join(o.ModulesRoot, bz.Version)
	kernelHash, err := fileSHA256(o.KernelImage)
	if err != nil {
		return nil, fmt.Errorf("guest assets: %w", err)
	}
	strip := !o.KeepModuleSignatures
	if strip {
		if forced, why := moduleSigForced(filepath.Dir(o.KernelImage), bz.Version); forced {
			o.Logger.Debug("keeping module signatures", "reason", why)
			strip = false
		}
	}
	key, err := cacheKey(o, kernelHash, modDir, strip)
	if err != nil {
		return nil, fmt.Errorf("guest assets: %w", err)
	}
	log := o.Logger.With("key", key[:12], "kernel", bz.Version)
	dir := filepath.Join(o.CacheDir, key)
	// The use is recorded first, so a concurrent Prune sees it before it
	// removes the entry (Prune's least recently used clock).
	touch(o.CacheDir, key, log)
	if a, err := readEntry(o.CacheDir, key); err == nil {
		log.Debug("guest assets cached", "dir", dir)
		return a, nil
	}

	if err := mkdirAllReadable(o.CacheDir); err != nil {
		return nil, fmt.Errorf("guest assets: cache: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(o.CacheDir, ".lock"))
	if err != nil {
		return nil, fmt.Errorf("guest assets: %w", err)
	}
	defer unlock()
	if a, err := readEntry(o.CacheDir, key); err == nil { // built while we waited
		return a, nil
	} else if _, serr := os.Lstat(dir); serr == nil {
		log.Warn("guest assets cache entry unusable, rebuilding", "dir", dir, "err", err)
		if err := os.RemoveAll(dir); err != nil {
			return nil, fmt.Errorf("guest assets: remove broken cache entry: %w", err)
		}
	}
	// Every builder holds the lock, so leftovers are from a builder that died.
	olds, _ := filepath.Glob(filepath.Join(o.CacheDir, ".tmp-*"))
	for _, p := range olds {
		os.RemoveAll(p)
	}

	kdir := kernelPrefix + kernelHash[:32]
	if err := ensureKernel(ctx, o.CacheDir, kdir, bz, log); err != nil {
		return nil, fmt.Errorf("guest assets for kernel %s: %w", bz.Version, err)
	}
	err = publish(o.CacheDir, key, func(tmp string) error {
		return buildInitrd(ctx, o, bz, kdir, modDir, strip, tmp, log)
	})
	if err != nil {
		return nil, fmt.Errorf("guest assets for kernel %s: %w", bz.Version, err)
	}
	if o.CacheBytes > 0 {
		// The entry just built is the most recently used: Prune keeps it.
		if r, err := prune(o.CacheDir, PruneOptions{MaxBytes: o.CacheBytes, InUseGrace: DefaultInUseGrace, Logger: log, Now: time.Now}, &PruneResult{LimitBytes: o.CacheBytes}); err != nil {
			log.Warn("prune guest assets", "err", err)
		} else if len(r.Removed) > 0 {
			log.Info("pruned guest assets", "entries", r.Removed, "freed_bytes", r.FreedBytes)
		}
	}
	return readEntry(o.CacheDir, key)
}

// publish runs fill on a fresh temporary directory in cacheDir and renames it
// to cacheDir/name. The caller holds the cache lock.
func publish(cacheDir, name string, fill func(tmp string) error) error {
	tmp, err := os.MkdirTemp(cacheDir, ".tmp-"+name[:min(len(name), 20)]+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // nothing left after the rename
	if err := fill(tmp); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(cacheDir, name)); err != nil {
		return fmt.Errorf("publish cache entry: %w", err)
	}
	if d, err := os.Open(cacheDir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// ensureKernel extracts bz into cacheDir/kdir/vmlinux unless it is there.
func ensureKernel(ctx context.Context, cacheDir, kdir string, bz *BzImage, log *slog.Logger) error {
	if st, err := os.Stat(filepath.Join(cacheDir, kdir, KernelFile)); err == nil && st.Size() > 0 {
		return nil
	}
	os.RemoveAll(filepath.Join(cacheDir, kdir))
	return publish(cacheDir, kdir, func(tmp string) error {
		start := time.Now()
		if err := ExtractVmlinux(ctx, bz, filepath.Join(tmp, KernelFile)); err != nil {
			return err
		}
		log.Info("extracted guest kernel", "image", bz.Path, "compression", bz.Compression,
			"ms", time.Since(start).Milliseconds(), "dir", filepath.Join(cacheDir, kdir))
		return nil
	})
}

func (o Options) withDefaults() (Options, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Agent == "" {
		return o, errors.New("guest assets: no agent binary given")
	}
	if o.ModulesRoot == "" {
		o.ModulesRoot = DefaultModulesRoot
	}
	if o.KernelImage == "" {
		k, err := NewestKernel(DefaultBootDir, o.ModulesRoot)
		if err != nil {
			return o, fmt.Errorf("guest assets: %w", err)
		}
		o.KernelImage = k
	}
	if o.Modules == nil {
		o.Modules = DefaultModules
	}
	if o.Required == nil {
		o.Required = RequiredModules
	}
	if o.CacheDir == "" {
		o.CacheDir = DefaultCacheDir
	}
	if o.Compression == "" {
		o.Compression = DefaultInitrdCompression
	}
	return o, nil
}

// cacheKey hashes every input of an initramfs build and the kernel's hash.
func cacheKey(o Options, kernelHash, modDir string, strip bool) (string, error) {
	h := sha256.New()
	field := func(k, v string) { fmt.Fprintf(h, "%s=%q\n", k, v) }
	file := func(k, p string, optional bool) error {
		sum, err := fileSHA256(p)
		if err != nil {
			if optional && errors.Is(err, os.ErrNotExist) {
				sum = "absent"
			} else {
				return fmt.Errorf("cache key: %w", err)
			}
		}
		field(k, sum)
		return nil
	}
	field("format", formatVersion)
	field("kernel", kernelHash)
	field("initrd", string(o.Compression))
	field("strip-signatures", fmt.Sprint(strip))
	field("modules", strings.Join(normNames(o.Modules), " "))
	field("required", strings.Join(normNames(o.Required), " "))
	if err := file("agent", o.Agent, false); err != nil {
		return "", err
	}
	if err := file("modules.dep", filepath.Join(modDir, "modules.dep"), false); err != nil {
		return "", fmt.Errorf("%w (is the kernel's module package installed?)", err)
	}
	if err := file("modules.softdep", filepath.Join(modDir, "modules.softdep"), true); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// fileSHA256 returns the hex SHA-256 of the file at p.
func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func normNames(in []string) []string {
	out := make([]string, 0, len(in))
	for _, s := range in {
		out = append(out, guestmod.ModuleName(s))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// buildInitrd writes InitrdFile and ManifestFile into dir.
func buildInitrd(ctx context.Context, o Options, bz *BzImage, kdir, modDir string, strip bool, dir string, log *slog.Logger) error {
	m := manifest{
		Format: formatVersion, KernelVersion: bz.Version, KernelImage: o.KernelImage, KernelDir: kdir,
		Compression: string(bz.Compression), Agent: o.Agent, Initrd: o.Compression,
		Requested: o.Modules, Built: time.Now().UTC(), Signatures: "kept",
	}
	if strip {
		m.Signatures = "stripped"
	}
	ix, err := LoadModuleIndex(modDir)
	if err != nil {
		return err
	}
	entries, err := ix.Resolve(o.Modules, o.Required, log)
	if err != nil {
		return err
	}
	// Mark what the guest loads at boot: the closure of the required set.
	boot, err := ix.Resolve(o.Required, o.Required, log)
	if err != nil {
		return err
	}
	bootSet := map[string]bool{}
	for _, e := range boot {
		bootSet[e.Path] = true
	}
	// And what host shares need, when the kernel has it (optional).
	shareSet := map[string]bool{}
	if share, err := ix.Resolve(ShareModules, nil, log); err == nil {
		for _, e := range share {
			shareSet[e.Path] = true
		}
	}
	// And what the network device needs (optional too).
	netSet := map[string]bool{}
	if nm, err := ix.Resolve(NetModules, nil, log); err == nil {
		for _, e := range nm {
			netSet[e.Path] = true
		}
	}
	for i := range entries {
		entries[i].Boot = bootSet[entries[i].Path]
		entries[i].Share = shareSet[entries[i].Path]
		entries[i].Net = netSet[entries[i].Path]
	}
	if err := checkStatic(o.Agent); err != nil {
		return err
	}
	start := time.Now()
	f, err := os.OpenFile(filepath.Join(dir, InitrdFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	m.Modules, err = writeInitramfs(ctx, f, o.Compression, initramfsSpec{
		Agent: o.Agent, Release: bz.Version, ModDir: modDir, Modules: entries, StripSignatures: strip,
	})
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	m.InitrdMillis = time.Since(start).Milliseconds()
	st, _ := os.Stat(filepath.Join(dir, InitrdFile))
	log.Info("built guest initramfs", "ms", m.InitrdMillis, "bytes", st.Size(), "compression", o.Compression, "modules", len(m.Modules))
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ManifestFile), append(b, '\n'), 0o644); err != nil {
		return err
	}
	// QEMU runs as the job's user: whatever the umask, the pair is readable.
	for _, n := range []string{InitrdFile, ManifestFile} {
		if err := os.Chmod(filepath.Join(dir, n), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// mkdirAllReadable is os.MkdirAll with every directory it creates made 0755
// regardless of the umask.
func mkdirAllReadable(p string) error {
	p = filepath.Clean(p)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	if parent := filepath.Dir(p); parent != p {
		if err := mkdirAllReadable(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return os.Chmod(p, 0o755)
}

// checkStatic refuses an agent that is not a static executable: as /init in
// an initramfs without a dynamic loader it would fail with ENOENT and the
// kernel would panic with a misleading message.
func checkStatic(p string) error {
	interp, err := elfInterpreter(p)
	if err != nil {
		return fmt.Errorf("agent %s: %w", p, err)
	}
	if interp != "" {
		return fmt.Errorf("agent %s is dynamically linked (interpreter %s); build it with CGO_ENABLED=0", p, interp)
	}
	return nil
}

// readEntry reads back a complete cache entry; an error wrapping
// os.ErrNotExist means there is none.
func readEntry(cacheDir, key string) (*Assets, error) {
	dir := filepath.Join(cacheDir, key)
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, err
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("cache entry %s: manifest: %w", dir, err)
	}
	if m.Format != formatVersion || !strings.HasPrefix(m.KernelDir, kernelPrefix) || strings.ContainsAny(m.KernelDir, "/\x00") {
		return nil, fmt.Errorf("cache entry %s: manifest format %q, kernel dir %q: not written by this version", dir, m.Format, m.KernelDir)
	}
	a := &Assets{
		KernelVersion: m.KernelVersion, Kernel: filepath.Join(cacheDir, m.KernelDir, KernelFile),
		Initrd: filepath.Join(dir, InitrdFile), Key: key, Compression: m.Initrd, Modules: m.Modules,
	}
	for _, p := range []string{a.Kernel, a.Initrd} {
		if st, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("cache entry %s: %w", dir, err)
		} else if st.Size() == 0 {
			return nil, fmt.Errorf("cache entry %s: %s is empty", dir, p)
		}
	}
	return a, nil
}

// lockFile takes the cache's build lock (package flock).
func lockFile(ctx context.Context, p string) (func(), error) {
	return flock.Exclusive(ctx, p, "another build")
}
