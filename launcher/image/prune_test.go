package image

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// distinctRootfs makes n small root filesystem directories that differ in
// content (so in digest), readable by every user: each holds a file of
// random bytes (size bytes) and a marker naming its index.
func distinctRootfs(t *testing.T, n int, size int) []string {
	t.Helper()
	base := openTempDir(t)
	var dirs []string
	for i := range n {
		d := filepath.Join(base, fmt.Sprintf("img%02d", i))
		for _, sub := range []string{"etc", "data", "bin"} {
			if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		b := make([]byte, size)
		rand.Read(b)
		if err := os.WriteFile(filepath.Join(d, "data", "blob"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "etc", "image-index"), []byte(strconv.Itoa(i)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}
	return dirs
}

// TestPruneKeepsCacheUnderLimit (issue 14 acceptance): 20 distinct real
// images, converted with mkfs.erofs by two users in turn, each used by a
// "step" (Hold, then release) as the launcher does; with images.cache_mib
// room for about four, the cache never passes its limit, each user stays
// within user_cache_mib, the image just prepared is always there, and the
// least recently used go first (an image used again outlives younger ones).
func TestPruneKeepsCacheUnderLimit(t *testing.T) {
	needRoot(t)
	needTools(t, "mkfs.erofs")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dirs := distinctRootfs(t, 20, 192<<10)
	o := opts(t)
	// Measure one disk first, then set the limits from it.
	probe, rel, err := Hold(ctx, dirs[0], o)
	if err != nil {
		t.Fatal(err)
	}
	rel()
	one := entryBytes(Entry{Disk: probe.Disk, Size: probe.Size})
	o.Limits = Limits{CacheBytes: 4*one + one/2, UserCacheBytes: 3*one + one/2}
	uids := []struct{ uid, gid uint32 }{{testUID, testGID}, {0, 0}}
	var favourite *Image // dirs[1], used again before every later prepare
	for i, d := range dirs[1:] {
		u := uids[i%2]
		oi := o
		oi.UID, oi.GID = u.uid, u.gid
		img, release, err := Hold(ctx, d, oi)
		if err != nil {
			t.Fatalf("image %d: %v", i+1, err)
		}
		release()
		if favourite == nil {
			favourite = img
		} else {
			// A step of the favourite's user uses it again.
			fo := o
			fo.UID, fo.GID = testUID, testGID
			again, release, err := Hold(ctx, dirs[1], fo)
			if err != nil {
				t.Fatalf("use image 1 again after image %d: %v", i+1, err)
			}
			release()
			if !again.Cached {
				t.Errorf("after image %d: image 1, used before each later one, was pruned (not least recently used)", i+1)
			}
		}
		total, err := Usage(o.CacheRoot)
		if err != nil {
			t.Fatal(err)
		}
		if total > o.Limits.CacheBytes {
			t.Errorf("after image %d: cache holds %d bytes, limit %d", i+1, total, o.Limits.CacheBytes)
		}
		es, err := List(o.CacheRoot, 0, true)
		if err != nil {
			t.Fatal(err)
		}
		per := measure(es).user
		for uid, n := range per {
			if n > o.Limits.UserCacheBytes {
				t.Errorf("after image %d: uid %d holds %d bytes, limit %d", i+1, uid, n, o.Limits.UserCacheBytes)
			}
		}
		if _, err := os.Stat(img.Disk); err != nil {
			t.Errorf("after image %d: its own disk is gone: %v", i+1, err)
		}
		if len(es) < 2 {
			t.Errorf("after image %d: %d images kept; the limit has room for 4", i+1, len(es))
		}
	}
	// dirs[0] was least recently used of all: long gone; its user's
	// directory too when it holds nothing more (uid 0's holds images).
	es, _ := List(o.CacheRoot, 0, true)
	for _, e := range es {
		if e.Digest == probe.Digest {
			t.Errorf("the least recently used image %s is still cached", e.Digest)
		}
	}
	t.Logf("20 images, disk %d bytes each: %d kept, limit %d bytes", one, len(es), o.Limits.CacheBytes)
}

// TestPruneKeepsInUseDisk: an image a running step holds (Use) survives
// every prune, even one with the smallest limits and --all, and stays
// readable; a conversion that needs its room fails with ErrLimit naming
// images.cache_mib instead of removing it. Once released, a prune removes
// it, with its lock file and the user's directory. A dry run removes
// nothing.
func TestPruneKeepsInUseDisk(t *testing.T) {
	needRoot(t)
	needTools(t, "mkfs.erofs")
	ctx := context.Background()
	dirs := distinctRootfs(t, 3, 64<<10)
	o := opts(t)
	held, release, err := Hold(ctx, dirs[0], o)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	idle, rel, err := Hold(ctx, dirs[1], o)
	if err != nil {
		t.Fatal(err)
	}
	rel()
	tiny := Limits{CacheBytes: 1, UserCacheBytes: 1}

	dry, err := Prune(ctx, o.CacheRoot, PruneOptions{All: true, Limits: tiny, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(dry.Removed) != 1 || dry.Removed[0].Digest != idle.Digest || len(dry.InUse) != 1 {
		t.Errorf("dry run = %+v; want the idle image to go and the held one in use", dry)
	}
	if _, err := os.Stat(idle.Disk); err != nil {
		t.Errorf("dry run removed %s: %v", idle.Disk, err)
	}

	res, err := Prune(ctx, o.CacheRoot, PruneOptions{All: true, Limits: tiny})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 1 || res.Removed[0].Digest != idle.Digest {
		t.Errorf("Prune removed %+v; want only the idle image %s", res.Removed, idle.Digest)
	}
	if len(res.InUse) != 1 || res.InUse[0].Digest != held.Digest {
		t.Fatalf("Prune in use = %+v; want the held image %s", res.InUse, held.Digest)
	}
	if res.FreedBytes <= 0 || res.UsedBytes != entryBytes(res.InUse[0]) {
		t.Errorf("Prune freed %d, used after %d; want > 0 and the held image's bytes", res.FreedBytes, res.UsedBytes)
	}
	view, _ := diskView(t, held.Disk)
	if b, err := os.ReadFile(filepath.Join(view, "etc", "image-index")); err != nil || string(b) != "0\n" {
		t.Errorf("held disk after prune: %q, %v; want its content", b, err)
	}

	// No room beside the held image: the conversion fails and the held
	// image stays.
	lo := o
	lo.Limits = Limits{CacheBytes: entryBytes(res.InUse[0]) + 4096}
	if _, err := Prepare(ctx, dirs[2], lo); err == nil || !strings.Contains(err.Error(), KeyCache) {
		t.Errorf("Prepare with the cache full of a held image = %v; want ErrLimit naming %s", err, KeyCache)
	}
	if _, err := os.Stat(held.Disk); err != nil {
		t.Errorf("held disk removed by a conversion's prune: %v", err)
	}

	release()
	res, err = Prune(ctx, o.CacheRoot, PruneOptions{UID: o.UID, Limits: tiny})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 1 || res.Removed[0].Digest != held.Digest || res.UsedBytes != 0 {
		t.Errorf("Prune after release = %+v; want the released image gone", res)
	}
	if left, err := os.ReadDir(o.CacheRoot); err != nil || len(left) != 0 {
		t.Errorf("after the last image was pruned: %s holds %v (%v); want it empty", o.CacheRoot, left, err)
	}
	// A disk pruned between Prepare and Use: Use says so, Hold prepares again.
	if _, err := Use(ctx, held); err == nil {
		t.Errorf("Use of a pruned disk succeeded")
	}
	again, rel2, err := Hold(ctx, dirs[0], o)
	if err != nil || again.Cached {
		t.Fatalf("Hold after prune = %+v, %v; want a fresh conversion", again, err)
	}
	rel2()
}
