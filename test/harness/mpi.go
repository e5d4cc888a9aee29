package harness

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/mpi/mpitest"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// mpiPackages are the Debian packages of each implementation's image.
var mpiPackages = map[string]string{
	"openmpi": "openmpi-bin,libopenmpi3",
	"mpich":   "mpich,libmpich12",
}

// MPIImage returns a squashfs image (as enroot makes) of Debian 12 minbase
// with impl's runtime from Debian's packages (debootstrap, cached under
// CacheDir between runs) and /usr/local/bin/mpi_hello compiled on the host
// with impl's mpicc (same Debian packages, so the same ABI).
func MPIImage(t testing.TB, impl mpitest.Impl) string {
	t.Helper()
	if err := impl.Available(); err != nil {
		prereq.Missing(t, "%s: %v", impl.Name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	hello, err := impl.BuildHello(ctx, t.TempDir())
	if err != nil {
		t.Fatalf("build mpi_hello with %s: %v", impl.Name, err)
	}
	return DebianImage(t, impl.Name, mpiPackages[impl.Name], map[string]string{"usr/local/bin/mpi_hello": hello})
}

// DebianImage returns a squashfs image Root/images/<name>.sqsh of Debian
// 12 minbase with the Debian packages include (comma-separated, may be
// empty), from a debootstrap tree cached under CacheDir per name, plus
// files: in-image path (relative) -> host file, copied with the host
// file's mode. The image's linker cache is rebuilt (ldconfig -r) after the
// files are in.
func DebianImage(t testing.TB, name, include string, files map[string]string) string {
	t.Helper()
	fixture.Require(t, "debootstrap", "mksquashfs", "ldconfig")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	tree := filepath.Join(CacheDir, "debootstrap-"+name)
	if _, err := os.Stat(filepath.Join(tree, ".complete")); err != nil {
		_ = os.RemoveAll(tree)
		t.Logf("debootstrap bookworm minbase with %q (about a minute)", include)
		args := []string{"--variant=minbase"}
		if include != "" {
			args = append(args, "--include="+include)
		}
		cmd := exec.CommandContext(ctx, "debootstrap", append(args, "bookworm", tree, "http://deb.debian.org/debian")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = os.RemoveAll(tree)
			prereq.Missing(t, "debootstrap (needs Debian's mirror): %v\n%s", err, tail(out))
		}
		_ = os.RemoveAll(filepath.Join(tree, "var/cache/apt/archives"))
		if err := os.WriteFile(filepath.Join(tree, ".complete"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for rel, src := range files {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(tree, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		_ = os.Remove(dst)
		if err := os.WriteFile(dst, data, st.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	if len(files) > 0 {
		if out, err := exec.CommandContext(ctx, "ldconfig", "-r", tree).CombinedOutput(); err != nil {
			t.Fatalf("ldconfig -r %s: %v\n%s", tree, err, out)
		}
	}
	img := filepath.Join(Root, "images", name+".sqsh")
	_ = os.Remove(img)
	if out, err := exec.CommandContext(ctx, "mksquashfs", tree, img, "-noappend", "-quiet", "-no-progress", "-e", ".complete").CombinedOutput(); err != nil {
		t.Fatalf("mksquashfs: %v\n%s", err, out)
	}
	if err := os.Chmod(img, 0o644); err != nil {
		t.Fatal(err)
	}
	return img
}

func tail(b []byte) []byte {
	if len(b) > 2000 {
		return b[len(b)-2000:]
	}
	return b
}
