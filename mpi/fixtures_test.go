package mpi

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/image"
	"github.com/slurm-microvm/slurm-microvm/mpi/mpitest"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// The test binary doubles as launcher/image's helper child (as
// `slurm-microvm image helper` does) when this variable is set.
const envHelper = "MPI_TEST_IMAGE_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(envHelper) == "1" {
		os.Exit(image.RunHelper(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// hostLibDir is where Debian keeps the libraries the fixtures copy.
const hostLibDir = "/usr/lib/x86_64-linux-gnu"

// fixLibDir is where fixture roots put them (inside the root).
const fixLibDir = "/usr/lib/x86_64-linux-gnu"

// needHostLibs skips the test unless the host has the named libraries
// (installed by: apt-get install -y libopenmpi-dev openmpi-bin
// libmpich-dev mpich libucx-dev libfabric-dev libpmix-dev).
func needHostLibs(t *testing.T, sonames ...string) {
	t.Helper()
	for _, s := range sonames {
		if _, err := os.Stat(filepath.Join(hostLibDir, s)); err != nil {
			prereq.Missing(t, "host library %s missing (apt-get install -y libopenmpi-dev openmpi-bin libmpich-dev mpich libucx-dev libfabric-dev libpmix-dev): %v", s, err)
		}
	}
}

// lddClosure returns soname -> host path for the given host libraries and
// everything ldd(1) says they load (an implementation independent of the
// code under test).
func lddClosure(t *testing.T, paths ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range paths {
		out[filepath.Base(p)] = p
		b, err := exec.Command("ldd", p).Output()
		if err != nil {
			t.Fatalf("ldd %s: %v", p, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				out[f[0]] = f[2]
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				out[filepath.Base(f[0])] = f[0]
			}
		}
	}
	return out
}

// copyLib copies host library hostPath into root as the loader expects it:
// the real file under its real name in fixLibDir and a soname link to it.
func copyLib(t *testing.T, root, soname, hostPath string) {
	t.Helper()
	real, err := filepath.EvalSymlinks(hostPath)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, fixLibDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, filepath.Base(real))
	if _, err := os.Stat(dst); err != nil {
		if err := copyFile(real, dst); err != nil {
			t.Fatal(err)
		}
	}
	if soname != filepath.Base(real) {
		link := filepath.Join(dir, soname)
		os.Remove(link)
		if err := os.Symlink(filepath.Base(real), link); err != nil {
			t.Fatal(err)
		}
	}
}

// newRoot builds an image root in a fresh temporary directory holding the
// named host libraries (sonames in hostLibDir) and their ldd closure,
// which always brings glibc.
func newRoot(t *testing.T, sonames ...string) string {
	t.Helper()
	root := t.TempDir()
	paths := []string{filepath.Join(hostLibDir, "libc.so.6")}
	for _, s := range sonames {
		paths = append(paths, filepath.Join(hostLibDir, s))
	}
	for so, p := range lddClosure(t, paths...) {
		copyLib(t, root, so, p)
	}
	return root
}

// ompiRoot is an image root with Open MPI (libmpi.so.40 and closure).
func ompiRoot(t *testing.T) string {
	needHostLibs(t, "libmpi.so.40")
	return newRoot(t, "libmpi.so.40")
}

// mpichRoot is an image root with MPICH (libmpich.so.12 and closure).
func mpichRoot(t *testing.T) string {
	needHostLibs(t, "libmpich.so.12")
	return newRoot(t, "libmpich.so.12")
}

// bumpOpenMPIMinor makes the root's Open MPI declare a newer minor than
// the host's: libmpi.so.40.30.4 becomes libmpi.so.40.40.0 (what Open MPI
// 5.0 ships) and its ompi_version_string "4.1.4" becomes "5.0.3".
func bumpOpenMPIMinor(t *testing.T, root string) {
	t.Helper()
	dir := filepath.Join(root, fixLibDir)
	link := filepath.Join(dir, "libmpi.so.40")
	old, err := os.Readlink(link)
	if err != nil {
		t.Fatal(err)
	}
	if old != "libmpi.so.40.30.4" {
		prereq.Missing(t, "host Open MPI is %s, this fixture expects libmpi.so.40.30.4 (Debian 12)", old)
	}
	newName := "libmpi.so.40.40.0"
	if err := os.Rename(filepath.Join(dir, old), filepath.Join(dir, newName)); err != nil {
		t.Fatal(err)
	}
	os.Remove(link)
	if err := os.Symlink(newName, link); err != nil {
		t.Fatal(err)
	}
	patchSymbolString(t, filepath.Join(dir, newName), "ompi_version_string", "4.1.4", "5.0.3")
}

// patchSymbolString overwrites, in place, the string stored at exported
// data symbol sym, which must currently read from, with to (same length).
func patchSymbolString(t *testing.T, file, sym, from, to string) {
	t.Helper()
	if len(from) != len(to) {
		t.Fatal("patch must keep the length")
	}
	ef, err := elf.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	syms, err := ef.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var off int64 = -1
	for _, s := range syms {
		if s.Name != sym {
			continue
		}
		for _, sec := range ef.Sections {
			if s.Value >= sec.Addr && s.Value < sec.Addr+sec.Size && sec.Type != elf.SHT_NOBITS {
				off = int64(sec.Offset + s.Value - sec.Addr)
			}
		}
	}
	ef.Close()
	if off < 0 {
		t.Fatalf("%s: symbol %s not found", file, sym)
	}
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, len(from)+1)
	if _, err := f.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	if string(got) != from+"\x00" {
		prereq.Missing(t, "%s: %s is %q, fixture expects %q", file, sym, got, from)
	}
	if _, err := f.WriteAt([]byte(to), off); err != nil {
		t.Fatal(err)
	}
}

// gcc compiles with the system compiler, skipping the test without one.
func gcc(t *testing.T, args ...string) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		prereq.Missing(t, "gcc not installed")
	}
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
}

// missingSymbolProgram builds testdata/missing_symbol.c against a stub
// libmpi.so.40 defining MPI_Made_up_symbol and returns the executable.
func missingSymbolProgram(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	stub := filepath.Join(dir, "libmpi.so.40")
	gcc(t, "-shared", "-fPIC", "-Wl,-soname,libmpi.so.40", "-o", stub, "testdata/stub_mpi.c")
	prog := filepath.Join(dir, "missing_symbol")
	gcc(t, "-o", prog, "testdata/missing_symbol.c", stub)
	return prog
}

// stubLibc builds testdata/stub_libc.c: a libc.so.6 defining only
// GLIBC_2.2.5.
func stubLibc(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "libc.so.6")
	gcc(t, "-shared", "-fPIC", "-nostdlib", "-Wl,-soname,libc.so.6", "-Wl,--version-script=testdata/stub_libc.map", "-o", out, "testdata/stub_libc.c")
	return out
}

// install copies host file src into root at in-root path dst.
func install(t *testing.T, root, src, dst string) {
	t.Helper()
	p := filepath.Join(root, dst)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Remove(p)
	if err := copyFile(src, p); err != nil {
		t.Fatal(err)
	}
}

// buildHello compiles mpi_hello.c with impl, skipping when impl is missing.
func buildHello(t *testing.T, impl mpitest.Impl) string {
	t.Helper()
	if err := impl.Available(); err != nil {
		prereq.Missing(t, "%v", err)
	}
	p, err := impl.BuildHello(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// findings renders a report's findings for failure messages.
func findings(r *Report) string {
	var b strings.Builder
	for _, f := range r.Findings {
		fmt.Fprintf(&b, "  [%s] %s: %s\n", f.Verdict, f.Component, f.Reason)
	}
	return b.String()
}
