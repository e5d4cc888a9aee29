package image

import (
	"context"
	"fmt"
	"io"
)

// Limits bound what one conversion makes root write into the image cache
// for a user. Every image is untrusted input: without bounds a
// decompression bomb, an endless helper stream (a symlink swapped for
// /dev/zero after the probe) or a tar of millions of empty files fills
// cache_dir for every user of the node. A zero field takes
// DefaultLimits()'s value. Each limit is a key of the [images] table of
// microvm.toml (launcher/config), named in the error that reports it.
type Limits struct {
	// ImageBytes bounds the unpacked size of one image: the bytes of the
	// regular files written, all layers together (a file that a later
	// layer writes again counts again, as in `docker image ls`), of a
	// root filesystem directory, or listed in a squashfs file
	// (images.max_image_mib).
	ImageBytes int64
	// LayerBytes bounds one layer's uncompressed tar stream
	// (images.max_layer_mib).
	LayerBytes int64
	// Entries bounds the files, directories, links and whiteouts of one
	// image, all layers together: the inodes it can take
	// (images.max_entries).
	Entries int64
	// UserCacheBytes bounds one user's cache: the converted disks of that
	// uid together. A conversion may use what is left, for each of its
	// stages (the copy of the image file, the unpacked tree, the disk)
	// (images.user_cache_mib). Prepare first prunes the user's least
	// recently used images that no step holds to make room (Prune).
	UserCacheBytes int64
	// CacheBytes bounds every user's converted disks together
	// (images.cache_mib): Prepare prunes the least recently used idle
	// images of any user to stay within it, and a conversion may use only
	// what is left.
	CacheBytes int64
}

// The config keys of the limits (microvm.toml, table [images]).
const (
	KeyMaxImage  = "images.max_image_mib"
	KeyMaxLayer  = "images.max_layer_mib"
	KeyMaxEntry  = "images.max_entries"
	KeyUserCache = "images.user_cache_mib"
	KeyCache     = "images.cache_mib"
)

// DefaultLimits are the limits when microvm.toml sets none: room for the
// largest common images (CUDA/PyTorch images unpack to 15-25 GiB in a few
// hundred thousand files), far from the capacity of a node's local disk.
func DefaultLimits() Limits {
	return Limits{ImageBytes: 64 << 30, LayerBytes: 32 << 30, Entries: 2_000_000, UserCacheBytes: 128 << 30, CacheBytes: 256 << 30}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.ImageBytes <= 0 {
		l.ImageBytes = d.ImageBytes
	}
	if l.LayerBytes <= 0 {
		l.LayerBytes = d.LayerBytes
	}
	if l.Entries <= 0 {
		l.Entries = d.Entries
	}
	if l.UserCacheBytes <= 0 {
		l.UserCacheBytes = d.UserCacheBytes
	}
	if l.CacheBytes <= 0 {
		l.CacheBytes = d.CacheBytes
	}
	return l
}

// mib renders bytes as MiB for messages (the unit of the config keys).
func mib(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }

// limitErr reports a passed limit: what is too large, the key that sets
// the limit and its value.
func limitErr(what, key, value string) error {
	return newErr("", ErrLimit, what, key+" in microvm.toml is "+value+": make the image smaller, or a node administrator raises it", nil)
}

// bound is one limit on a running count (bytes or entries) of an
// extraction.
type bound struct {
	max  int64
	n    int64
	fail func() error
}

func (b *bound) add(k int64) error {
	b.n += k
	if b.n > b.max {
		return b.fail()
	}
	return nil
}

// budget is the bounds of one conversion, derived from Limits and the
// user's cache usage when it starts.
type budget struct {
	lim   Limits
	space int64 // bytes left: the less of UserCacheBytes - the user's and CacheBytes - everyone's
	total bool  // space is what CacheBytes leaves (the whole cache is the tighter bound)
	uid   uint32
}

// imageBound bounds the unpacked bytes of the image: the smaller of
// ImageBytes and the space left in the user's cache.
func (b budget) imageBound() *bound {
	if b.space < b.lim.ImageBytes {
		return &bound{max: b.space, fail: b.quotaErr}
	}
	return &bound{max: b.lim.ImageBytes, fail: func() error {
		return limitErr("the image unpacks to more than "+mib(b.lim.ImageBytes), KeyMaxImage, mib(b.lim.ImageBytes))
	}}
}

func (b budget) entryBound() *bound {
	return &bound{max: b.lim.Entries, fail: func() error {
		return limitErr(fmt.Sprintf("the image has more than %d files, directories and links", b.lim.Entries), KeyMaxEntry, fmt.Sprint(b.lim.Entries))
	}}
}

func (b budget) layerBound(n, of int) *bound {
	return &bound{max: b.lim.LayerBytes, fail: func() error {
		return limitErr(fmt.Sprintf("layer %d of %d is larger than %s uncompressed", n, of, mib(b.lim.LayerBytes)), KeyMaxLayer, mib(b.lim.LayerBytes))
	}}
}

func (b budget) quotaErr() error {
	e := b.quotaError()
	e.cacheFull = true
	return e
}

func (b budget) quotaError() *Error {
	if b.total {
		used := b.lim.CacheBytes - b.space
		return newErr("", ErrLimit, fmt.Sprintf("the image does not fit in the node's image cache (%s for all users, of which %s are taken by images that running steps hold or that are being converted)", mib(b.lim.CacheBytes), mib(used)),
			fmt.Sprintf("try again once steps have ended, or ask a node administrator to raise %s in microvm.toml", KeyCache), nil)
	}
	used := b.lim.UserCacheBytes - b.space
	return newErr("", ErrLimit, fmt.Sprintf("the image does not fit in the image cache of uid %d (%s, of which %s are used)", b.uid, mib(b.lim.UserCacheBytes), mib(used)),
		fmt.Sprintf("the node's image cache is root's alone: ask a node administrator to remove images you no longer need "+
			"(`sudo slurm-microvm image ls --uid %d` lists them, `sudo slurm-microvm image rm --uid %d DIGEST` removes one) or to raise %s in microvm.toml", b.uid, b.uid, KeyUserCache), nil)
}

// newBudget measures the cache: the disks and metadata of converted
// images, the user's (uid's) and everyone's (work directories of
// conversions in progress are not counted; each conversion is bounded on
// its own).
func newBudget(root string, uid uint32, lim Limits) (budget, error) {
	es, err := List(root, 0, true)
	if err != nil {
		return budget{}, fmt.Errorf("measure image cache %s: %w", root, err)
	}
	u := measure(es)
	b := budget{lim: lim, space: lim.UserCacheBytes - u.user[uid], uid: uid}
	if t := lim.CacheBytes - u.total; t < b.space {
		b.space, b.total = t, true
	}
	if b.space <= 0 {
		return b, b.quotaErr()
	}
	return b, nil
}

// probedBound bounds a stream by what the probe counted (what: "bytes",
// "entries"): the helper that sends it runs as the user, who may swap the
// file for another (a FIFO, /dev/zero, a FUSE file) after the probe.
func probedBound(n int64, what string) *bound {
	return &bound{max: n, fail: func() error {
		return newErr("", ErrChanged, fmt.Sprintf("the image sent more than the %d %s it had when probed", n, what),
			"it changed while being read, or is not a regular file; run again once it is no longer being written", nil)
	}}
}

// checkProbe refuses before any copy what the probe already shows to be
// too large: a file larger than the space left in the user's cache, a
// directory whose files pass the image limits.
func (b budget) checkProbe(pr probeResult) error {
	if pr.Kind == KindRootfs {
		if ib := b.imageBound(); pr.Size > ib.max {
			return ib.fail()
		}
		if eb := b.entryBound(); pr.Entries > eb.max {
			return eb.fail()
		}
		return nil
	}
	if pr.Size > b.space {
		return b.quotaErr()
	}
	return nil
}

// boundedReader fails with its bound's error once more than max bytes
// were read through it, and with ctx's error once ctx is done.
type boundedReader struct {
	ctx context.Context
	r   io.Reader
	b   *bound
}

func (r *boundedReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := r.r.Read(p)
	if berr := r.b.add(int64(n)); berr != nil {
		return n, berr
	}
	return n, err
}
