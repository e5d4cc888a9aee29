package image

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestMeasureLargeTree times Check and Prepare (uncached, cached) for a
// large root filesystem given by SMV_IMAGE_BIG_ROOTFS (e.g. the output of
// `debootstrap --variant=minbase bookworm DIR`), as a directory, a squashfs
// file and a docker save archive. It reads as root: such a tree holds files
// only root may read.
func TestMeasureLargeTree(t *testing.T) {
	tree := os.Getenv("SMV_IMAGE_BIG_ROOTFS")
	if tree == "" {
		prereq.OptIn(t, "set SMV_IMAGE_BIG_ROOTFS to a large root filesystem directory to measure")
	}
	needRoot(t)
	needTools(t, "mksquashfs", "tar", "du")
	dir := openTempDir(t)
	du, _ := exec.Command("du", "-sh", "--apparent-size", tree).Output()
	t.Logf("MEASURE tree %s: %s", tree, du)

	sq := filepath.Join(dir, "big.sqsh")
	start := time.Now()
	if out, err := exec.Command("mksquashfs", tree, sq, "-noappend", "-quiet", "-no-progress").CombinedOutput(); err != nil {
		t.Fatalf("mksquashfs: %v: %s", err, out)
	}
	t.Logf("MEASURE mksquashfs (gzip): %v", time.Since(start).Round(time.Millisecond))

	layerTar := filepath.Join(dir, "layer.tar")
	if out, err := exec.Command("tar", "--numeric-owner", "-C", tree, "-cf", layerTar, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}
	l, err := tarball.LayerFromFile(layerTar)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	docker := filepath.Join(dir, "big-docker.tar")
	start = time.Now()
	if err := tarball.WriteToFile(docker, name.MustParseReference("test/big:1"), img); err != nil {
		t.Fatal(err)
	}
	os.Remove(layerTar)
	t.Logf("MEASURE docker save tarball (gzip layer) written in %v", time.Since(start).Round(time.Millisecond))

	for _, tc := range []struct{ name, ref, compression string }{
		{"directory", tree, ""},
		{"squashfs", sq, ""},
		{"docker archive", docker, ""},
		{"docker archive, lz4hc disk", docker, "lz4hc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			o := opts(t)
			o.UID, o.GID = 0, 0
			o.Compression = tc.compression
			o.Logger = nil
			start := time.Now()
			if err := Check(ctx, tc.ref, o); err != nil {
				t.Fatal(err)
			}
			check := time.Since(start)
			start = time.Now()
			a, err := Prepare(ctx, tc.ref, o)
			if err != nil {
				t.Fatal(err)
			}
			uncached := time.Since(start)
			start = time.Now()
			b, err := Prepare(ctx, tc.ref, o)
			if err != nil || !b.Cached {
				t.Fatalf("second Prepare: %+v %v", b, err)
			}
			cached := time.Since(start)
			t.Logf("MEASURE %s: check %v, prepare uncached %v, cached %v, disk %.1f MiB",
				tc.name, check.Round(time.Millisecond), uncached.Round(time.Millisecond), cached.Round(time.Millisecond), float64(a.Size)/(1<<20))
		})
	}
}
