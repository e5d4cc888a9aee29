package mpi

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	erofs "github.com/erofs/go-erofs"
	"github.com/moby/sys/mountinfo"

	"github.com/slurm-microvm/slurm-microvm/launcher/image"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// needErofsTools skips (fails under CI=true) without erofs-utils.
func needErofsTools(t *testing.T) {
	t.Helper()
	prereq.Tools(t, "mkfs.erofs", "fsck.erofs")
}

// mkfsErofs builds an erofs disk of tree src with mkfs.erofs and extra
// arguments (-zlz4), as launcher/image does.
func mkfsErofs(t *testing.T, src string, args ...string) string {
	t.Helper()
	disk := filepath.Join(t.TempDir(), "d.erofs")
	args = append(append([]string{"--quiet", "-x-1"}, args...), disk, src)
	if out, err := exec.Command("mkfs.erofs", args...).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return disk
}

// TestOpenDisk reads erofs disks built by the real mkfs.erofs, plain and
// compressed, each way: files through absolute and relative links, a
// file of several blocks with an inline tail byte for byte, a directory
// listing; the compressed disk falls back to an extraction under WorkDir,
// which Close removes.
func TestOpenDisk(t *testing.T) {
	needErofsTools(t)
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
	if err := os.Symlink("../../usr/lib/libx.so.1", filepath.Join(src, "usr/lib/up")); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 3*4096+123) // three blocks and an inline tail
	for i := range big {
		big[i] = byte(i*7 + i/4096)
	}
	if err := os.WriteFile(filepath.Join(src, "usr/lib/big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	plain := mkfsErofs(t, src)
	lz4 := mkfsErofs(t, src, "-zlz4")
	for _, tt := range []struct {
		name      string
		disk      string
		access    DiskAccess
		extracted bool // an extraction under WorkDir while open
		fails     error
	}{
		{"plain/auto", plain, DiskAuto, false, nil},
		{"plain/read", plain, DiskRead, false, nil},
		{"plain/extract", plain, DiskExtract, true, nil},
		{"lz4/auto", lz4, DiskAuto, true, nil},
		{"lz4/read", lz4, DiskRead, false, erofs.ErrNotImplemented},
	} {
		t.Run(tt.name, func(t *testing.T) {
			work := t.TempDir()
			r, err := OpenDisk(context.Background(), tt.disk, DiskOptions{Access: tt.access, WorkDir: work})
			if tt.fails != nil {
				if !errors.Is(err, tt.fails) || !strings.Contains(err.Error(), tt.disk) {
					t.Fatalf("err %v: want %v naming the disk", err, tt.fails)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{"/usr/lib/libx.so.1", "/usr/lib/up"} {
				if b, err := r.ReadFile(p, 10); err != nil || string(b) != "x" {
					t.Errorf("read %s through its link: %q, %v", p, b, err)
				}
			}
			if b, err := r.ReadFile("/usr/lib/big", 1<<20); err != nil || string(b) != string(big) {
				t.Errorf("read big: %d bytes, %v; want its %d bytes", len(b), err, len(big))
			}
			f, err := r.Open("/usr/lib/big")
			if err != nil {
				t.Fatal(err)
			}
			mid := make([]byte, 200)
			if n, err := f.ReadAt(mid, 4096-100); n != 200 || err != nil || string(mid) != string(big[4096-100:4096+100]) {
				t.Errorf("ReadAt across a block boundary: %d, %v", n, err)
			}
			if n, err := f.ReadAt(mid, int64(len(big))-50); n != 50 || err == nil {
				t.Errorf("ReadAt past the end: %d, %v; want 50 and io.EOF", n, err)
			}
			f.Close()
			ents, err := r.ReadDir("/usr/lib")
			if err != nil || len(ents) != 4 {
				t.Errorf("ReadDir /usr/lib: %d entries, %v; want 4", len(ents), err)
			}
			left, _ := os.ReadDir(work)
			if (len(left) > 0) != tt.extracted {
				t.Errorf("WorkDir holds %d entries while open; extraction expected: %v", len(left), tt.extracted)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if left, _ := os.ReadDir(work); len(left) != 0 {
				t.Errorf("WorkDir holds %v after Close", left)
			}
		})
	}
}

// exposureProbe is a slog handler that, on the check's "discovered"
// record (both roots discovered, the image open), records what the host
// shows of the image at that moment: mounts of it, loop devices backed by
// its disk, and files of it that user other can read.
type exposureProbe struct {
	t      *testing.T
	cache  string // the image cache: the disk is somewhere under it
	secret string // in-image path of a file only the image's owner may read
	other  *syscall.Credential
	ran    bool
	found  []string
}

func (p *exposureProbe) Enabled(context.Context, slog.Level) bool { return true }
func (p *exposureProbe) WithAttrs([]slog.Attr) slog.Handler       { return p }
func (p *exposureProbe) WithGroup(string) slog.Handler            { return p }

func (p *exposureProbe) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message != "discovered" {
		return nil
	}
	p.ran = true
	// Loop devices whose backing file is a disk of this cache.
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range loops {
		b, err := os.ReadFile(bf)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), p.cache) {
			p.found = append(p.found, "loop device "+filepath.Base(filepath.Dir(filepath.Dir(bf)))+" backed by "+strings.TrimSpace(string(b)))
		}
	}
	// Mounts of those loop devices or under the temporary directory.
	ms, err := mountinfo.GetMounts(nil)
	if err != nil {
		p.t.Errorf("read the mount table: %v", err)
	}
	for _, m := range ms {
		if m.FSType == "erofs" && (strings.HasPrefix(m.Mountpoint, os.TempDir()+"/") || strings.HasPrefix(m.Mountpoint, p.cache)) {
			p.found = append(p.found, "erofs mount "+m.Source+" on "+m.Mountpoint)
		}
	}
	// Every copy of the secret reachable from the temporary directory
	// (a mount point or an extraction in it), read as the other user.
	var paths []string
	for _, pat := range []string{"*", "*/*"} {
		ps, _ := filepath.Glob(filepath.Join(os.TempDir(), pat, p.secret))
		paths = append(paths, ps...)
	}
	for _, path := range paths {
		cmd := exec.Command("cat", path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.other}
		if out, err := cmd.Output(); err == nil {
			p.found = append(p.found, "uid "+strconv.Itoa(int(p.other.Uid))+" read "+path+": "+strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// TestCheckImageExposesNothing: while `mpi check --image` (and the
// launcher's --microvm-mpi=auto, which reads the disk the same way) has a
// user's image open, the host's mount table shows no mount of it, no loop
// device is backed by its disk, and another local user reads none of its
// files through anything the check made.
func TestCheckImageExposesNothing(t *testing.T) {
	needErofsTools(t)
	if os.Geteuid() != 0 {
		prereq.Root(t, "to read as another user")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	root := ompiRoot(t)
	if err := os.MkdirAll(filepath.Join(root, "secret"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "secret/data"), []byte("the owner's data"), 0o644); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	probe := &exposureProbe{t: t, cache: cache, secret: "secret/data",
		other: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}}
	opts := image.Options{
		UID: uint32(os.Getuid()), GID: uint32(os.Getgid()),
		CacheRoot: cache,
		Helper:    []string{os.Args[0]},
		HelperEnv: []string{envHelper + "=1"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := CheckImage(ctx, root, ImageCheckOptions{Image: opts, CheckOptions: CheckOptions{Logger: slog.New(probe)}})
	if err != nil {
		t.Fatal(err)
	}
	if !probe.ran {
		t.Fatal("the check never logged \"discovered\": nothing was probed")
	}
	if len(probe.found) > 0 {
		t.Errorf("while the image was open:\n  %s", strings.Join(probe.found, "\n  "))
	}
	if !rep.Safe {
		t.Errorf("the host's own Open MPI is not safe:\n%s", findings(rep))
	}
}

// TestCheckImage runs the whole path of `mpi check --image`: a root
// filesystem directory is prepared by launcher/image into a cached erofs
// disk, opened, and checked against the host.
func TestCheckImage(t *testing.T) {
	needErofsTools(t)
	ompi := ompiRoot(t)
	noMPI := newRoot(t, "libz.so.1")
	cache := t.TempDir()
	opts := image.Options{
		UID: uint32(os.Getuid()), GID: uint32(os.Getgid()),
		CacheRoot: cache,
		Helper:    []string{os.Args[0]},
		HelperEnv: []string{envHelper + "=1"},
	}
	for _, m := range []struct {
		name   string
		access DiskAccess
	}{{"read", DiskRead}, {"extract", DiskExtract}} {
		for _, tt := range []struct {
			name, ref string
			safe      bool
		}{
			{"openmpi", ompi, true},
			{"no mpi", noMPI, false},
		} {
			t.Run(m.name+"/"+tt.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				work := t.TempDir()
				t0 := time.Now()
				rep, err := CheckImage(ctx, tt.ref, ImageCheckOptions{Image: opts, Disk: DiskOptions{Access: m.access, WorkDir: work}})
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
				if left, _ := os.ReadDir(work); len(left) != 0 {
					t.Errorf("extraction left behind in %s: %v", work, left)
				}
			})
		}
	}
}
