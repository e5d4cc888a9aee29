package driverset

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// discovered lays out a tree with layout and discovers it.
func discovered(t *testing.T, layout func(testing.TB, string) *tree) (*tree, *Set) {
	t.Helper()
	needTools(t)
	tr := layout(t, filepath.Join(t.TempDir(), "root"))
	s, err := Discover(context.Background(), Options{Root: tr.root, KernelRelease: testRelease})
	if err != nil {
		t.Fatal(err)
	}
	return tr, s
}

func xzDKMS(t testing.TB, root string) *tree { return nvidiaDKMS(t, root, "xz") }

// entries lists the cache's entries and leftovers, by name.
func entries(t *testing.T, cache string) []string {
	t.Helper()
	ents, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if e.Name() != ".lock" {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestBuildLayout(t *testing.T) {
	tr, s := discovered(t, xzDKMS)
	cache := filepath.Join(t.TempDir(), "cache")
	b, err := Build(context.Background(), s, cache)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.Key, testVersion+"-") || !keyRE.MatchString(b.Key) || b.Dir != filepath.Join(cache, b.Key) {
		t.Errorf("key %q dir %q", b.Key, b.Dir)
	}
	wantMods := []BuiltModule{{Name: "nvidia", File: "modules/nvidia.ko"}, {Name: "nvidia_uvm", File: "modules/nvidia_uvm.ko"}}
	if !reflect.DeepEqual(b.Modules, wantMods) || b.FirmwareDir != "firmware" || b.LibDir != "lib64" || b.BinDir != "bin" {
		t.Errorf("built %+v", b)
	}
	// Decompressed modules are what xz -dc makes of the sources.
	for _, m := range s.Modules {
		want, err := exec.Command("xz", "-dc", m.Path).Output()
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(b.Dir, "modules", m.Name+".ko"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("modules/%s.ko (%d bytes) differs from xz -dc %s (%d bytes)", m.Name, len(got), m.Path, len(want))
		}
	}
	for _, g := range gsp {
		got, err := os.ReadFile(filepath.Join(b.Dir, "firmware", g))
		if err != nil || string(got) != "GSP firmware "+g {
			t.Errorf("firmware %s: %q, %v", g, got, err)
		}
	}
	links := map[string]string{
		"libcuda.so.1": "libcuda.so." + testVersion, "libcuda.so": "libcuda.so.1",
		"libnvidia-nvvm.so.4": "libnvidia-nvvm.so." + testVersion, "libnvidia-nvvm.so": "libnvidia-nvvm.so.4",
		"libnvidia-gpucomp.so": "libnvidia-gpucomp.so." + testVersion,
	}
	for link, target := range links {
		got, err := os.Readlink(filepath.Join(b.Dir, "lib64", link))
		if err != nil || got != target {
			t.Errorf("lib64/%s -> %q (%v), want %q", link, got, err, target)
		}
	}
	if _, err := os.Lstat(filepath.Join(b.Dir, "lib64", "libnvidia-gpucomp.so."+testVersion)); err != nil {
		t.Error(err)
	}
	lib := filepath.Join(b.Dir, "lib64", "libcuda.so."+testVersion)
	src := tr.path("usr/lib/x86_64-linux-gnu/libcuda.so." + testVersion)
	if a, _ := os.ReadFile(lib); !bytes.Equal(a, must(os.ReadFile(src))) {
		t.Errorf("%s differs from %s", lib, src)
	}
	if fi, err := os.Stat(filepath.Join(b.Dir, "bin", "nvidia-smi")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("bin/nvidia-smi: %v %v", fi, err)
	}
	var back Set
	if err := json.Unmarshal(must(os.ReadFile(filepath.Join(b.Dir, "set.json"))), &back); err != nil || !reflect.DeepEqual(&back, s) {
		t.Errorf("set.json: %v\n%+v\nwant %+v", err, back, s)
	}
	if got := entries(t, cache); !slices.Equal(got, []string{b.Key}) {
		t.Errorf("cache holds %q", got)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestBuildCacheHitAndChange(t *testing.T) {
	tr, s := discovered(t, runInstaller)
	cache := t.TempDir()
	ctx := context.Background()
	b1, err := Build(ctx, s, cache)
	if err != nil {
		t.Fatal(err)
	}
	setJSON := filepath.Join(b1.Dir, "set.json")
	before := must(os.Stat(setJSON))
	// Same set, same files: the same entry, nothing copied again.
	b2, err := Build(ctx, s, cache)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(b1, b2) {
		t.Errorf("second build %+v, first %+v", b2, b1)
	}
	if after := must(os.Stat(setJSON)); !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("the entry was written again on a cache hit")
	}
	// A rediscovered set of unchanged files has the same key.
	s2, err := Discover(ctx, Options{Root: tr.root, KernelRelease: testRelease})
	if err != nil {
		t.Fatal(err)
	}
	if b3, err := Build(ctx, s2, cache); err != nil || b3.Key != b1.Key {
		t.Errorf("rediscovered: %v, key %v want %s", err, b3, b1.Key)
	}
	// A reinstalled library (new mtime) makes a new entry.
	lib := tr.path("usr/lib64/libcuda.so." + testVersion)
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(lib, later, later); err != nil {
		t.Fatal(err)
	}
	b4, err := Build(ctx, s, cache)
	if err != nil {
		t.Fatal(err)
	}
	if b4.Key == b1.Key {
		t.Errorf("changed libcuda, same key %s", b4.Key)
	}
	// Module parameters are part of the key.
	s.Modules[0].Params = "NVreg_EnableGpuFirmware=0"
	b5, err := Build(ctx, s, cache)
	if err != nil {
		t.Fatal(err)
	}
	if b5.Key == b4.Key || b5.Modules[0].Params != "NVreg_EnableGpuFirmware=0" {
		t.Errorf("changed params: key %s (was %s), modules %+v", b5.Key, b4.Key, b5.Modules)
	}
}

func TestBuildConcurrent(t *testing.T) {
	_, s := discovered(t, runInstaller)
	cache := t.TempDir()
	const n = 4
	var wg sync.WaitGroup
	built := make([]*Built, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			built[i], errs[i] = Build(context.Background(), s, cache)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if built[i].Dir != built[0].Dir {
			t.Errorf("builder %d got %s, builder 0 %s", i, built[i].Dir, built[0].Dir)
		}
	}
	if got := entries(t, cache); !slices.Equal(got, []string{built[0].Key}) {
		t.Errorf("cache holds %q, want only %s (losers' copies discarded)", got, built[0].Key)
	}
	if _, err := os.Stat(filepath.Join(built[0].Dir, "modules", "nvidia.ko")); err != nil {
		t.Error(err)
	}
}

func TestBuildPruneKeepsInUse(t *testing.T) {
	tr, s := discovered(t, gpuOperator)
	cache := t.TempDir()
	ctx := context.Background()
	fw := tr.path("lib/firmware/" + gsp[0])
	build := func(i int) *Built {
		t.Helper()
		ts := time.Unix(1700000000+int64(i), 0)
		if err := os.Chtimes(fw, ts, ts); err != nil {
			t.Fatal(err)
		}
		b, err := Build(ctx, s, cache)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Notes) > 0 {
			t.Errorf("notes %q", b.Notes)
		}
		return b
	}
	b1 := build(1)
	release, err := Use(context.Background(), b1)
	if err != nil {
		t.Fatal(err)
	}
	b2, b3, b4 := build(2), build(3), build(4)
	got := entries(t, cache)
	want := []string{b1.Key, b3.Key, b4.Key}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after 4 builds with the first in use: %q, want %q (%s pruned)", got, want, b2.Key)
	}
	release()
	release() // idempotent
	b5 := build(5)
	got = entries(t, cache)
	want = []string{b4.Key, b5.Key}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after release and a fifth build: %q, want %q", got, want)
	}
	if _, err := Use(context.Background(), b1); err == nil {
		t.Errorf("Use of a pruned entry succeeded")
	}
	r5, err := Use(context.Background(), b5)
	if err != nil {
		t.Fatal(err)
	}
	r5()
}

func TestBuildRemovesDeadBuildersTmp(t *testing.T) {
	_, s := discovered(t, gpuOperator)
	cache := t.TempDir()
	dead := filepath.Join(cache, ".tmp-dead")
	live := filepath.Join(cache, ".tmp-live")
	for _, d := range []string{dead, live} {
		if err := os.MkdirAll(filepath.Join(d, "modules"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	l := must(os.Open(live))
	defer l.Close()
	if err := unix.Flock(int(l.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	b, err := Build(context.Background(), s, cache)
	if err != nil {
		t.Fatal(err)
	}
	got := entries(t, cache)
	want := []string{".tmp-live", b.Key}
	if !slices.Equal(got, want) {
		t.Errorf("cache holds %q, want %q", got, want)
	}
}

func TestBuildModesUnderUmask077(t *testing.T) {
	needTools(t)
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	tr := runInstaller(t, filepath.Join(t.TempDir(), "root"))
	s, err := Discover(context.Background(), Options{Root: tr.root, KernelRelease: testRelease})
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(t.TempDir(), "a", "cache")
	b, err := Build(context.Background(), s, cache)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(cache), cache} {
		if fi := must(os.Stat(d)); fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v", d, fi.Mode())
		}
	}
	err = filepath.WalkDir(b.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := os.FileMode(0o644)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			return nil
		case d.IsDir():
			want = 0o755 | fs.ModeDir
		case strings.HasPrefix(p, filepath.Join(b.Dir, "bin")+"/"):
			want = 0o755
		case p == filepath.Join(b.Dir, inUseFile):
			want = inUseMode
		}
		if fi.Mode() != want {
			t.Errorf("%s: %v, want %v", p, fi.Mode(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestBuildHardLinks(t *testing.T) {
	tr, s := discovered(t, runInstaller)
	// Root-owned sources of the wanted mode on the cache's file system
	// are linked; a group-writable one is copied.
	fw0, fw1 := tr.path("lib/firmware/"+gsp[0]), tr.path("lib/firmware/"+gsp[1])
	if err := os.Chmod(fw1, 0o664); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(filepath.Dir(tr.root), "cache")
	b, err := Build(context.Background(), s, cache)
	if err != nil {
		t.Fatal(err)
	}
	same := func(a, b string) bool { return os.SameFile(must(os.Stat(a)), must(os.Stat(b))) }
	if os.Geteuid() == 0 && !same(fw0, filepath.Join(b.Dir, "firmware", gsp[0])) {
		t.Errorf("firmware %s (root's, 0644) was copied, not linked", gsp[0])
	}
	if same(fw1, filepath.Join(b.Dir, "firmware", gsp[1])) {
		t.Errorf("firmware %s (0664) was linked", gsp[1])
	}
	if fi := must(os.Stat(filepath.Join(b.Dir, "firmware", gsp[1]))); fi.Mode().Perm() != 0o644 {
		t.Errorf("copied firmware mode %v", fi.Mode())
	}
	// Libraries the installer made 0755 are copied, to be 0644.
	if same(tr.path("usr/lib64/libcuda.so."+testVersion), filepath.Join(b.Dir, "lib64", "libcuda.so."+testVersion)) {
		t.Errorf("a 0755 library was linked")
	}
}

func TestBuildRefuses(t *testing.T) {
	tr, s := discovered(t, gpuOperator)
	cache := t.TempDir()
	clone := func() *Set {
		var c Set
		if err := json.Unmarshal(must(json.Marshal(s)), &c); err != nil {
			t.Fatal(err)
		}
		return &c
	}
	outside := filepath.Join(filepath.Dir(tr.root), "outside.bin")
	if err := os.WriteFile(outside, []byte("host file"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		modify func(c *Set)
		err    string
	}{
		{"firmware linked out of the root", func(c *Set) {
			tr.symlink("lib/firmware/escape.bin", "../../../outside.bin")
			c.Firmware[0].Path = tr.path("lib/firmware/escape.bin")
		}, "leads out of the driver root"},
		{"a directory on the way linked out of the root", func(c *Set) {
			tr.symlink("lib/firmware/up", "../../..")
			c.Firmware[0].Path = tr.path("lib/firmware/up/outside.bin")
		}, "leads out of the driver root"},
		{"a source not under the root", func(c *Set) { c.Firmware[0].Path = outside }, "is not under the driver root"},
		{"firmware destination climbing", func(c *Set) { c.Firmware[0].Rel = "firmware/../../x" }, "not a path under firmware/"},
		{"library destination in a subdirectory", func(c *Set) { c.Libraries[0].Rel = "lib64/a/b.so" }, "not a file name under lib64/"},
		{"soname with a slash", func(c *Set) { c.Libraries[0].Soname = "../libcuda.so.1" }, "is not a file name"},
		{"two files to one place", func(c *Set) { c.Libraries[1].Rel = c.Libraries[0].Rel }, "two files of the set go to"},
		{"bad module name", func(c *Set) { c.Modules[0].Name = "../nvidia" }, "module name"},
		{"parameters on two lines", func(c *Set) { c.Modules[0].Params = "a=1\nb=2" }, "newline"},
		{"bad version", func(c *Set) { c.Version = "../550" }, "is not a version"},
		{"no modules", func(c *Set) { c.Modules = nil }, "no kernel modules"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := clone()
			tt.modify(c)
			b, err := Build(context.Background(), c, cache)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("Build: %+v, %v; want an error saying %q", b, err, tt.err)
			}
			t.Log(err)
		})
	}
	if got := entries(t, cache); len(got) != 0 {
		t.Errorf("refused builds left %q", got)
	}
	_, err := Build(context.Background(), nil, cache)
	if err == nil {
		t.Error("Build(nil) succeeded")
	}
}

func TestBuildCancelled(t *testing.T) {
	_, s := discovered(t, gpuOperator)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Build(ctx, s, t.TempDir()); !errors.Is(err, context.Canceled) {
		t.Fatalf("Build with a cancelled context: %v", err)
	}
}

// TestBuildDecompressesFirmware: compressed firmware (.zst, .xz) is
// stored plain, under the name the module requests: Debian 12's guest
// kernel has no ZSTD firmware decompressor.
func TestBuildDecompressesFirmware(t *testing.T) {
	needTools(t)
	for _, tc := range []struct{ tool, suffix string }{{"zstd", ".zst"}, {"xz", ".xz"}} {
		t.Run(tc.suffix, func(t *testing.T) {
			_, s := discovered(t, xzDKMS)
			if len(s.Firmware) == 0 {
				t.Fatal("the fixture has no firmware")
			}
			plain := s.Firmware[0]
			want, err := os.ReadFile(plain.Path)
			if err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(tc.tool, "-q", "-k", plain.Path).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v %s", tc.tool, err, out)
			}
			s.Firmware[0] = File{Path: plain.Path + tc.suffix, Rel: plain.Rel + tc.suffix}
			b, err := Build(context.Background(), s, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(b.Dir, filepath.FromSlash(plain.Rel)))
			if err != nil {
				t.Fatalf("the firmware is not at its plain name: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("firmware %s: %d bytes, want the %d decompressed ones", plain.Rel, len(got), len(want))
			}
			if _, err := os.Stat(filepath.Join(b.Dir, filepath.FromSlash(plain.Rel)+tc.suffix)); err == nil {
				t.Errorf("the compressed copy is in the entry too")
			}
		})
	}
}

// TestBuildReplacesIncompleteEntry: an entry without its set.json (a crash
// before its directories reached the disk) is replaced by the next Build
// instead of failing every GPU step until an admin removes it.
func TestBuildReplacesIncompleteEntry(t *testing.T) {
	_, s := discovered(t, xzDKMS)
	cache := t.TempDir()
	b, err := Build(context.Background(), s, cache)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(b.Dir, setFile)); err != nil {
		t.Fatal(err)
	}
	b2, err := Build(context.Background(), s, cache)
	if err != nil {
		t.Fatalf("Build over an incomplete entry: %v", err)
	}
	if b2.Dir != b.Dir || !complete(b2.Dir) {
		t.Errorf("entry %s complete=%v, want %s rebuilt", b2.Dir, complete(b2.Dir), b.Dir)
	}
}
