package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestPruneForUnpackedSize: an image whose unpacked tree is far larger
// than its file (a gzip layer of zeros: the probe's guess is the archive's
// few KiB) still converts in a cache whose room only an older, unused
// image takes: the conversion that runs out of room prunes every image no
// step holds and converts again. Before, the step failed with "does not
// fit ... taken by images that running steps hold" while nothing held
// them (the e2e suite's GPU and MPI steps with a bounded cache).
func TestPruneForUnpackedSize(t *testing.T) {
	needRoot(t)
	needTools(t, "mkfs.erofs")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fx := fixtures(t)
	dir := openTempDir(t)
	lt := filepath.Join(dir, "layer.tar")
	const unpacked = 3 << 20
	if err := writeTar(lt, []tarEntry{{name: "zeros", body: strings.Repeat("\x00", unpacked), mode: 0o644}}); err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromFile(lt)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(fx.img, l)
	if err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "zeros.tar")
	if err := tarball.WriteToFile(big, name.MustParseReference("test/zeros:1"), img); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(big, 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(big)
	if err != nil {
		t.Fatal(err)
	}
	// The big image's disk, measured alone in a cache of its own.
	scratch := opts(t)
	scratch.CacheRoot = filepath.Join(openTempDir(t), "cache")
	alone, err := Prepare(ctx, big, scratch)
	if err != nil {
		t.Fatal(err)
	}
	bigBytes := entryBytes(Entry{Disk: alone.Disk, Size: alone.Size})
	o := opts(t)
	old := distinctRootfs(t, 1, 2<<20)[0]
	first, err := Prepare(ctx, old, o)
	if err != nil {
		t.Fatal(err)
	}
	oldBytes := entryBytes(Entry{Disk: first.Disk, Size: first.Size})
	// Room for the big image alone, and for the old image beside the
	// archive's file (the probe's guess), not beside the unpacked tree:
	// only pruning the old one makes room.
	limit := bigBytes + oldBytes/2
	if fi.Size()+oldBytes > limit {
		t.Fatalf("bad sizes: limit %d, old %d, archive %d, big %d", limit, oldBytes, fi.Size(), bigBytes)
	}
	o.Limits = Limits{CacheBytes: limit, UserCacheBytes: limit}
	res, err := Prepare(ctx, big, o)
	if err != nil {
		t.Fatalf("Prepare of an image that fits once the unused one is pruned: %v", err)
	}
	if _, err := os.Stat(first.Disk); err == nil {
		t.Errorf("the unused older image %s was kept", first.Disk)
	}
	if _, err := os.Stat(res.Disk); err != nil {
		t.Errorf("the new image's disk: %v", err)
	}
	// Held by a step, the old image would stay, and the error says so.
	o2 := opts(t)
	o2.CacheRoot = filepath.Join(openTempDir(t), "cache")
	heldImg, release, err := Hold(ctx, old, o2)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	o2.Limits = o.Limits
	if _, err := Prepare(ctx, big, o2); err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Errorf("Prepare beside a held image: %v, want a cache-full error", err)
	}
	if _, err := os.Stat(heldImg.Disk); err != nil {
		t.Errorf("the held image was pruned: %v", err)
	}
}
