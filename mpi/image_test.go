package mpi

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/image"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

func accessModes(t *testing.T) []DiskAccess {
	if _, err := exec.LookPath("fsck.erofs"); err != nil {
		prereq.Missing(t, "erofs-utils not installed")
	}
	modes := []DiskAccess{DiskExtract}
	if os.Geteuid() == 0 {
		modes = append(modes, DiskMount)
	}
	return modes
}

func modeName(m DiskAccess) string {
	return map[DiskAccess]string{DiskMount: "mount", DiskExtract: "extract"}[m]
}

// TestOpenDisk reads an erofs disk both ways and cleans up after itself.
func TestOpenDisk(t *testing.T) {
	modes := accessModes(t)
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "usr/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "usr/lib/libx.so.1.0"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/lib/libx.so.1.0", filepath.Join(src, "usr/lib/libx.so.1")); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(t.TempDir(), "d.erofs")
	if out, err := exec.Command("mkfs.erofs", disk, src).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v\n%s", err, out)
	}
	for _, m := range modes {
		t.Run(modeName(m), func(t *testing.T) {
			dir, done, err := OpenDisk(context.Background(), disk, m)
			if err != nil {
				t.Fatal(err)
			}
			r, err := OpenRoot(dir)
			if err != nil {
				done()
				t.Fatal(err)
			}
			b, err := r.ReadFile("/usr/lib/libx.so.1", 10)
			r.Close()
			if err != nil || string(b) != "x" {
				t.Errorf("read through the absolute link: %q, %v", b, err)
			}
			if err := done(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("%s still exists after done: %v", dir, err)
			}
		})
	}
}

// TestCheckImage runs the whole path of `mpi check --image`: a root
// filesystem directory is prepared by launcher/image into a cached erofs
// disk, opened, and checked against the host.
func TestCheckImage(t *testing.T) {
	modes := accessModes(t)
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		prereq.Missing(t, "mkfs.erofs not installed")
	}
	ompi := ompiRoot(t)
	noMPI := newRoot(t, "libz.so.1")
	cache := t.TempDir()
	opts := image.Options{
		UID: uint32(os.Getuid()), GID: uint32(os.Getgid()),
		CacheRoot: cache,
		Helper:    []string{os.Args[0]},
		HelperEnv: []string{envHelper + "=1"},
	}
	for _, m := range modes {
		for _, tt := range []struct {
			name, ref string
			safe      bool
		}{
			{"openmpi", ompi, true},
			{"no mpi", noMPI, false},
		} {
			t.Run(modeName(m)+"/"+tt.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				t0 := time.Now()
				rep, err := CheckImage(ctx, tt.ref, ImageCheckOptions{Image: opts, Access: m})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("checked in %v", time.Since(t0))
				if rep.Image != tt.ref || rep.Safe != tt.safe {
					t.Fatalf("image %q safe %v, want %q %v:\n%s", rep.Image, rep.Safe, tt.ref, tt.safe, findings(rep))
				}
				if !tt.safe {
					wantFinding(t, rep, CompMPI, VerdictFail, ErrNoImageMPI.Error())
				}
				if _, err := os.Stat(rep.ImageRoot); !os.IsNotExist(err) {
					t.Errorf("image root %s left behind: %v", rep.ImageRoot, err)
				}
			})
		}
	}
}
