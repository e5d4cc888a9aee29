package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// diskView makes the content of an erofs disk visible as a directory: a
// read-only loop mount when the host allows it (what the guest does), else
// fsck.erofs --extract (which does not keep setuid bits).
func diskView(t *testing.T, disk string) (dir string, mounted bool) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "view")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "erofs", "-o", "loop,ro", disk, dir).CombinedOutput(); err == nil {
		t.Cleanup(func() {
			if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
				t.Errorf("umount %s: %v: %s", dir, err, out)
			}
		})
		return dir, true
	} else {
		t.Logf("loop mount of erofs not available (%v: %s); checking with fsck.erofs --extract", err, bytes.TrimSpace(out))
	}
	os.Remove(dir)
	if out, err := exec.Command("fsck.erofs", "--extract="+dir, disk).CombinedOutput(); err != nil {
		t.Fatalf("fsck.erofs --extract %s: %v: %s", disk, err, out)
	}
	return dir, false
}

func sha256File(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// checkBusybox asserts that dir holds the busybox fixture as converted:
// whiteout tells whether the image's second layer (deleting etc/motd,
// adding etc/added) applies.
func checkBusybox(t *testing.T, dir string, mounted, whiteout, secondsOnly bool) {
	t.Helper()
	if got, want := sha256File(t, filepath.Join(dir, "bin/busybox")), sha256File(t, "/bin/busybox"); got != want {
		t.Errorf("bin/busybox differs from /bin/busybox")
	}
	if l, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || l != "busybox" {
		t.Errorf("bin/sh: readlink = %q, %v; want busybox", l, err)
	}
	fi, err := os.Lstat(filepath.Join(dir, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	wantTime := motdTime
	if secondsOnly { // squashfs keeps whole seconds
		wantTime = motdTime.Truncate(time.Second)
	}
	if !fi.ModTime().Equal(wantTime) {
		t.Errorf("etc/passwd mtime %v, want %v", fi.ModTime().UTC(), wantTime)
	}
	fi, err = os.Lstat(filepath.Join(dir, "data/owned"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != ownedUID || int(st.Gid) != ownedGID {
		t.Errorf("data/owned owner %d:%d, want %d:%d", st.Uid, st.Gid, ownedUID, ownedGID)
	}
	fi, err = os.Lstat(filepath.Join(dir, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	if mounted && fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("tmp mode %v, want sticky", fi.Mode())
	}
	fi, err = os.Lstat(filepath.Join(dir, "bin/suid"))
	if err != nil {
		t.Fatal(err)
	}
	if mounted && fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("bin/suid mode %v, want setuid", fi.Mode())
	}
	if fi, err := os.Lstat(filepath.Join(dir, "run/fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("run/fifo: %v, %v; want a fifo", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "dev/null")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dev/null: %v; device nodes must be dropped", err)
	}
	if got, want := sha256File(t, filepath.Join(dir, "bin/busybox-hardlink")), sha256File(t, "/bin/busybox"); got != want {
		t.Errorf("bin/busybox-hardlink differs")
	}
	_, errMotd := os.Lstat(filepath.Join(dir, "etc/motd"))
	_, errAdded := os.Lstat(filepath.Join(dir, "etc/added"))
	if whiteout {
		if !errors.Is(errMotd, os.ErrNotExist) || errAdded != nil {
			t.Errorf("whiteout not applied: etc/motd: %v, etc/added: %v", errMotd, errAdded)
		}
	} else if errMotd != nil {
		t.Errorf("etc/motd: %v", errMotd)
	}
	// The tree is a working root filesystem.
	out, err := exec.Command("chroot", dir, "/bin/sh", "-c", "echo ok from $(basename $(readlink /bin/sh))").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok from busybox" {
		t.Errorf("chroot %s /bin/sh: %v: %q", dir, err, out)
	}
}

func TestPrepareSources(t *testing.T) {
	fx := fixtures(t)
	reg := startRegistry(t)
	reg.push(t, "test/busybox:1", fx.img)
	reg.push(t, "test/oci:1", fx.ociImg)
	// A multi-platform index: the arm64 image carries a marker that must
	// not show up here.
	marker := filepath.Join(t.TempDir(), "arm.tar")
	if err := writeTar(marker, []tarEntry{{name: "etc/arch-arm64", body: "arm64\n", mode: 0o644}}); err != nil {
		t.Fatal(err)
	}
	ml, err := tarball.LayerFromFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	arm, err := mutate.AppendLayers(fx.img, ml)
	if err != nil {
		t.Fatal(err)
	}
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: fx.img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	reg.pushIndex(t, "test/multi:1", idx)

	dockerID, _ := fx.img.ConfigName()
	dockerManifest, _ := fx.img.Digest()
	ociManifest, _ := fx.ociImg.Digest()
	sq := "sha256:" + sha256File(t, fx.squashfs)

	cases := []struct {
		name     string
		ref      string
		kind     Kind
		digest   string // "" = any sha256
		whiteout bool   // an OCI image (two layers, config)
	}{
		{"root filesystem directory", fx.rootfs, KindRootfs, "", false},
		{"docker save archive", fx.docker, KindDockerArchive, dockerID.String(), true},
		{"OCI layout directory", fx.ociLayout, KindOCILayout, ociManifest.String(), true},
		{"OCI archive", fx.ociTar, KindOCIArchive, ociManifest.String(), true},
		{"squashfs file", fx.squashfs, KindSquashfs, sq, false},
		{"registry docker:// reference", "docker://" + reg.host + "/test/busybox:1", KindRegistry, dockerManifest.String(), true},
		{"registry bare reference", reg.host + "/test/oci:1", KindRegistry, ociManifest.String(), true},
		{"registry host#repo reference", reg.host + "#test/busybox:1", KindRegistry, dockerManifest.String(), true},
		{"registry multi-platform index", reg.host + "/test/multi:1", KindRegistry, dockerManifest.String(), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			o := opts(t)
			if err := Check(ctx, tc.ref, o); err != nil {
				t.Fatalf("Check: %v", err)
			}
			start := time.Now()
			img, err := Prepare(ctx, tc.ref, o)
			uncached := time.Since(start)
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			if img.Kind != tc.kind || img.Cached || img.Ref != tc.ref {
				t.Errorf("Prepare = kind %s cached %v ref %q; want kind %s, not cached, ref %q", img.Kind, img.Cached, img.Ref, tc.kind, tc.ref)
			}
			if _, err := digestHex(img.Digest); err != nil || (tc.digest != "" && img.Digest != tc.digest) {
				t.Errorf("digest %q, want %q", img.Digest, tc.digest)
			}
			wantDisk := filepath.Join(o.CacheRoot, fmt.Sprint(o.UID), strings.TrimPrefix(img.Digest, "sha256:")+".erofs")
			if img.Disk != wantDisk {
				t.Errorf("disk %s, want %s", img.Disk, wantDisk)
			}
			fi, err := os.Stat(img.Disk)
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || fi.Mode().Perm() != 0o444 || fi.Size() != img.Size {
				t.Errorf("disk owner %d mode %v size %d; want root, 0444, %d", st.Uid, fi.Mode(), fi.Size(), img.Size)
			}
			if di, err := os.Stat(filepath.Dir(img.Disk)); err != nil || di.Mode().Perm() != 0o700 {
				t.Errorf("user cache dir: %v %v; want 0700", di.Mode(), err)
			}
			if tc.whiteout {
				want := Config{Env: fx.config.Env, WorkingDir: fx.config.WorkingDir, Entrypoint: fx.config.Entrypoint, Cmd: fx.config.Cmd, User: fx.config.User}
				if g, w := mustJSON(img.Config), mustJSON(want); g != w {
					t.Errorf("config %s, want %s", g, w)
				}
			}

			// Second Prepare: a cache hit, and mkfs.erofs cannot run.
			o2 := o
			o2.MkfsErofs = "/nonexistent/mkfs.erofs"
			start = time.Now()
			img2, err := Prepare(ctx, tc.ref, o2)
			cached := time.Since(start)
			if err != nil {
				t.Fatalf("second Prepare: %v", err)
			}
			if !img2.Cached || img2.Disk != img.Disk || img2.Digest != img.Digest || mustJSON(img2.Config) != mustJSON(img.Config) {
				t.Errorf("second Prepare = %+v; want a cache hit of %+v", img2, img)
			}
			fi2, _ := os.Stat(img.Disk)
			if !os.SameFile(fi, fi2) || !fi.ModTime().Equal(fi2.ModTime()) {
				t.Errorf("the cached disk was rewritten")
			}
			t.Logf("MEASURE %s: prepare uncached %v, cached %v, disk %d bytes", tc.name, uncached.Round(time.Millisecond), cached.Round(time.Millisecond), img.Size)

			dir, mounted := diskView(t, img.Disk)
			checkBusybox(t, dir, mounted, tc.whiteout, tc.kind == KindSquashfs)
			if _, err := os.Lstat(filepath.Join(dir, "etc/arch-arm64")); err == nil {
				t.Errorf("the arm64 variant was converted")
			}
		})
	}
}

// rewriteTar copies a tar, passing each regular member through edit.
func rewriteTar(t *testing.T, in []byte, edit func(name string, body []byte) []byte) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(in))
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			body = edit(hdr.Name, body)
			hdr.Size = int64(len(body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	return out.Bytes()
}

func docker2manifest(t *testing.T, archive []byte) []byte {
	t.Helper()
	a, err := indexTar(bytes.NewReader(archive), int64(len(archive)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := a.readFile("manifest.json", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// openTempDir is a temporary directory every user can enter (t.TempDir's
// parent is private to root), removed at the end of the test.
func openTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "image-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestPrepareConcurrent: three goroutines and two other processes prepare
// the same uncached image at once; exactly one converts it.
func TestPrepareConcurrent(t *testing.T) {
	fx := fixtures(t)
	o := opts(t)
	// A slow mkfs.erofs widens the window in which the others must wait.
	wrapper := filepath.Join(t.TempDir(), "slow-mkfs.erofs")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nsleep 0.5\nexec mkfs.erofs \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	o.MkfsErofs = wrapper
	childOpts := o
	childOpts.Logger = nil
	env := append(os.Environ(), envPrepare+"="+fx.docker, "IMAGE_TEST_OPTIONS="+mustJSON(childOpts))

	type result struct {
		img *Image
		err error
	}
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			img, err := Prepare(context.Background(), fx.docker, o)
			mu.Lock()
			results = append(results, result{img, err})
			mu.Unlock()
		})
	}
	for range 2 {
		wg.Go(func() {
			cmd := exec.Command(testBin)
			cmd.Env = env
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			var img Image
			if err == nil {
				err = json.Unmarshal(out, &img)
			} else {
				err = fmt.Errorf("%w: %s", err, stderr.String())
			}
			mu.Lock()
			results = append(results, result{&img, err})
			mu.Unlock()
		})
	}
	wg.Wait()
	converted := 0
	for _, r := range results {
		if r.err != nil {
			t.Fatalf("Prepare: %v", r.err)
		}
		if !r.img.Cached {
			converted++
		}
		if r.img.Disk != results[0].img.Disk {
			t.Errorf("disks differ: %s, %s", r.img.Disk, results[0].img.Disk)
		}
	}
	if converted != 1 {
		t.Errorf("%d of %d Prepare calls converted the image; want exactly 1", converted, len(results))
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(results[0].img.Disk), tmpPrefix+"*"))
	if len(left) != 0 {
		t.Errorf("work directories left behind: %v", left)
	}
}

func TestPrepareErrors(t *testing.T) {
	fx := fixtures(t)
	reg := startRegistry(t)
	reg.push(t, "test/busybox:1", fx.img)
	dir := openTempDir(t)
	write := func(name string, b []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	docker := read(fx.docker)
	ociTar := read(fx.ociTar)
	sqsh := read(fx.squashfs)

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(docker)
	zw.Close()

	// A docker archive whose first layer has one byte changed (same size):
	// Check cannot see it, Prepare must.
	tampered := append([]byte(nil), docker...)
	{
		a, err := indexTar(bytes.NewReader(tampered), int64(len(tampered)))
		if err != nil {
			t.Fatal(err)
		}
		var m []struct{ Layers []string }
		b, _ := a.readFile("manifest.json", 1<<20)
		json.Unmarshal(b, &m)
		mem, err := a.member(m[0].Layers[0])
		if err != nil {
			t.Fatal(err)
		}
		tampered[mem.off+mem.size/2] ^= 0xff
	}
	// A docker archive whose first layer is replaced by another valid
	// gzip'd tar: only the diff_id check can tell.
	swapped := rewriteTar(t, docker, func(name string, body []byte) []byte {
		var m []struct{ Layers []string }
		json.Unmarshal(docker2manifest(t, docker), &m)
		if name != m[0].Layers[0] {
			return body
		}
		var tb, zb bytes.Buffer
		writeTarTo(&tb, []tarEntry{{name: "etc/evil", body: "swapped\n"}})
		zw := gzip.NewWriter(&zb)
		zw.Write(tb.Bytes())
		zw.Close()
		return zb.Bytes()
	})
	// A squashfs with an intact superblock and garbage in the middle.
	broken := append([]byte(nil), sqsh...)
	for i := len(broken) / 3; i < len(broken)*2/3; i++ {
		broken[i] = 0x5a
	}
	// An OCI layout with a layer blob missing.
	brokenLayout := filepath.Join(dir, "layout-missing-blob")
	if out, err := exec.Command("cp", "-a", fx.ociLayout, brokenLayout).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	lay, _ := fx.ociImg.Layers()
	ld, _ := lay[0].Digest()
	os.Remove(filepath.Join(brokenLayout, "blobs/sha256", ld.Hex))
	// A root filesystem with a file the user cannot read.
	unreadableTree := filepath.Join(dir, "rootfs-unreadable")
	os.MkdirAll(filepath.Join(unreadableTree, "etc"), 0o755)
	os.MkdirAll(filepath.Join(unreadableTree, "usr"), 0o755)
	os.WriteFile(filepath.Join(unreadableTree, "etc/shadow"), []byte("x"), 0o600)
	emptyDir := filepath.Join(dir, "empty")
	os.Mkdir(emptyDir, 0o755)
	fifo := filepath.Join(dir, "fifo")
	syscall.Mkfifo(fifo, 0o644)
	private := filepath.Join(dir, "private")
	os.Mkdir(private, 0o700)
	os.WriteFile(filepath.Join(private, "img.tar"), docker, 0o644)

	cases := []struct {
		name    string
		ref     string
		class   error
		want    string // substring of the message
		checkOK bool   // Check (fast) accepts it; only Prepare finds the fault
	}{
		{"missing file", "/nonexistent/dir/image.tar", ErrNotFound,
			`image "/nonexistent/dir/image.tar": no such file (a local image must be an existing OCI archive, OCI layout, squashfs file or root filesystem directory)`, false},
		{"missing relative file", "./no/such/image.sqsh", ErrNotFound, "no such file", false},
		{"truncated docker archive", write("trunc-docker.tar", docker[:len(docker)/2], 0o644), ErrCorrupt, "truncated", false},
		{"truncated OCI archive", write("trunc-oci.tar", ociTar[:len(ociTar)*2/3], 0o644), ErrCorrupt, "", false},
		{"tampered layer", write("tampered.tar", tampered, 0o644), ErrCorrupt, "", true},
		{"layer swapped (valid gzip, wrong diff_id)", write("swapped.tar", swapped, 0o644), ErrCorrupt, "does not match its digest", true},
		{"truncated squashfs", write("trunc.sqsh", sqsh[:len(sqsh)*2/3], 0o644), ErrCorrupt, "truncated squashfs", false},
		{"empty file", write("empty.tar", nil, 0o644), ErrCorrupt, "empty file", false},
		{"damaged squashfs", write("broken.sqsh", broken, 0o644), ErrCorrupt, "unsquashfs", true},
		{"garbage file", write("garbage.img", bytes.Repeat([]byte("garbage!"), 1000), 0o644), ErrUnsupported, "not a recognised image", false},
		{"gzip-compressed archive", write("docker.tar.gz", gz.Bytes(), 0o644), ErrUnsupported, "compressed", false},
		{"tar that is not an image", fx.dir + "/layer2.tar", ErrUnsupported, "neither a docker save archive", false},
		{"OCI layout missing a blob", brokenLayout, ErrCorrupt, "missing", false},
		{"empty directory", emptyDir, ErrCorrupt, "empty directory", false},
		{"fifo", fifo, ErrUnsupported, "named pipe", false},
		{"file of another user, mode 0600", write("root-private.tar", docker, 0o600), ErrPermission, "must be readable by the job's user", false},
		{"file in a directory the user cannot enter", filepath.Join(private, "img.tar"), ErrPermission, "permission denied", false},
		{"root filesystem with an unreadable file", unreadableTree, ErrPermission, "etc/shadow: permission denied", false},
		{"unknown repository", "docker://" + reg.host + "/no/such:1", ErrNotFound, "not found in the registry", false},
		{"unknown tag", reg.host + "/test/busybox:nope", ErrNotFound, "not found in the registry", false},
		{"invalid reference", "Not A Reference!", ErrInvalidRef, "must be absolute or start with ./ or ../", false},
		{"unknown scheme", "ftp://host/x", ErrInvalidRef, "unknown scheme", false},
		{"registry credentials in reference", "user@" + reg.host + "/test/busybox:1", ErrInvalidRef, "credentials", false},
		{"unreachable registry", "127.0.0.1:1/test/busybox:1", ErrRegistry, "cannot reach the registry", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			o := opts(t)
			check := func(what string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s(%q) succeeded; want %v", what, tc.ref, tc.class)
				}
				if !errors.Is(err, tc.class) {
					t.Errorf("%s: error %q is not %v", what, err, tc.class)
				}
				var e *Error
				if !errors.As(err, &e) || e.Ref != tc.ref {
					t.Errorf("%s: error %q does not name the input %q", what, err, tc.ref)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: error %q does not contain %q", what, err, tc.want)
				}
				t.Logf("%s: %v", what, err)
			}
			err := Check(ctx, tc.ref, o)
			if tc.checkOK {
				if err != nil {
					t.Errorf("Check: %v; want nil (only Prepare detects this)", err)
				}
			} else {
				check("Check", err)
			}
			_, err = Prepare(ctx, tc.ref, o)
			check("Prepare", err)
			if entries, _ := List(o.CacheRoot, o.UID, true); len(entries) != 0 {
				t.Errorf("a failed Prepare left cache entries: %+v", entries)
			}
			left, _ := filepath.Glob(filepath.Join(o.CacheRoot, "*", tmpPrefix+"*"))
			if len(left) != 0 {
				t.Errorf("work directories left behind: %v", left)
			}
		})
	}
}

// TestLocalFileHint: a bare name that is a local file is a registry
// reference (pyxis' rule), and Check, run as the user, says how to mean the
// file.
func TestLocalFileHint(t *testing.T) {
	dir := openTempDir(t)
	t.Chdir(dir)
	if err := os.WriteFile("image.sqsh", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := Options{UID: uint32(os.Geteuid()), CacheRoot: filepath.Join(dir, "cache"), Helper: []string{testBin}, HelperEnv: []string{envHelper + "=1"}}
	err := Check(context.Background(), "127.0.0.1:1#image.sqsh", o)
	if err != nil {
		t.Fatalf("unreachable registry: Check = %v; want nil (a warning)", err)
	}
	err = Check(context.Background(), "image.sqsh:bad:tag", o)
	if !errors.Is(err, ErrInvalidRef) {
		t.Fatalf("Check = %v; want ErrInvalidRef", err)
	}
	if err := os.WriteFile("image.sqsh:bad:tag", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = Check(context.Background(), "image.sqsh:bad:tag", o)
	if !errors.Is(err, ErrInvalidRef) || !strings.Contains(err.Error(), "write ./image.sqsh:bad:tag") {
		t.Errorf("Check = %v; want ErrInvalidRef with a ./ hint", err)
	}
	// A bare name that is a local file is refused before any registry
	// is asked, reachable or not.
	err = Check(context.Background(), "image.sqsh", o)
	if !errors.Is(err, ErrInvalidRef) || !strings.Contains(err.Error(), "write ./image.sqsh") {
		t.Errorf("Check(bare local name) = %v; want ErrInvalidRef with a ./ hint", err)
	}
	for _, ref := range []string{"oci-archive:/tmp/x.tar", "docker-archive:x.tar", "dir:/srv/rootfs"} {
		err = Check(context.Background(), ref, o)
		if !errors.Is(err, ErrInvalidRef) || !strings.Contains(err.Error(), "transport prefix") {
			t.Errorf("Check(%q) = %v; want ErrInvalidRef naming the transport prefix", ref, err)
		}
	}
	// A directory that is no root filesystem (say /etc) is refused.
	if err := os.MkdirAll("notroot/conf.d", 0o755); err != nil {
		t.Fatal(err)
	}
	err = Check(context.Background(), "./notroot", o)
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "not a root filesystem") {
		t.Errorf("Check(./notroot) = %v; want ErrUnsupported", err)
	}
}

// TestUserCredentials: a path is read with the job user's rights, not
// root's: the owner's 0600 file converts for the owner and is refused to
// another user.
func TestUserCredentials(t *testing.T) {
	fx := fixtures(t)
	dir := openTempDir(t)
	p := filepath.Join(dir, "mine.tar")
	if err := copyFile(fx.docker, p, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, int(testUID), int(testGID)); err != nil {
		t.Fatal(err)
	}
	o := opts(t)
	img, err := Prepare(context.Background(), p, o)
	if err != nil {
		t.Fatalf("owner: Prepare: %v", err)
	}
	if img.Kind != KindDockerArchive {
		t.Errorf("kind %s", img.Kind)
	}
	other := o
	other.UID, other.GID, other.Groups = 65534, 65534, nil // nobody
	if _, err := Prepare(context.Background(), p, other); !errors.Is(err, ErrPermission) {
		t.Errorf("nobody: Prepare = %v; want ErrPermission", err)
	}
	if err := Check(context.Background(), p, other); !errors.Is(err, ErrPermission) {
		t.Errorf("nobody: Check = %v; want ErrPermission", err)
	}
	// Caches are per user: nobody's cache holds nothing of the owner's.
	if entries, _ := List(o.CacheRoot, 65534, false); len(entries) != 0 {
		t.Errorf("nobody's cache: %+v", entries)
	}
	// A supplementary group grants access the primary gid does not.
	if err := os.Chown(p, 0, int(testGID)); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, 0o640)
	grp := other
	grp.Groups = []uint32{testGID}
	if err := Check(context.Background(), p, grp); err != nil {
		t.Errorf("nobody with group %d: Check = %v; want nil", testGID, err)
	}
}

func TestListRemove(t *testing.T) {
	fx := fixtures(t)
	o := opts(t)
	ctx := context.Background()
	a, err := Prepare(ctx, fx.docker, o)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Prepare(ctx, fx.squashfs, o)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := List(o.CacheRoot, o.UID, false)
	if err != nil || len(entries) != 2 {
		t.Fatalf("List = %+v, %v; want 2 entries", entries, err)
	}
	if _, err := Remove(ctx, o.CacheRoot, o.UID, "sha256:0123"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Remove of a short prefix = %v; want ErrNotFound", err)
	}
	removed, err := Remove(ctx, o.CacheRoot, o.UID, strings.TrimPrefix(a.Digest, "sha256:")[:12])
	if err != nil || len(removed) != 1 || removed[0].Digest != a.Digest {
		t.Fatalf("Remove by digest prefix = %+v, %v", removed, err)
	}
	if removed, err := Remove(ctx, o.CacheRoot, o.UID, b.Ref); err != nil || len(removed) != 1 {
		t.Fatalf("Remove by reference = %+v, %v", removed, err)
	}
	if entries, _ := List(o.CacheRoot, o.UID, true); len(entries) != 0 {
		t.Errorf("after Remove: %+v", entries)
	}
	if locks := lockFiles(t, o.CacheRoot, o.UID); len(locks) != 0 {
		t.Errorf("after Remove: lock files %q left", locks)
	}
	// The user's directory went with its last image.
	if left, err := os.ReadDir(o.CacheRoot); err != nil || len(left) != 0 {
		t.Errorf("after removing every image: %s holds %v (%v); want it empty", o.CacheRoot, left, err)
	}
	again, err := Prepare(ctx, fx.docker, o)
	if err != nil || again.Cached {
		t.Errorf("Prepare after Remove = %+v, %v; want a fresh conversion", again, err)
	}
}

// TestConfine: a tool run through runConfined writes in its directory and
// nowhere else, though it runs as root.
func TestConfine(t *testing.T) {
	needRoot(t)
	o := opts(t)
	work := t.TempDir()
	outside := t.TempDir()
	out, err := o.runConfined(context.Background(), work, []string{"sh", "-c", "touch " + work + "/inside && touch " + outside + "/outside"})
	if err == nil {
		t.Fatalf("write outside the work directory succeeded: %s", out)
	}
	if !strings.Contains(string(out), "Read-only file system") {
		t.Errorf("output %q; want a read-only file system error", out)
	}
	if _, err := os.Stat(filepath.Join(work, "inside")); err != nil {
		t.Errorf("write inside the work directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "outside")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file was written outside: %v", err)
	}
}
