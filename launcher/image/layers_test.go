package image

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// writeOCIArchive builds an OCI archive (a tar of an OCI layout, what
// `skopeo copy ... oci-archive:` writes) of an image made of the given
// layer tars, oldest first, in a directory the test user can read, and
// returns its path.
func writeOCIArchive(t *testing.T, layerTars ...string) string {
	t.Helper()
	dir := openTempDir(t)
	var layers []v1.Layer
	for _, p := range layerTars {
		l, err := tarball.LayerFromFile(p, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			t.Fatal(err)
		}
		layers = append(layers, l)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	lay := filepath.Join(dir, "layout")
	lp, err := layout.Write(lay, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "image-oci.tar")
	if b, err := exec.Command("tar", "-C", lay, "-cf", out, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar layout: %v: %s", err, b)
	}
	if b, err := exec.Command("chmod", "-R", "a+rX", dir).CombinedOutput(); err != nil {
		t.Fatalf("chmod: %v: %s", err, b)
	}
	return out
}

func layerTar(t *testing.T, entries []tarEntry) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "layer.tar")
	if err := writeTar(p, entries); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLayersApplyLikeContainerd converts a real OCI archive whose layers
// have the shapes Docker and containerd apply, oldest first, through the
// symlinks of earlier layers (containerd's archive.Apply):
//   - merged /usr: bin -> usr/bin in the base layer, bin/x (and a bin/
//     directory entry) in a later one: x lands in usr/bin/x, bin stays a
//     symlink, usr/bin keeps its files;
//   - lib -> /usr/lib (absolute): a later lib/libx.so lands in usr/lib;
//   - host -> a real host directory, up -> ../../..: a later file through
//     them lands inside the image at that path, nothing on the host;
//   - whiteouts: .wh.NAME removes a file, an opaque directory keeps only
//     what its own layer adds (listed before and after the marker);
//   - a later file replaces a non-empty directory.
//
// Before layers were applied oldest first, bin/x of the upper layer came
// first and the base layer's bin symlink failed with "cannot replace".
func TestLayersApplyLikeContainerd(t *testing.T) {
	needRoot(t)
	needTools(t, "tar", "mkfs.erofs")
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "keep"), []byte("host"), 0o644)
	hostRel := strings.TrimPrefix(host, "/")
	base := layerTar(t, []tarEntry{
		{name: "usr/", dir: true, mode: 0o755},
		{name: "usr/bin/", dir: true, mode: 0o755},
		{name: "usr/bin/sh", body: "sh", mode: 0o755},
		{name: "usr/lib/", dir: true, mode: 0o755},
		{name: "bin", symlink: true, link: "usr/bin"},
		{name: "lib", symlink: true, link: "/usr/lib"},
		{name: "host", symlink: true, link: host},
		{name: "up", symlink: true, link: "../../../.."},
		{name: "etc/", dir: true, mode: 0o755},
		{name: "etc/old", body: "old"},
		{name: "opt/", dir: true, mode: 0o755},
		{name: "opt/a", body: "a"},
		{name: "opt/sub/", dir: true, mode: 0o755},
		{name: "opt/sub/b", body: "b"},
		{name: "data/", dir: true, mode: 0o755},
		{name: "data/inner", body: "inner"},
	})
	upper := layerTar(t, []tarEntry{
		{name: "bin/", dir: true, mode: 0o755},
		{name: "bin/x", body: "x", mode: 0o755},
		{name: "lib/libx.so", body: "libx"},
		{name: "host/planted", body: "planted"},
		{name: "up/tmp/climbed", body: "climbed"},
		{name: "etc/.wh.old", body: ""},
		{name: "opt/c", body: "c"},
		{name: "opt/.wh..wh..opq", body: ""},
		{name: "opt/d", body: "d"},
	})
	top := layerTar(t, []tarEntry{
		{name: "data", body: "now a file"},
	})
	archive := writeOCIArchive(t, base, upper, top)
	img, err := Prepare(context.Background(), archive, opts(t))
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	view, _ := diskView(t, img.Disk)
	files := map[string]string{
		"usr/bin/x":          "x",
		"usr/bin/sh":         "sh",
		"usr/lib/libx.so":    "libx",
		hostRel + "/planted": "planted",
		"tmp/climbed":        "climbed",
		"opt/c":              "c",
		"opt/d":              "d",
		"data":               "now a file",
	}
	for p, want := range files {
		fi, err := os.Lstat(filepath.Join(view, p))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v, %v; want a regular file", p, fi, err)
			continue
		}
		if b, _ := os.ReadFile(filepath.Join(view, p)); string(b) != want {
			t.Errorf("%s = %q, want %q", p, b, want)
		}
	}
	for p, want := range map[string]string{"bin": "usr/bin", "lib": "/usr/lib", "host": host} {
		if l, err := os.Readlink(filepath.Join(view, p)); err != nil || l != want {
			t.Errorf("%s: readlink = %q, %v; want the base layer's symlink to %s", p, l, err, want)
		}
	}
	for _, p := range []string{"etc/old", "opt/a", "opt/sub"} {
		if _, err := os.Lstat(filepath.Join(view, p)); !os.IsNotExist(err) {
			t.Errorf("%s: %v; want it removed by a whiteout", p, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(host, "planted")); !os.IsNotExist(err) {
		t.Errorf("host/planted reached the host's %s: %v", host, err)
	}
	if des, _ := os.ReadDir(host); len(des) != 1 {
		t.Errorf("the host directory %s changed: %v", host, des)
	}
	if _, err := os.Lstat("/tmp/climbed"); err == nil {
		t.Errorf("up/tmp/climbed reached the host's /tmp")
	}
}
