package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultCacheRoot is where converted images live when Options.CacheRoot is
// empty.
const DefaultCacheRoot = "/var/cache/slurm-microvm"

// Cache layout, per user (uid), all owned by the launcher (root):
//
//	CACHE/                       0755
//	CACHE/<uid>/                 0700   one user's images; nobody else's job can use them
//	CACHE/<uid>/<hex>.erofs      0444   the disk (the commit point: present = complete)
//	CACHE/<uid>/<hex>.json       0444   cacheMeta
//	CACHE/<uid>/<hex>.lock       0600   flock(2) held while converting or removing; unlinked with the disk
//	CACHE/<uid>/tmp-<hex>-<rand>/0700   work directory of one conversion
//
// The disk is readable by root only: the launcher opens it (QEMU opens its
// drives before -runas drops privileges) and the user's processes cannot
// read another user's image through it.
const (
	diskSuffix = ".erofs"
	metaSuffix = ".json"
	lockSuffix = ".lock"
	tmpPrefix  = "tmp-"
)

// cacheMeta is the JSON stored next to every disk.
type cacheMeta struct {
	Version        int       `json:"version"`
	Ref            string    `json:"ref"`
	Kind           Kind      `json:"kind"`
	Digest         string    `json:"digest"`
	Config         Config    `json:"config"`
	Created        time.Time `json:"created"`
	ConvertSeconds float64   `json:"convert_seconds"`
}

const metaVersion = 1

// Entry is one converted image in a user's cache.
type Entry struct {
	UID     uint32
	Digest  string // sha256:<hex>
	Ref     string // the reference it was first prepared from
	Kind    Kind
	Disk    string
	Size    int64 // bytes of Disk
	Created time.Time
	// LastUsed is the disk's mtime: its conversion, or the latest step
	// start that used it (Use); Prune removes the oldest first.
	LastUsed time.Time
	Config   Config
}

func digestHex(d string) (string, error) {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return "", fmt.Errorf("bad digest %q", d)
	}
	if _, err := hex.DecodeString(h); err != nil {
		return "", fmt.Errorf("bad digest %q", d)
	}
	return h, nil
}

// userDir returns (creating it if needed) the cache directory of uid,
// checking that nobody but the launcher owns it or anything above it in the
// cache.
func userDir(root string, uid uint32, create bool) (string, error) {
	dir := filepath.Join(root, strconv.FormatUint(uint64(uid), 10))
	if create {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return "", fmt.Errorf("create image cache %s: %w", root, err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("create image cache %s: %w", dir, err)
		}
	}
	for _, p := range []string{root, dir} {
		fi, err := os.Lstat(p)
		if err != nil {
			return "", fmt.Errorf("image cache %s: %w", p, err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || st.Uid != uint32(os.Geteuid()) || fi.Mode().Perm()&0o022 != 0 {
			return "", fmt.Errorf("image cache %s: must be a directory owned by uid %d and writable only by it", p, os.Geteuid())
		}
	}
	return dir, nil
}

// lookup returns the cached image of digest hex h, if complete.
func lookup(dir, h string) (*cacheMeta, string, bool) {
	disk := filepath.Join(dir, h+diskSuffix)
	if _, err := os.Stat(disk); err != nil {
		return nil, "", false
	}
	b, err := os.ReadFile(filepath.Join(dir, h+metaSuffix))
	if err != nil {
		return nil, "", false
	}
	var m cacheMeta
	if json.Unmarshal(b, &m) != nil || m.Version != metaVersion {
		return nil, "", false
	}
	return &m, disk, true
}

// digestLock is a held per-digest lock: an open, flock(2)ed <hex>.lock.
type digestLock struct {
	f    *os.File
	path string
}

// unlock releases the lock and keeps the lock file.
func (l *digestLock) unlock() { l.f.Close() }

// remove unlinks the lock file, then releases the lock. Only the holder
// unlinks, and every locker checks after flock that the path still names
// the inode it locked (lockFile), so a process that opened the file before
// the unlink cannot "hold" it alongside one that creates a new file.
func (l *digestLock) remove() error {
	err := ignoreNotExist(os.Remove(l.path))
	l.f.Close()
	if err != nil {
		return fmt.Errorf("remove lock %s: %w", l.path, err)
	}
	return nil
}

// lockFile opens (creating it) and flocks the lock file p. It waits,
// polling so ctx can cancel, when wait is set; otherwise held reports that
// another open of it holds the lock. After taking the flock it compares
// the locked inode with the one p names now: when p was unlinked (or
// replaced) in between, it closes and starts again on the new file.
func lockFile(ctx context.Context, p string, wait bool) (l *digestLock, held bool, err error) {
	for {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, false, fmt.Errorf("open lock %s: %w", p, err)
		}
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil {
				break
			}
			if err == unix.EINTR {
				continue
			}
			if err != unix.EWOULDBLOCK {
				f.Close()
				return nil, false, fmt.Errorf("lock %s: %w", p, err)
			}
			if !wait {
				f.Close()
				return nil, true, nil
			}
			select {
			case <-ctx.Done():
				f.Close()
				return nil, false, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
		same, err := sameFile(f, p)
		if err != nil {
			f.Close()
			return nil, false, err
		}
		if same {
			return &digestLock{f: f, path: p}, false, nil
		}
		f.Close() // the holder before us unlinked it: lock the new one
	}
}

// sameFile reports whether path p still names the inode open as f.
func sameFile(f *os.File, p string) (bool, error) {
	var fst, pst unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &fst); err != nil {
		return false, fmt.Errorf("stat lock %s: %w", p, err)
	}
	if err := unix.Lstat(p, &pst); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("stat lock %s: %w", p, err)
	}
	return fst.Dev == pst.Dev && fst.Ino == pst.Ino, nil
}

// lockDigest takes the per-digest lock, waiting (polling, so ctx can
// cancel) while another process converts or removes the same image.
func lockDigest(ctx context.Context, dir, h string) (*digestLock, error) {
	l, _, err := lockFile(ctx, filepath.Join(dir, h+lockSuffix), true)
	return l, err
}

// unlockDigest releases l, removing the lock file when the digest has no
// disk (a conversion that failed, an image removed): every digest a user
// tries would otherwise leave an inode that no quota counts.
func unlockDigest(l *digestLock, dir, h string) error {
	if _, err := os.Lstat(filepath.Join(dir, h+diskSuffix)); errors.Is(err, fs.ErrNotExist) {
		return l.remove()
	}
	l.unlock()
	return nil
}

// newWorkDir creates a fresh work directory for converting h, after
// removing work directories left by a crashed conversion of the same digest
// (the caller holds the digest's lock, so none is in use).
func newWorkDir(dir, h string) (string, error) {
	stale, _ := filepath.Glob(filepath.Join(dir, tmpPrefix+h+"-*"))
	for _, s := range stale {
		os.RemoveAll(s)
	}
	var r [6]byte
	rand.Read(r[:])
	w := filepath.Join(dir, tmpPrefix+h+"-"+hex.EncodeToString(r[:]))
	if err := os.Mkdir(w, 0o700); err != nil {
		return "", fmt.Errorf("create work directory: %w", err)
	}
	return w, nil
}

// CleanAbandoned removes the work directories of conversions that ended
// without cleaning up (a launcher killed mid-conversion, by `stop` or the
// OOM killer) in every user's cache under cacheRoot: those whose digest
// lock no process holds. A conversion in progress holds its lock, so its
// directory is kept; one that starts meanwhile waits for the lock. It also
// removes lock files that no process holds and whose digest has no disk
// (left by a launcher killed while converting). It returns the work
// directories and lock files removed. A missing cacheRoot is not an error.
// `stop` and `gc` run it: without it a killed conversion's files stay until
// the same user converts the same image again.
func CleanAbandoned(ctx context.Context, cacheRoot string) ([]string, error) {
	if cacheRoot == "" {
		cacheRoot = DefaultCacheRoot
	}
	des, err := os.ReadDir(cacheRoot)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("clean image cache: %w", err)
	}
	var removed []string
	var errs []error
	for _, de := range des {
		uid, err := strconv.ParseUint(de.Name(), 10, 32)
		if err != nil || !de.IsDir() {
			continue
		}
		dir, err := userDir(cacheRoot, uint32(uid), false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		works, _ := filepath.Glob(filepath.Join(dir, tmpPrefix+"*"))
		byDigest := map[string][]string{}
		for _, w := range works {
			h, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(w), tmpPrefix), "-")
			if _, err := digestHex("sha256:" + h); ok && err == nil {
				byDigest[h] = append(byDigest[h], w)
			}
		}
		locks, _ := filepath.Glob(filepath.Join(dir, "*"+lockSuffix))
		for _, l := range locks {
			h := strings.TrimSuffix(filepath.Base(l), lockSuffix)
			if _, err := digestHex("sha256:" + h); err == nil {
				if _, ok := byDigest[h]; !ok {
					byDigest[h] = nil
				}
			}
		}
		hs := make([]string, 0, len(byDigest))
		for h := range byDigest {
			hs = append(hs, h)
		}
		sort.Strings(hs)
		for _, h := range hs {
			if err := ctx.Err(); err != nil {
				return removed, err
			}
			lk, held, err := tryLockDigest(dir, h)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if held {
				continue // a conversion (or removal) in progress
			}
			for _, w := range byDigest[h] {
				if err := os.RemoveAll(w); err != nil {
					errs = append(errs, fmt.Errorf("remove abandoned work directory: %w", err))
					continue
				}
				removed = append(removed, w)
			}
			_, derr := os.Lstat(filepath.Join(dir, h+diskSuffix))
			if err := unlockDigest(lk, dir, h); err != nil {
				errs = append(errs, err)
			} else if errors.Is(derr, fs.ErrNotExist) {
				removed = append(removed, lk.path)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// tryLockDigest takes the digest's lock without waiting; held is true
// when another process (or another open of it in this one) holds it.
func tryLockDigest(dir, h string) (l *digestLock, held bool, err error) {
	return lockFile(context.Background(), filepath.Join(dir, h+lockSuffix), false)
}

// commit moves a finished disk and its metadata into the cache: the JSON
// first, then the disk (whose presence marks the entry complete), each
// fsynced and renamed.
func commit(dir, h, work, disk string, m *cacheMeta) (string, error) {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return "", err
	}
	metaTmp := filepath.Join(work, "meta.json")
	if err := writeFileSync(metaTmp, b, 0o444); err != nil {
		return "", err
	}
	if err := os.Chmod(disk, 0o444); err != nil {
		return "", err
	}
	if err := syncPath(disk); err != nil {
		return "", err
	}
	if err := os.Rename(metaTmp, filepath.Join(dir, h+metaSuffix)); err != nil {
		return "", err
	}
	final := filepath.Join(dir, h+diskSuffix)
	if err := os.Rename(disk, final); err != nil {
		return "", err
	}
	return final, syncPath(dir)
}

func writeFileSync(p string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// List returns the images in the cache of uid, or of every user when all
// is set, sorted by uid then creation time. A missing cache is empty; one
// the caller may not read is an error (fs.ErrPermission for a non-root
// caller on the node's cache).
func List(cacheRoot string, uid uint32, all bool) ([]Entry, error) {
	if cacheRoot == "" {
		cacheRoot = DefaultCacheRoot
	}
	var uids []uint32
	if all {
		des, err := os.ReadDir(cacheRoot)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return nil, fmt.Errorf("list image cache: %w", err)
		}
		for _, de := range des {
			if n, err := strconv.ParseUint(de.Name(), 10, 32); err == nil && de.IsDir() {
				uids = append(uids, uint32(n))
			}
		}
	} else {
		uids = []uint32{uid}
	}
	var out []Entry
	for _, u := range uids {
		dir := filepath.Join(cacheRoot, strconv.FormatUint(uint64(u), 10))
		des, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list image cache: %w", err)
		}
		for _, de := range des {
			h, ok := strings.CutSuffix(de.Name(), diskSuffix)
			if !ok {
				continue
			}
			m, disk, ok := lookup(dir, h)
			if !ok {
				continue
			}
			fi, err := os.Stat(disk)
			if err != nil {
				continue
			}
			out = append(out, Entry{UID: u, Digest: m.Digest, Ref: m.Ref, Kind: m.Kind, Disk: disk, Size: fi.Size(), Created: m.Created, LastUsed: fi.ModTime(), Config: m.Config})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].UID != out[j].UID {
			return out[i].UID < out[j].UID
		}
		return out[i].Created.Before(out[j].Created)
	})
	return out, nil
}

// Remove deletes the cached image(s) of uid selected by what: a digest
// ("sha256:<hex>" or a hex prefix of at least 12 digits) or the reference it
// was prepared from, with its lock file, and the user's directory when it
// is left empty. It takes each digest's lock, so it never removes an
// image being converted; a VM that already opened the disk keeps its open
// file (unlike Prune, it removes an image in use: an administrator asked
// for it). It returns the removed entries; none matching is ErrNotFound.
func Remove(ctx context.Context, cacheRoot string, uid uint32, what string) ([]Entry, error) {
	entries, err := List(cacheRoot, uid, false)
	if err != nil {
		return nil, err
	}
	prefix := strings.TrimPrefix(what, "sha256:")
	var removed []Entry
	for _, e := range entries {
		h := strings.TrimPrefix(e.Digest, "sha256:")
		if !(e.Ref == what || (len(prefix) >= 12 && strings.HasPrefix(h, prefix))) {
			continue
		}
		dir := filepath.Dir(e.Disk)
		lk, err := lockDigest(ctx, dir, h)
		if err != nil {
			return removed, err
		}
		err = errors.Join(
			ignoreNotExist(os.Remove(filepath.Join(dir, h+diskSuffix))),
			ignoreNotExist(os.Remove(filepath.Join(dir, h+metaSuffix))),
		)
		err = errors.Join(err, unlockDigest(lk, dir, h))
		removeIfEmpty(dir)
		if err != nil {
			return removed, fmt.Errorf("remove image %s: %w", e.Digest, err)
		}
		removed = append(removed, e)
	}
	if len(removed) == 0 {
		return nil, newErr(what, ErrNotFound, fmt.Sprintf("not in the cache of uid %d", uid), "name a digest (12 or more hex digits) or a reference shown by `slurm-microvm image ls`", nil)
	}
	return removed, nil
}

func ignoreNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
