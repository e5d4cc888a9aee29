package mpi

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestParseLDCacheMatchesLdconfig compares the parser with ldconfig -p on
// this host's /etc/ld.so.cache.
func TestParseLDCacheMatchesLdconfig(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		prereq.Hardware(t, "the expected ldconfig tag is x86-64's")
	}
	b, err := os.ReadFile("/etc/ld.so.cache")
	if err != nil {
		prereq.Missing(t, "no ld.so.cache: %v", err)
	}
	out, err := exec.Command("ldconfig", "-p").Output()
	if err != nil {
		prereq.Missing(t, "ldconfig -p: %v", err)
	}
	entries, err := parseLDCache(b, cacheFlagsFor(runtime.GOARCH))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, e := range entries {
		got[e.Name+" => "+e.Path] = true
	}
	want := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1"
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(line, " (")
		if !ok || !strings.HasPrefix(rest, "libc6,x86-64") || strings.Contains(rest, "hwcap") {
			continue
		}
		_, p, _ := strings.Cut(rest, "=> ")
		want++
		if !got[name+" => "+p] {
			t.Errorf("ldconfig lists %s => %s, the parser does not", name, p)
		}
	}
	if want == 0 || len(entries) != want {
		t.Errorf("parser found %d x86-64 entries, ldconfig %d", len(entries), want)
	}
	if _, err := parseLDCache(b[:30], -1); err == nil {
		t.Error("truncated cache accepted")
	}
	if _, err := parseLDCache([]byte("garbage that is long enough to be a header........"), -1); err == nil {
		t.Error("garbage accepted")
	}
}

// TestRootResolveStaysInside: links are resolved inside the root, never on
// the host.
func TestRootResolveStaysInside(t *testing.T) {
	root := t.TempDir()
	mk := func(p, content string) {
		t.Helper()
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln := func(target, p string) {
		t.Helper()
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, full); err != nil {
			t.Fatal(err)
		}
	}
	mk("/etc/hostname", "inside")
	mk("/usr/lib/libx.so.1.2.3", "x")
	ln("libx.so.1.2.3", "/usr/lib/libx.so.1")
	ln("usr/lib", "/lib")           // relative, like Debian's /lib
	ln("/etc/hostname", "/usr/abs") // absolute: must mean ROOT/etc/hostname
	ln("../../../../../etc/hostname", "/usr/lib/dotdot")
	ln("/lib/libx.so.1", "/chain") // through the /lib link
	ln("loop2", "/loop1")
	ln("loop1", "/loop2")
	ln("/nonexistent", "/dangling")

	r, err := OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tests := []struct {
		in, want string
		err      error
	}{
		{"/usr/abs", "/etc/hostname", nil},
		{"/usr/lib/dotdot", "/etc/hostname", nil},
		{"/chain", "/usr/lib/libx.so.1.2.3", nil},
		{"/lib/libx.so.1", "/usr/lib/libx.so.1.2.3", nil},
		{"../../etc/hostname", "/etc/hostname", nil},
		{"/loop1", "", unix.ELOOP},
		{"/dangling", "", fs.ErrNotExist},
		{"/etc/hostname/x", "", unix.ENOTDIR},
	}
	for _, tt := range tests {
		got, err := r.Resolve(tt.in)
		if tt.err != nil {
			if !errors.Is(err, tt.err) {
				t.Errorf("Resolve(%s) = %q, %v; want error %v", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, p := range []string{"/usr/abs", "/usr/lib/dotdot"} {
		b, err := r.ReadFile(p, 100)
		if err != nil || string(b) != "inside" {
			t.Errorf("ReadFile(%s) = %q, %v; want the root's file", p, b, err)
		}
	}
	links, real, err := r.resolveChain("/lib/libx.so.1")
	if err != nil || real != "/usr/lib/libx.so.1.2.3" || len(links) != 1 || links[0] != "/usr/lib/libx.so.1" {
		t.Errorf("resolveChain = %q %q %v", links, real, err)
	}
}

// TestRootLdSoConf: directories come from the root's ld.so.conf and its
// includes (relative ones too), in order, before the defaults; the host's
// configuration is never read.
func TestRootLdSoConf(t *testing.T) {
	needHostLibs(t, "libz.so.1")
	root := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("/etc/ld.so.conf", "# site\ninclude ld.so.conf.d/*.conf\n/opt/first\n")
	write("/etc/ld.so.conf.d/b.conf", "/opt/b # comment\n")
	write("/etc/ld.so.conf.d/a.conf", "/opt/a\nhwcap 0 nosegneg\n")
	write("/etc/ld.so.conf.d/ignored.txt", "/opt/ignored\n")
	// The same soname in two configured directories and a default one:
	// the first configured wins.
	for _, d := range []string{"/opt/b", "/opt/a", fixLibDir} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := copyFile(filepath.Join(hostLibDir, "libz.so.1"), filepath.Join(root, d, "libz.so.1")); err != nil {
			t.Fatal(err)
		}
	}
	r, err := OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	dirs := r.SearchDirs()
	want := []string{"/opt/a", "/opt/b", "/opt/first"}
	if len(dirs) < 3 || strings.Join(dirs[:3], ":") != strings.Join(want, ":") {
		t.Fatalf("search dirs %q, want %q first", dirs, want)
	}
	for _, d := range dirs {
		if d == "/opt/ignored" || d == "/usr/lib/x86_64-linux-gnu/libfakeroot" {
			t.Errorf("unexpected search dir %s", d)
		}
	}
	if p, err := r.Lookup("libz.so.1", nil); err != nil || p != "/opt/a/libz.so.1" {
		t.Errorf("Lookup = %q, %v; want the first configured directory", p, err)
	}
}

// TestRootLookupOrder: DT_RUNPATH directories first, then the cache, then
// the search directories; objects of another machine are skipped.
func TestRootLookupOrder(t *testing.T) {
	needHostLibs(t, "libz.so.1")
	root := t.TempDir()
	copyLib(t, root, "libz.so.1", filepath.Join(hostLibDir, "libz.so.1"))
	// A file with the right name that is not ELF, earlier in the path.
	bad := filepath.Join(root, "lib/x86_64-linux-gnu", "libz.so.1") // first default dir
	if err := os.MkdirAll(filepath.Dir(bad), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("not an ELF file at all, just text padding to 64 bytes ................"), 0o644); err != nil {
		t.Fatal(err)
	}
	extra := filepath.Join(root, "opt", "rp")
	if err := os.MkdirAll(extra, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(filepath.Join(hostLibDir, "libz.so.1"), filepath.Join(extra, "libz.so.1")); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if p, err := r.Lookup("libz.so.1", nil); err != nil || p != fixLibDir+"/libz.so.1" {
		t.Errorf("Lookup = %q, %v", p, err)
	}
	if p, err := r.Lookup("libz.so.1", []string{"/opt/rp"}); err != nil || p != "/opt/rp/libz.so.1" {
		t.Errorf("Lookup with runpath = %q, %v", p, err)
	}
	if _, err := r.Lookup("libnothere.so.9", nil); err == nil {
		t.Error("missing library found")
	}
}

// TestDiscoverHost compares discovery on the host with dpkg's package
// versions (Debian 12: Open MPI 4.1.4, MPICH 4.0.2, UCX 1.13.1, PMIx
// 4.2.2, libfabric 1.17.0, glibc 2.36).
func TestDiscoverHost(t *testing.T) {
	needHostLibs(t, "libmpi.so.40", "libmpich.so.12", "libucp.so.0", "libfabric.so.1", "libpmix.so.2")
	pkg := func(name string) string {
		out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", name).Output()
		if err != nil {
			prereq.Missing(t, "dpkg-query %s: %v", name, err)
		}
		v := string(out)
		if i := strings.Index(v, ":"); i >= 0 {
			v = v[i+1:]
		}
		v, _, _ = strings.Cut(v, "-")
		v, _, _ = strings.Cut(v, "+")
		return v
	}
	r, err := OpenRoot("/")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s, err := Discover(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	ompi, mpich := s.MPIOf(FamilyOpenMPI), s.MPIOf(FamilyMPICH)
	if ompi == nil || mpich == nil {
		t.Fatalf("MPI found: %v", s)
	}
	for _, tt := range []struct {
		what string
		l    *Library
		pkg  string
	}{
		{"Open MPI", ompi, "libopenmpi3"},
		{"MPICH", mpich, "libmpich12"},
		{"UCX", s.UCP, "libucx0"},
		{"libfabric", s.Fabric, "libfabric1"},
		{"PMIx", s.PMIx, "libpmix2"},
		{"glibc", s.Libc, "libc6"},
	} {
		if tt.l == nil {
			t.Errorf("%s not found", tt.what)
			continue
		}
		want := pkg(tt.pkg)
		if !strings.HasPrefix(tt.l.Version, want) {
			t.Errorf("%s version %q (from %s), dpkg says %s", tt.what, tt.l.Version, tt.l.VersionFrom, want)
		}
	}
	if ompi.Name != "libmpi.so.40" || ompi.Impl != "Open MPI" || ompi.FileVersion[0] != 40 {
		t.Errorf("Open MPI: %+v", ompi)
	}
	if mpich.Name != "libmpich.so.12" || mpich.Impl != "MPICH" || mpich.FileVersion[0] != 12 {
		t.Errorf("MPICH: %+v", mpich)
	}
	for _, l := range []*Library{s.UCT, s.UCS, s.UCM} {
		if l == nil || l.Version != s.UCP.Version {
			t.Errorf("UCX library %+v: want version %s", l, s.UCP.Version)
		}
	}
}

func TestVersions(t *testing.T) {
	for _, tt := range []struct{ in, file, release string }{
		{"libmpi.so.40.30.4", "40.30.4", ""},
		{"/x/libpmix.so.2.6.2", "2.6.2", ""},
		{"libc.so.6", "6", ""},
		{"libfoo.so", "", ""},
		{"libfoo.so.1.2a", "1", ""},
	} {
		if got := fileVersion(tt.in).String(); got != tt.file {
			t.Errorf("fileVersion(%s) = %s, want %s", tt.in, got, tt.file)
		}
	}
	for _, tt := range []struct{ in, want string }{
		{"4.2.2rc2", "4.2.2"}, {"v4.1.4", "4.1.4"}, {"2021.6", "2021.6"}, {"1.13.1", "1.13.1"}, {"x", ""},
	} {
		if got := releaseVersion(tt.in).String(); got != tt.want {
			t.Errorf("releaseVersion(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// TestCompareVersions is the Sarus rule table (doc/config/mpi-hook.rst).
func TestCompareVersions(t *testing.T) {
	v := func(s string) Version { return fileVersion("libmpi.so." + s) }
	for _, tt := range []struct {
		mode      Mode
		host, img string
		ok        bool
	}{
		{ModeMajor, "12.5.5", "12.9.0", true},
		{ModeMajor, "12", "12.1", true},
		{ModeMajor, "40.30.4", "12.2.2", false},
		{ModeFull, "12.5.5", "12.5.10", true}, // patch is ignored
		{ModeFull, "12.5.5", "12.4.0", true},
		{ModeFull, "12.4.0", "12.5.0", false},
		{ModeFull, "12", "12.0", false}, // minor must be present
		{ModeStrict, "12.5.5", "12.5.0", true},
		{ModeStrict, "12.5.5", "12.4.0", false},
		{ModeStrict, "13.5", "12.5", false},
	} {
		err := compareVersions(tt.mode, v(tt.host), v(tt.img))
		if (err == nil) != tt.ok {
			t.Errorf("%s host %s image %s: err = %v, want ok=%v", tt.mode, tt.host, tt.img, err, tt.ok)
		}
	}
	if _, err := ParseMode("loose"); err == nil {
		t.Error("ParseMode accepted loose")
	}
	if m, err := ParseMode(""); err != nil || m != DefaultMode {
		t.Errorf("ParseMode(\"\") = %s, %v", m, err)
	}
}

func TestPMIxCompatible(t *testing.T) {
	for _, tt := range []struct {
		server, client string
		ok             bool
	}{
		{"4.2.2", "3.1.6", true},
		{"4.2.2", "2.1.1", true},
		{"4.2.2", "2.0.3", false},
		{"1.2.5", "1.2.3", true},
		{"5.0.1", "4.2.2", true},
		{"", "4.2.2", false},
	} {
		err := pmixCompatible(releaseVersion(tt.server), releaseVersion(tt.client))
		if (err == nil) != tt.ok {
			t.Errorf("server %s client %s: %v, want ok=%v", tt.server, tt.client, err, tt.ok)
		}
	}
}

// TestMalformedELF: truncated and garbage objects named like MPI
// libraries are skipped, not fatal.
func TestMalformedELF(t *testing.T) {
	needHostLibs(t, "libmpi.so.40")
	real, err := filepath.EvalSymlinks(filepath.Join(hostLibDir, "libmpi.so.40"))
	if err != nil {
		t.Fatal(err)
	}
	full, err := os.ReadFile(real)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	dir := filepath.Join(root, fixLibDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A header whose section table points past the end, and one with its
	// dynamic section cut off.
	for name, b := range map[string][]byte{
		"libmpi.so.40":   full[:4096],
		"libmpich.so.12": append(append([]byte{}, full[:64]...), make([]byte, 1000)...),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s, err := Discover(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.MPI) != 0 {
		t.Errorf("malformed libraries discovered as MPI: %v", s)
	}
}
