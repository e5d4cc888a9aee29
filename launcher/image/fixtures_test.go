package image

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// testLogger sends the package's log records to the test log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tLogWriter struct{ t *testing.T }

func (w tLogWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// fixtureSet holds the images every test reads: the same busybox root
// filesystem as a directory, docker save archive, OCI layout, OCI archive
// and squashfs file. All are world-readable so the test user can read them.
type fixtureSet struct {
	dir       string
	rootfs    string // busybox root filesystem directory
	docker    string // docker save tarball (tarball.Write), 2 layers, whiteout of etc/motd
	ociLayout string // OCI layout directory (layout.Write), OCI media types
	ociTar    string // tar of the OCI layout (oci-archive)
	squashfs  string // mksquashfs of rootfs
	img       v1.Image
	ociImg    v1.Image
	config    v1.Config
}

var (
	fixOnce sync.Once
	fix     *fixtureSet
	fixErr  error
)

// Marker file metadata checked after conversion.
var (
	motdTime  = time.Date(2001, 2, 3, 4, 5, 6, 123456789, time.UTC)
	ownedUID  = 1234
	ownedGID  = 5678
	busyboxSz int64
)

func fixtures(t *testing.T) *fixtureSet {
	t.Helper()
	needRoot(t)
	needTools(t, "busybox", "tar", "mksquashfs", "mkfs.erofs", "unsquashfs")
	fixOnce.Do(func() { fix, fixErr = buildFixtures() })
	if fixErr != nil {
		t.Fatalf("build fixtures: %v", fixErr)
	}
	return fix
}

func cleanupFixtures() {
	if fix != nil {
		os.RemoveAll(fix.dir)
	}
}

func buildFixtures() (*fixtureSet, error) {
	dir, err := os.MkdirTemp("", "image-fixtures-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	f := &fixtureSet{dir: dir, rootfs: filepath.Join(dir, "rootfs")}
	if err := buildBusyboxRootfs(f.rootfs); err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}

	// Layer 1: the whole rootfs, tarred by GNU tar (numeric owners).
	layer1 := filepath.Join(dir, "layer1.tar")
	if out, err := exec.Command("tar", "--numeric-owner", "--xattrs", "-C", f.rootfs, "-cf", layer1, ".").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("tar rootfs: %w: %s", err, out)
	}
	// Layer 2: deletes etc/motd (whiteout), adds etc/added.
	layer2 := filepath.Join(dir, "layer2.tar")
	if err := writeTar(layer2, []tarEntry{
		{name: "etc/", dir: true, mode: 0o755},
		{name: "etc/.wh.motd", mode: 0o644},
		{name: "etc/added", body: "layer two\n", mode: 0o644},
	}); err != nil {
		return nil, err
	}
	f.config = v1.Config{
		Env:        []string{"PATH=/bin", "GREETING=hello world"},
		Entrypoint: []string{"/bin/sh", "-c"},
		Cmd:        []string{"echo $GREETING"},
		WorkingDir: "/tmp",
		User:       "1000:1000",
	}
	build := func(mt types.MediaType, cmt types.MediaType, lmt types.MediaType) (v1.Image, error) {
		base := mutate.MediaType(empty.Image, mt)
		base = mutate.ConfigMediaType(base, cmt)
		var layers []v1.Layer
		for _, p := range []string{layer1, layer2} {
			l, err := tarball.LayerFromFile(p, tarball.WithMediaType(lmt))
			if err != nil {
				return nil, err
			}
			layers = append(layers, l)
		}
		img, err := mutate.AppendLayers(base, layers...)
		if err != nil {
			return nil, err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		cf = cf.DeepCopy()
		cf.Config = f.config
		cf.OS, cf.Architecture = "linux", "amd64"
		return mutate.ConfigFile(img, cf)
	}
	if f.img, err = build(types.DockerManifestSchema2, types.DockerConfigJSON, types.DockerLayer); err != nil {
		return nil, err
	}
	if f.ociImg, err = build(types.OCIManifestSchema1, types.OCIConfigJSON, types.OCILayer); err != nil {
		return nil, err
	}

	f.docker = filepath.Join(dir, "busybox-docker.tar")
	if err := tarball.WriteToFile(f.docker, name.MustParseReference("test/busybox:1"), f.img); err != nil {
		return nil, fmt.Errorf("docker save tarball: %w", err)
	}
	f.ociLayout = filepath.Join(dir, "busybox-oci")
	p, err := layout.Write(f.ociLayout, empty.Index)
	if err != nil {
		return nil, err
	}
	if err := p.AppendImage(f.ociImg, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "1"})); err != nil {
		return nil, err
	}
	f.ociTar = filepath.Join(dir, "busybox-oci.tar")
	if out, err := exec.Command("tar", "-C", f.ociLayout, "-cf", f.ociTar, ".").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("tar layout: %w: %s", err, out)
	}
	f.squashfs = filepath.Join(dir, "busybox.sqsh")
	if out, err := exec.Command("mksquashfs", f.rootfs, f.squashfs, "-noappend", "-quiet", "-no-progress").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mksquashfs: %w: %s", err, out)
	}
	// Everything world-readable (layout.Write makes 0644/0755 already).
	if out, err := exec.Command("chmod", "-R", "a+rX", dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("chmod: %w: %s", err, out)
	}
	return f, nil
}

// buildBusyboxRootfs lays out busybox-static with its applet symlinks plus
// marker files: a setuid file, a file of another owner, an old mtime with
// nanoseconds, a hard link, a fifo and a device node (which conversion
// drops).
func buildBusyboxRootfs(root string) error {
	for _, d := range []string{"bin", "etc", "tmp", "data", "dev", "run"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), os.ModeSticky|0o777); err != nil {
		return err
	}
	bb := filepath.Join(root, "bin", "busybox")
	if err := copyFile("/bin/busybox", bb, 0o755); err != nil {
		return err
	}
	fi, err := os.Stat(bb)
	if err != nil {
		return err
	}
	busyboxSz = fi.Size()
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return err
	}
	for _, a := range strings.Fields(string(out)) {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
		"etc/motd":   "hello from the image\n",
		"data/owned": "owned by 1234:5678\n",
		"bin/suid":   "#!/bin/sh\n",
	}
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(root, n), []byte(body), 0o644); err != nil {
			return err
		}
	}
	if err := os.Chown(filepath.Join(root, "data/owned"), ownedUID, ownedGID); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Join(root, "bin/suid"), os.ModeSetuid|0o755); err != nil {
		return err
	}
	if err := os.Chtimes(filepath.Join(root, "etc/passwd"), motdTime, motdTime); err != nil {
		return err
	}
	if err := os.Link(bb, filepath.Join(root, "bin", "busybox-hardlink")); err != nil {
		return err
	}
	if out, err := exec.Command("mkfifo", filepath.Join(root, "run/fifo")).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfifo: %w: %s", err, out)
	}
	if out, err := exec.Command("mknod", filepath.Join(root, "dev/null"), "c", "1", "3").CombinedOutput(); err != nil {
		return fmt.Errorf("mknod: %w: %s", err, out)
	}
	return nil
}

type tarEntry struct {
	name, body, link string
	dir, symlink     bool
	hardlink         bool
	mode             int64
}

// writeTar writes a tar by hand, for layers no tool would make (escapes).
func writeTar(p string, entries []tarEntry) error {
	var buf bytes.Buffer
	if err := writeTarTo(&buf, entries); err != nil {
		return err
	}
	return os.WriteFile(p, buf.Bytes(), 0o644)
}

// registry is a real docker-registry (fixture.StartRegistry) on a free
// loopback port, storage in a temp dir.
type registry struct {
	host string // 127.0.0.1:PORT
}

func startRegistry(t *testing.T) *registry {
	t.Helper()
	return startRegistryAuth(t, "")
}

// startRegistryAuth starts a registry; with htpasswd (the path of a bcrypt
// htpasswd file) it requires HTTP basic authentication for everything.
func startRegistryAuth(t *testing.T, htpasswd string) *registry {
	t.Helper()
	return &registry{host: fixture.StartRegistry(t, htpasswd)}
}

func (r *registry) push(t *testing.T, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithContext(context.Background())); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref.String()
}

func (r *registry) pushIndex(t *testing.T, repoTag string, idx v1.ImageIndex) string {
	t.Helper()
	ref, err := name.ParseReference(r.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(context.Background())); err != nil {
		t.Fatalf("push index %s: %v", ref, err)
	}
	return ref.String()
}
