package mpi

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/mpi/mpitest"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

func check(t *testing.T, host, img string, o CheckOptions) *Report {
	t.Helper()
	rep, err := Check(context.Background(), host, img, o)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", b.String())
	return rep
}

func wantFinding(t *testing.T, rep *Report, comp string, v Verdict, reasonHas string) *Finding {
	t.Helper()
	for i := range rep.Findings {
		f := &rep.Findings[i]
		if f.Component == comp && f.Verdict == v && strings.Contains(f.Reason, reasonHas) {
			return f
		}
	}
	t.Fatalf("no %s finding %q containing %q; findings:\n%s", v, comp, reasonHas, findings(rep))
	return nil
}

// TestCheckMatching: an image with the host's own MPI passes, with and
// without the program; the plan's core files are the host's.
func TestCheckMatching(t *testing.T) {
	tests := []struct {
		name  string
		impl  mpitest.Impl
		root  func(*testing.T) string
		lib   string
		extra []string
	}{
		{"openmpi", mpitest.OpenMPI, ompiRoot, "libmpi.so.40", []string{"OMPI_MCA_mca_base_component_path", "PMIX_MCA_mca_base_component_path", "UCX_MODULE_DIR"}},
		{"mpich", mpitest.MPICH, mpichRoot, "libmpich.so.12", []string{"UCX_MODULE_DIR"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := tt.root(t)
			rep := check(t, "/", root, CheckOptions{})
			if !rep.Safe {
				t.Fatalf("not safe:\n%s", findings(rep))
			}
			f := wantFinding(t, rep, CompMPI, VerdictOK, "same family")
			if f.Image.Name != tt.lib || f.Host.Name != tt.lib || f.Image.FileVersion.Compare(f.Host.FileVersion) != 0 {
				t.Errorf("MPI finding %+v", f)
			}
			wantFinding(t, rep, CompGlibc, VerdictOK, "defines every version")
			var names []string
			for _, pf := range rep.Plan.Files {
				names = append(names, pf.Name)
				if !strings.HasPrefix(pf.Host, "/") || strings.HasPrefix(pf.Host, root) {
					t.Errorf("plan file %s comes from %s, not the host", pf.Name, pf.Host)
				}
				if isGlibc(pf.Name) {
					t.Errorf("plan injects glibc part %s", pf.Name)
				}
			}
			if !slices.Contains(names, tt.lib) {
				t.Errorf("plan lacks %s: %v", tt.lib, names)
			}
			var env []string
			for _, e := range rep.Plan.Env {
				env = append(env, e.Name)
			}
			for _, want := range append([]string{"LD_LIBRARY_PATH"}, tt.extra...) {
				if !slices.Contains(env, want) {
					t.Errorf("plan env lacks %s: %v", want, env)
				}
			}

			// With the program compiled by this implementation's mpicc,
			// inside the image.
			prog := buildHello(t, tt.impl)
			install(t, root, prog, "/usr/local/bin/mpi_hello")
			rep = check(t, "/", root, CheckOptions{Program: "/usr/local/bin/mpi_hello"})
			if !rep.Safe {
				t.Fatalf("not safe with the program:\n%s", findings(rep))
			}
			f = wantFinding(t, rep, CompSymbols, VerdictOK, "all defined")
			if !strings.Contains(f.Reason, "from 1 image object") {
				t.Errorf("symbols reason %q: want the program as the one consumer", f.Reason)
			}
			wantFinding(t, rep, CompProgram, VerdictOK, "no DT_RPATH")
		})
	}
}

// TestCheckFamiliesDiffer: the MPICH image against a host with only Open
// MPI fails; so does the reverse.
func TestCheckFamiliesDiffer(t *testing.T) {
	ompi, mpich := ompiRoot(t), mpichRoot(t)
	for _, tt := range []struct{ name, host, img, imgImpl, hostImpl string }{
		{"mpich image, openmpi host", ompi, mpich, "MPICH", "Open MPI"},
		{"openmpi image, mpich host", mpich, ompi, "Open MPI", "MPICH"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rep := check(t, tt.host, tt.img, CheckOptions{})
			if rep.Safe {
				t.Fatal("different families reported safe")
			}
			f := wantFinding(t, rep, CompMPI, VerdictFail, "different MPI families")
			if !strings.Contains(f.Reason, tt.imgImpl) || !strings.Contains(f.Reason, tt.hostImpl) {
				t.Errorf("reason %q does not name both implementations", f.Reason)
			}
			if rep.Plan != nil {
				t.Error("a plan was made for mixed families")
			}
		})
	}
}

// TestCheckNewerMinor: an image whose Open MPI declares minor 40 (5.0)
// against the host's 40.30 (4.1) fails under full and strict, passes under
// major.
func TestCheckNewerMinor(t *testing.T) {
	root := ompiRoot(t)
	bumpOpenMPIMinor(t, root)
	for _, tt := range []struct {
		mode Mode
		safe bool
		why  string
	}{
		{ModeMajor, true, "pass mode major"},
		{ModeFull, false, "image minor 40 is newer than host minor 30"},
		{ModeStrict, false, "minor versions differ: host 30, image 40"},
	} {
		t.Run(string(tt.mode), func(t *testing.T) {
			rep := check(t, "/", root, CheckOptions{Mode: tt.mode})
			if rep.Safe != tt.safe {
				t.Fatalf("safe = %v, want %v:\n%s", rep.Safe, tt.safe, findings(rep))
			}
			v := VerdictOK
			if !tt.safe {
				v = VerdictFail
			}
			f := wantFinding(t, rep, CompMPI, v, tt.why)
			if f.Image.Version != "5.0.3" || f.Image.FileVersion.String() != "40.40.0" {
				t.Errorf("image MPI read as %q file %s, want 5.0.3 file 40.40.0", f.Image.Version, f.Image.FileVersion)
			}
		})
	}
}

// TestCheckNoMPI: an image without MPI says so.
func TestCheckNoMPI(t *testing.T) {
	root := newRoot(t, "libz.so.1")
	rep := check(t, "/", root, CheckOptions{})
	if rep.Safe {
		t.Fatal("image without MPI reported safe")
	}
	wantFinding(t, rep, CompMPI, VerdictFail, ErrNoImageMPI.Error())
}

// TestCheckMissingSymbol: a program importing an MPI symbol the host
// library lacks fails, naming the symbol.
func TestCheckMissingSymbol(t *testing.T) {
	root := ompiRoot(t)
	install(t, root, missingSymbolProgram(t), "/opt/app/missing_symbol")
	rep := check(t, "/", root, CheckOptions{Program: "/opt/app/missing_symbol"})
	if rep.Safe {
		t.Fatal("program with a missing symbol reported safe")
	}
	f := wantFinding(t, rep, CompSymbols, VerdictFail, "MPI_Made_up_symbol")
	if len(f.Missing) != 1 || !strings.HasPrefix(f.Missing[0], "MPI_Made_up_symbol (imported by /opt/app/missing_symbol") {
		t.Errorf("missing = %q", f.Missing)
	}
	// The same program given as a host path.
	host := filepath.Join(t.TempDir(), "prog")
	if err := copyFile(filepath.Join(root, "opt/app/missing_symbol"), host); err != nil {
		t.Fatal(err)
	}
	rep = check(t, "/", root, CheckOptions{Program: host})
	wantFinding(t, rep, CompSymbols, VerdictFail, "MPI_Made_up_symbol")
	if !strings.HasSuffix(rep.Program, "(host)") {
		t.Errorf("program %q: want it read from the host", rep.Program)
	}
}

// TestCheckOldGlibc: an image whose glibc lacks the versions the host
// libraries need fails the glibc rule, naming them.
func TestCheckOldGlibc(t *testing.T) {
	root := ompiRoot(t)
	libc, err := filepath.EvalSymlinks(filepath.Join(root, fixLibDir, "libc.so.6"))
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(libc)
	install(t, root, stubLibc(t), strings.TrimPrefix(libc, root))
	rep := check(t, "/", root, CheckOptions{})
	if rep.Safe {
		t.Fatal("old glibc reported safe")
	}
	f := wantFinding(t, rep, CompGlibc, VerdictFail, "GLIBC_2.")
	for _, m := range f.Missing {
		if strings.HasPrefix(m, "GLIBC_2.2.5 ") {
			t.Errorf("GLIBC_2.2.5 reported missing though the stub defines it: %q", m)
		}
	}
}

// TestCheckHostMPIOverride: --host-mpi names the library to inject; a
// file that is not an MPI library fails.
func TestCheckHostMPIOverride(t *testing.T) {
	needHostLibs(t, "libmpich.so.12", "libz.so.1")
	root := mpichRoot(t)
	rep := check(t, "/", root, CheckOptions{HostMPI: filepath.Join(hostLibDir, "libmpich.so.12")})
	if !rep.Safe {
		t.Fatalf("not safe:\n%s", findings(rep))
	}
	rep = check(t, "/", root, CheckOptions{HostMPI: filepath.Join(hostLibDir, "libz.so.1")})
	wantFinding(t, rep, CompMPI, VerdictFail, "does not define MPI_Init")
}

// TestCheckMPICHAlias: an MPICH-ABI image linking libmpi.so.12 (Intel MPI,
// MVAPICH, other distributions) is served by the host's libmpich.so.12
// under that name.
func TestCheckMPICHAlias(t *testing.T) {
	root := mpichRoot(t)
	dir := filepath.Join(root, fixLibDir)
	if err := os.Rename(filepath.Join(dir, "libmpich.so.12"), filepath.Join(dir, "libmpi.so.12")); err != nil {
		t.Fatal(err)
	}
	rep := check(t, "/", root, CheckOptions{})
	if !rep.Safe {
		t.Fatalf("not safe:\n%s", findings(rep))
	}
	var alias *PlanFile
	for i, pf := range rep.Plan.Files {
		if pf.Name == "libmpi.so.12" {
			alias = &rep.Plan.Files[i]
		}
	}
	if alias == nil || !strings.Contains(alias.Host, "libmpich.so.12") {
		t.Errorf("plan has no libmpi.so.12 alias of the host libmpich: %+v", alias)
	}
}

// TestCheckProgramRPATH: a program whose DT_RPATH holds the image's MPI
// would load it before LD_LIBRARY_PATH.
func TestCheckProgramRPATH(t *testing.T) {
	root := ompiRoot(t)
	prog := filepath.Join(t.TempDir(), "hello")
	if err := mpitest.OpenMPI.Available(); err != nil {
		prereq.Missing(t, "%v", err)
	}
	if err := mpitest.OpenMPI.Build(context.Background(), "mpi_hello.c", prog, "-Wl,--disable-new-dtags", "-Wl,-rpath,"+fixLibDir); err != nil {
		t.Fatal(err)
	}
	install(t, root, prog, "/usr/local/bin/hello")
	rep := check(t, "/", root, CheckOptions{Program: "/usr/local/bin/hello"})
	f := wantFinding(t, rep, CompProgram, VerdictFail, "DT_RPATH")
	if !slices.Contains(f.Missing, fixLibDir+"/libmpi.so.40") {
		t.Errorf("missing = %q", f.Missing)
	}
}

// TestCheckVersionedDependencies: an image copy of a library the plan
// injects that defines a symbol version the host's lacks fails the rule
// for it (libfabric's own rule; the replaced-libraries rule for others).
func TestCheckVersionedDependencies(t *testing.T) {
	for _, tt := range []struct {
		soname, version, comp string
	}{
		{"libfabric.so.1", "FABRIC_9.9", CompFabric},
		{"libz.so.1", "ZLIB_9.9", CompShadowed},
	} {
		t.Run(tt.soname, func(t *testing.T) {
			root := ompiRoot(t)
			dir := t.TempDir()
			m := filepath.Join(dir, "v.map")
			if err := os.WriteFile(m, []byte(tt.version+" { global: *; };\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			lib := filepath.Join(dir, tt.soname)
			gcc(t, "-shared", "-fPIC", "-Wl,-soname,"+tt.soname, "-Wl,--version-script="+m, "-o", lib, "testdata/stub_versioned.c")
			dst := filepath.Join(fixLibDir, tt.soname)
			os.Remove(filepath.Join(root, dst))
			install(t, root, lib, dst)
			rep := check(t, "/", root, CheckOptions{})
			if rep.Safe {
				t.Fatal("reported safe")
			}
			f := wantFinding(t, rep, tt.comp, VerdictFail, tt.version)
			if !strings.Contains(strings.Join(f.Missing, " "), tt.version) {
				t.Errorf("missing = %q", f.Missing)
			}
		})
	}
}

// TestCheckUCXNewer: an image whose UCX is newer than the host's fails
// the UCX rule when the host MPI brings its UCX (MPICH ch4:ucx).
func TestCheckUCXNewer(t *testing.T) {
	root := mpichRoot(t)
	ucp, err := filepath.EvalSymlinks(filepath.Join(root, fixLibDir, "libucp.so.0"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(ucp)
	if err != nil {
		t.Fatal(err)
	}
	// The literal ucp_get_version_string returns directly follows other
	// data, so match on the string and its terminator only.
	from, to := []byte("1.13.1\x00"), []byte("1.99.0\x00")
	if !bytes.Contains(b, from) {
		prereq.Missing(t, "host UCX is not 1.13.1 (Debian 12), the fixture patches that string")
	}
	b = bytes.ReplaceAll(b, from, to)
	if err := os.WriteFile(ucp, b, 0o755); err != nil {
		t.Fatal(err)
	}
	rep := check(t, "/", root, CheckOptions{})
	if rep.Safe {
		t.Fatal("newer image UCX reported safe")
	}
	f := wantFinding(t, rep, CompUCP, VerdictFail, "newer than the host's")
	if f.Image.Version != "1.99.0" {
		t.Errorf("image UCX read as %q", f.Image.Version)
	}
}

// TestCheckCopyRelocatedSymbol: a program built by the real mpicc takes
// Open MPI's predefined handles (MPI_COMM_WORLD, MPI_SUM, ...) through
// R_X86_64_COPY relocations, so they appear defined in its own dynamic
// symbol table. A host library lacking one of them, or defining one with
// another size than the program reserved, fails the symbol rule naming it;
// the host's real Open MPI passes.
func TestCheckCopyRelocatedSymbol(t *testing.T) {
	root := ompiRoot(t)
	install(t, root, buildHello(t, mpitest.OpenMPI), "/opt/app/mpi_hello")
	for _, tt := range []struct {
		name    string
		cflags  []string // stub_ompi_nodata.c's; nil: the host's Open MPI
		missing string   // prefix of the one missing entry; "": safe
	}{
		{"lacks ompi_mpi_op_sum", []string{}, "ompi_mpi_op_sum (imported by /opt/app/mpi_hello"},
		{"smaller ompi_mpi_comm_world", []string{"-DWITH_OP_SUM", "-DCOMM_WORLD_SIZE=256"},
			"ompi_mpi_comm_world (copied by /opt/app/mpi_hello: 512 bytes, but libmpi.so.40 defines 256)"},
		{"host Open MPI", nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := CheckOptions{Program: "/opt/app/mpi_hello"}
			if tt.cflags != nil {
				dir := t.TempDir()
				stub := filepath.Join(dir, "libmpi.so.40.30.4")
				gcc(t, append(tt.cflags, "-shared", "-fPIC", "-Wl,-soname,libmpi.so.40", "-o", stub, "testdata/stub_ompi_nodata.c")...)
				if err := os.Symlink("libmpi.so.40.30.4", filepath.Join(dir, "libmpi.so.40")); err != nil {
					t.Fatal(err)
				}
				o.HostMPI = filepath.Join(dir, "libmpi.so.40")
			}
			rep := check(t, "/", root, o)
			if tt.missing == "" {
				if !rep.Safe {
					t.Fatalf("not safe:\n%s", findings(rep))
				}
				return
			}
			if rep.Safe {
				t.Fatalf("reported safe:\n%s", findings(rep))
			}
			f := wantFinding(t, rep, CompSymbols, VerdictFail, strings.Fields(tt.missing)[0])
			if len(f.Missing) != 1 || !strings.HasPrefix(f.Missing[0], tt.missing) {
				t.Errorf("missing = %q, want one entry %q", f.Missing, tt.missing)
			}
		})
	}
}
