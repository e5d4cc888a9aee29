package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func writeTarTo(w io.Writer, entries []tarEntry) error {
	tw := tar.NewWriter(w)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: e.mode, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		switch {
		case e.dir:
			hdr.Typeflag = tar.TypeDir
		case e.symlink:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.link
		case e.hardlink:
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, e.link
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(e.body))
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// TestExtractConfined feeds the extractor hostile tar streams (as a
// malicious helper or layer could) and checks nothing lands outside the
// target: ".." names are refused; symlinks, absolute or relative, resolve
// inside the target as they would in the guest (a symlink to a host
// directory leads to that path inside the target, created there).
func TestExtractConfined(t *testing.T) {
	needRoot(t)
	in := func(outside, p string) string { return strings.TrimPrefix(outside, "/") + "/" + p }
	cases := []struct {
		name    string
		entries func(outside string) []tarEntry
		wantErr bool
		inside  func(outside string) string // a path that must exist inside the target afterwards
	}{
		{"dot-dot name", func(string) []tarEntry {
			return []tarEntry{{name: "../escaped", body: "x"}}
		}, true, nil},
		{"dot-dot in the middle", func(string) []tarEntry {
			return []tarEntry{{name: "a/../../escaped", body: "x"}}
		}, true, nil},
		{"absolute symlink to an outside directory, file through it", func(outside string) []tarEntry {
			return []tarEntry{{name: "abs", symlink: true, link: outside}, {name: "abs/escaped", body: "x"}}
		}, false, func(o string) string { return in(o, "escaped") }},
		{"symlink to /, file through it", func(string) []tarEntry {
			return []tarEntry{{name: "root", symlink: true, link: "/"}, {name: "root/escaped", body: "x"}}
		}, false, func(string) string { return "escaped" }},
		{"relative symlink climbing out, file through it", func(string) []tarEntry {
			return []tarEntry{{name: "d/", dir: true, mode: 0o755}, {name: "d/up", symlink: true, link: "../../../../../.."}, {name: "d/up/escaped", body: "x"}}
		}, false, func(string) string { return "escaped" }},
		{"symlink replaced by a file", func(outside string) []tarEntry {
			return []tarEntry{{name: "f", symlink: true, link: outside + "/escaped"}, {name: "f", body: "x"}}
		}, false, func(string) string { return "f" }},
		{"hard link to an outside file", func(outside string) []tarEntry {
			return []tarEntry{{name: "hl", hardlink: true, link: "../outside/secret"}}
		}, true, nil},
		{"hard link through a symlink to /", func(outside string) []tarEntry {
			return []tarEntry{{name: "root", symlink: true, link: "/"}, {name: "hl", hardlink: true, link: "root/etc/passwd"}}
		}, true, nil},
		{"directory through an absolute symlink", func(outside string) []tarEntry {
			return []tarEntry{{name: "abs", symlink: true, link: outside}, {name: "abs/sub/", dir: true, mode: 0o755}}
		}, false, func(o string) string { return in(o, "sub") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			target := filepath.Join(base, "target")
			outside := filepath.Join(base, "outside")
			os.Mkdir(target, 0o755)
			os.Mkdir(outside, 0o755)
			os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600)
			before := listTree(t, base, target)

			var buf bytes.Buffer
			if err := writeTarTo(&buf, tc.entries(outside)); err != nil {
				t.Fatal(err)
			}
			x, err := newExtractor(target, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			err = x.extractStream(context.Background(), &buf, nil)
			x.Close()
			if tc.wantErr != (err != nil) {
				t.Errorf("extract: err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, ErrCorrupt) {
				t.Errorf("error %v is not ErrCorrupt", err)
			}
			if after := listTree(t, base, target); after != before {
				t.Errorf("outside the target changed:\nbefore %s\nafter  %s", before, after)
			}
			if _, err := os.Stat("/escaped"); err == nil {
				t.Errorf("/escaped exists on the host")
			}
			if tc.inside != nil {
				p := tc.inside(outside)
				fi, err := os.Lstat(filepath.Join(target, p))
				if err != nil || fi.Mode()&os.ModeSymlink != 0 {
					t.Errorf("%s inside the target: %v, %v", p, fi, err)
				}
			}
		})
	}
}

// listTree describes everything under base except target.
func listTree(t *testing.T, base, target string) string {
	t.Helper()
	var b strings.Builder
	filepath.Walk(base, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if p == target {
			return filepath.SkipDir
		}
		b.WriteString(p + " " + fi.Mode().String() + " " + fi.ModTime().String() + ";")
		return nil
	})
	return b.String()
}

// TestPrepareHostileLayers: the same through a whole image: ".." names
// are refused; a file below a symlink of the same layer is written where
// the symlink leads inside the image (containerd's rule); nothing is
// written outside either way.
func TestPrepareHostileLayers(t *testing.T) {
	fx := fixtures(t)
	outside := t.TempDir()
	cases := []struct {
		name    string
		entries []tarEntry
		class   error  // nil: Prepare succeeds
		inImage string // where the file lands in the image
	}{
		{"dot-dot name", []tarEntry{{name: "../../../../tmp/escaped-dotdot", body: "x"}}, ErrCorrupt, ""},
		{"file through an absolute symlink", []tarEntry{{name: "abs", symlink: true, link: outside}, {name: "abs/escaped", body: "x"}}, nil, strings.TrimPrefix(outside, "/") + "/escaped"},
		{"file through a symlink to /", []tarEntry{{name: "root", symlink: true, link: "/"}, {name: "root/tmp/escaped-root", body: "x"}}, nil, "tmp/escaped-root"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := openTempDir(t)
			lt := filepath.Join(dir, "layer.tar")
			if err := writeTar(lt, tc.entries); err != nil {
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
			p := filepath.Join(dir, "hostile.tar")
			if err := tarball.WriteToFile(p, name.MustParseReference("test/hostile:1"), img); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, 0o644)
			res, err := Prepare(context.Background(), p, opts(t))
			if tc.class == nil && err != nil || tc.class != nil && !errors.Is(err, tc.class) {
				t.Errorf("Prepare = %v; want %v", err, tc.class)
			}
			t.Logf("Prepare: %v", err)
			for _, q := range []string{filepath.Join(outside, "escaped"), "/tmp/escaped-dotdot", "/tmp/escaped-root"} {
				if _, err := os.Lstat(q); err == nil {
					t.Errorf("%s was written on the host", q)
				}
			}
			if res != nil {
				view, _ := diskView(t, res.Disk)
				if b, err := os.ReadFile(filepath.Join(view, tc.inImage)); err != nil || string(b) != "x" {
					t.Errorf("%s in the image: %q, %v; want the file written through the symlink", tc.inImage, b, err)
				}
			}
		})
	}
}

// TestTreeDigest: the digest the helper computes by walking a directory
// equals the one root recomputes from the tar it streams, and changes
// with any metadata.
func TestTreeDigest(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "a/b"), 0o755)
	os.Mkdir(filepath.Join(root, "usr"), 0o755)
	os.WriteFile(filepath.Join(root, "a/f"), []byte("hello"), 0o644)
	os.Symlink("f", filepath.Join(root, "a/l"))
	os.Link(filepath.Join(root, "a/f"), filepath.Join(root, "a/hard"))
	digest := func() string {
		r, err := probePath(root, true)
		if err != nil {
			t.Fatal(err)
		}
		return r.Digest
	}
	walked := digest()
	var buf bytes.Buffer
	streamed, err := writeTreeTar(root, &buf)
	if err != nil {
		t.Fatal(err)
	}
	th := newTreeHeaderHasher()
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := th.add(hdr); err != nil {
			t.Fatal(err)
		}
	}
	if walked != streamed || streamed != th.digest() {
		t.Fatalf("walk %s, stream %s, headers %s: want equal", walked, streamed, th.digest())
	}
	for _, change := range []func(){
		func() { os.Chmod(filepath.Join(root, "a/f"), 0o600) },
		func() { os.Chtimes(filepath.Join(root, "a/f"), time.Unix(1, 5), time.Unix(1, 5)) },
		func() { os.WriteFile(filepath.Join(root, "a/f"), []byte("hello!"), 0o600) },
		func() { os.Remove(filepath.Join(root, "a/l")); os.Symlink("b", filepath.Join(root, "a/l")) },
	} {
		prev := digest()
		change()
		if digest() == prev {
			t.Errorf("digest unchanged after a metadata change")
		}
	}
}

func TestReferenceRules(t *testing.T) {
	cases := []struct {
		ref   string
		local bool
		name  string // parsed registry reference, "" when invalid or local
	}{
		{"/abs/image.sqsh", true, ""},
		{"./rel.tar", true, ""},
		{"../up/dir", true, ""},
		{"image.tar", false, "index.docker.io/library/image.tar:latest"},
		{"docker://localhost:5000/repo:tag", false, "localhost:5000/repo:tag"},
		{"localhost:5000/repo:tag", false, "localhost:5000/repo:tag"},
		{"nvcr.io#nvidia/pytorch:24.01", false, "nvcr.io/nvidia/pytorch:24.01"},
		{"ubuntu", false, "index.docker.io/library/ubuntu:latest"},
		{"UPPER/case", false, ""},
		{"docker://", false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.ref, func(t *testing.T) {
			if got := isLocal(tc.ref); got != tc.local {
				t.Fatalf("isLocal(%q) = %v", tc.ref, got)
			}
			if tc.local {
				return
			}
			r, err := parseRegistryRef(tc.ref, false)
			if tc.name == "" {
				if !errors.Is(err, ErrInvalidRef) {
					t.Errorf("parse = %v, %v; want ErrInvalidRef", r, err)
				}
				return
			}
			if err != nil || r.Name() != tc.name {
				t.Errorf("parse = %v, %v; want %s", r, err, tc.name)
			}
		})
	}
	if !loopbackRegistry("127.0.0.1:5000/x") || !loopbackRegistry("localhost:1/x") || !loopbackRegistry("[::1]:5000/x") || loopbackRegistry("10.0.0.1:5000/x") {
		t.Errorf("loopbackRegistry misclassifies")
	}
}
