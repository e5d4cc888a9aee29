package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/flock"
)

// ErrPruned is returned (wrapped) by Use for a disk that a prune removed
// between Prepare and Use: prepare it again (Hold does).
var ErrPruned = errors.New("the cached disk was pruned before it could be taken; prepare it again")

// Use marks img's disk in use until release is called: it holds a shared
// flock(2) on the disk, which Prune (an exclusive, non-blocking flock)
// respects, and sets the disk's mtime to now, the clock Prune's least
// recently used order reads. The launcher holds it for the life of the
// step. It waits, polling, while a pruner holds the disk, until ctx ends.
// A disk removed before Use took it is an error wrapping ErrPruned.
func Use(ctx context.Context, img *Image) (release func(), err error) {
	f, err := os.OpenFile(img.Disk, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("use image disk %s: %w", img.Disk, ErrPruned)
	}
	if err != nil {
		return nil, fmt.Errorf("use image disk %s: %w", img.Disk, err)
	}
	if err := flock.Wait(ctx, f, unix.LOCK_SH); err != nil {
		f.Close()
		if errors.Is(err, ctx.Err()) {
			return nil, fmt.Errorf("use image disk %s: waiting for a prune: %w", img.Disk, err)
		}
		return nil, fmt.Errorf("use image disk %s: lock: %w", img.Disk, err)
	}
	same, err := sameFile(f, img.Disk)
	if err != nil || !same {
		f.Close()
		if err == nil {
			err = ErrPruned
		}
		return nil, fmt.Errorf("use image disk %s: %w", img.Disk, err)
	}
	now := time.Now()
	if err := os.Chtimes(img.Disk, now, now); err != nil {
		f.Close()
		return nil, fmt.Errorf("use image disk %s: record the use: %w", img.Disk, err)
	}
	var once sync.Once
	return func() { once.Do(func() { f.Close() }) }, nil
}

// Hold is Prepare followed by Use: the disk of ref for o.UID, held in use
// until release is called. A disk pruned between the two is prepared
// again, once.
func Hold(ctx context.Context, ref string, o Options) (img *Image, release func(), err error) {
	for try := 0; ; try++ {
		img, err = Prepare(ctx, ref, o)
		if err != nil {
			return nil, nil, err
		}
		release, err = Use(ctx, img)
		if err == nil {
			return img, release, nil
		}
		if !errors.Is(err, ErrPruned) || try > 0 {
			return nil, nil, err
		}
	}
}

// PruneOptions say which images Prune may remove and to what limits.
type PruneOptions struct {
	// UID is the user whose images may be removed, unless All is set:
	// then every user's may.
	UID uint32
	All bool
	// Limits: UserCacheBytes bounds each user's images, CacheBytes all
	// users' together (DefaultLimits() for zero fields).
	Limits Limits
	// MaxRemove bounds the images one call removes (0: no bound), so that
	// a prune in the epilog ends promptly.
	MaxRemove int
	// DryRun reports what would be removed and removes nothing.
	DryRun bool
	// Logger receives a record per removed image (discarded when nil).
	Logger *slog.Logger

	// Set by Prepare: the digest hex of the conversion in progress (never
	// removed) and the bytes it is expected to add to its user's cache.
	keep string
	need int64
}

// PruneResult is what Prune did.
type PruneResult struct {
	// Removed are the images removed (DryRun: that would be), least
	// recently used first.
	Removed []Entry `json:"removed"`
	// FreedBytes are the bytes of their disks and metadata.
	FreedBytes int64 `json:"freed_bytes"`
	// InUse are images past a limit that were kept because a running
	// step holds them (Use) or a conversion or removal holds their lock.
	InUse []Entry `json:"in_use,omitempty"`
	// UsedBytes is the whole cache (every user) after the prune.
	UsedBytes int64 `json:"used_bytes"`
	// LimitBytes is Limits.CacheBytes.
	LimitBytes int64 `json:"limit_bytes"`
}

// usage is what the cache's images take: per user and in all.
type usage struct {
	user  map[uint32]int64
	total int64
}

// entryBytes are the bytes an entry takes: its disk and its metadata.
func entryBytes(e Entry) int64 {
	n := e.Size
	if fi, err := os.Lstat(strings.TrimSuffix(e.Disk, diskSuffix) + metaSuffix); err == nil {
		n += fi.Size()
	}
	return n
}

// Usage returns the bytes of every user's converted images in cacheRoot
// (disks and metadata, not conversions in progress). A missing cache is 0.
func Usage(cacheRoot string) (int64, error) {
	es, err := List(cacheRoot, 0, true)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range es {
		n += entryBytes(e)
	}
	return n, nil
}

// OverLimit reports whether cacheRoot holds more than one of lim's cache
// limits allows (a user's images past UserCacheBytes, or all past
// CacheBytes): what the epilog checks before it prunes.
func OverLimit(cacheRoot string, lim Limits) (bool, error) {
	lim = lim.withDefaults()
	es, err := List(cacheRoot, 0, true)
	if err != nil {
		return false, err
	}
	u := measure(es)
	if u.total > lim.CacheBytes {
		return true, nil
	}
	for _, n := range u.user {
		if n > lim.UserCacheBytes {
			return true, nil
		}
	}
	return false, nil
}

func measure(es []Entry) usage {
	u := usage{user: map[uint32]int64{}}
	for _, e := range es {
		n := entryBytes(e)
		u.user[e.UID] += n
		u.total += n
	}
	return u
}

// Prune removes least recently used images (by the disk's mtime, which
// Use sets at every step start and a conversion at its commit) until each
// user in scope is within Limits.UserCacheBytes and the whole cache within
// Limits.CacheBytes, taking only images of the users in scope (o.UID, or
// everyone with o.All). It never removes an image that a running step
// holds (Use's shared flock on the disk) or whose digest lock a
// conversion or removal holds: those are listed in InUse and the cache
// may stay over its limit. Empty per-user directories go too. A missing
// cache is empty. Errors removing one image are joined; the others are
// still tried.
func Prune(ctx context.Context, cacheRoot string, o PruneOptions) (*PruneResult, error) {
	if cacheRoot == "" {
		cacheRoot = DefaultCacheRoot
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Limits = o.Limits.withDefaults()
	es, err := List(cacheRoot, 0, true)
	if err != nil {
		return nil, fmt.Errorf("prune image cache: %w", err)
	}
	u := measure(es)
	res := &PruneResult{LimitBytes: o.Limits.CacheBytes}
	sort.SliceStable(es, func(i, j int) bool {
		if !es[i].LastUsed.Equal(es[j].LastUsed) {
			return es[i].LastUsed.Before(es[j].LastUsed)
		}
		return es[i].Digest < es[j].Digest
	})
	done := map[int]bool{}
	inUse := map[int]bool{}
	var errs []error
	userTarget := o.Limits.UserCacheBytes
	totalTarget := o.Limits.CacheBytes
	over := []func(Entry) bool{
		func(e Entry) bool {
			t := userTarget
			if e.UID == o.UID {
				t -= o.need
			}
			return u.user[e.UID] > t
		},
		func(Entry) bool { return u.total > totalTarget-o.need },
	}
	for _, past := range over {
		for i, e := range es {
			if done[i] || inUse[i] || !(o.All || e.UID == o.UID) || !past(e) {
				continue
			}
			if o.MaxRemove > 0 && len(res.Removed) >= o.MaxRemove {
				break
			}
			if err := ctx.Err(); err != nil {
				return res, err
			}
			if o.keep != "" && e.UID == o.UID && strings.TrimPrefix(e.Digest, "sha256:") == o.keep {
				continue
			}
			n := entryBytes(e)
			removed, gone, err := pruneEntry(e, o.DryRun)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if gone {
				done[i] = true
				u.user[e.UID] -= n
				u.total -= n
				continue
			}
			if !removed {
				inUse[i] = true
				res.InUse = append(res.InUse, e)
				continue
			}
			done[i] = true
			u.user[e.UID] -= n
			u.total -= n
			res.Removed = append(res.Removed, e)
			res.FreedBytes += n
			o.Logger.Info("pruned image", "uid", e.UID, "digest", e.Digest, "ref", e.Ref, "bytes", n,
				"last_used", e.LastUsed.UTC().Format(time.RFC3339), "dry_run", o.DryRun)
		}
	}
	res.UsedBytes = u.total
	return res, errors.Join(errs...)
}

// pruneEntry removes e unless it is in use; removed is false for an image
// in use; gone is true for one removed meanwhile (by `image rm`). With dryRun it
// only checks.
func pruneEntry(e Entry, dryRun bool) (removed, gone bool, err error) {
	dir := filepath.Dir(e.Disk)
	h := strings.TrimPrefix(e.Digest, "sha256:")
	lk, held, err := tryLockDigest(dir, h)
	if err != nil {
		return false, false, fmt.Errorf("prune image %s of uid %d: %w", e.Digest, e.UID, err)
	}
	if held {
		return false, false, nil // a conversion or removal of it
	}
	f, err := os.OpenFile(e.Disk, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		// Removed meanwhile (by `image rm`): nothing to do, nothing held.
		return false, true, unlockDigest(lk, dir, h)
	}
	if err != nil {
		lk.unlock()
		return false, false, fmt.Errorf("prune image %s of uid %d: %w", e.Digest, e.UID, err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lk.unlock()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, false, nil // a running step holds it
		}
		return false, false, fmt.Errorf("prune image %s of uid %d: lock the disk: %w", e.Digest, e.UID, err)
	}
	if dryRun {
		lk.unlock()
		return true, false, nil
	}
	err = errors.Join(
		ignoreNotExist(os.Remove(e.Disk)),
		ignoreNotExist(os.Remove(filepath.Join(dir, h+metaSuffix))),
		unlockDigest(lk, dir, h),
	)
	removeIfEmpty(dir)
	if err != nil {
		return false, false, fmt.Errorf("prune image %s of uid %d: %w", e.Digest, e.UID, err)
	}
	return true, false, nil
}

// removeIfEmpty removes a user's cache directory that holds nothing more.
// A Prepare that found the directory before the removal retries from
// creating it (lockDigest meets ENOENT); one that made a lock file in it
// keeps it (rmdir fails on a directory that is not empty).
func removeIfEmpty(dir string) {
	_ = unix.Rmdir(dir)
}
