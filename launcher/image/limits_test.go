package image

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
)

// TestStreamLongerThanProbed: the helper runs as the user, who can make it
// send more than the file it probed (a symlink swapped for /dev/zero, a
// FUSE file, a ptraced helper). A helper that sends the image and then 64
// MiB of zeros is refused as soon as the stream passes the probed size;
// before, root copied everything into the cache (and the docker archive,
// its tar ending in zero blocks, even converted).
func TestStreamLongerThanProbed(t *testing.T) {
	fx := fixtures(t)
	dir := openTempDir(t)
	liar := filepath.Join(dir, "lying-helper")
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = stream ]; then cat \"$2\" && exec head -c %d /dev/zero; fi\nexec %s \"$@\"\n", 64<<20, testBin)
	if err := os.WriteFile(liar, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fx.docker, fx.squashfs} {
		t.Run(filepath.Base(p), func(t *testing.T) {
			o := opts(t)
			o.Helper = []string{liar}
			_, err := Prepare(context.Background(), p, o)
			if !errors.Is(err, ErrChanged) || !strings.Contains(err.Error(), "probed") {
				t.Fatalf("Prepare = %v; want ErrChanged naming the probed size", err)
			}
			t.Logf("Prepare: %v", err)
		})
	}
}

// diskUsage is the bytes of disk used below root (st_blocks).
func diskUsage(root string) int64 {
	var n int64
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// peakWatcher polls the disk usage below root until stopped and returns
// the largest value seen.
func peakWatcher(root string) (stop func() int64) {
	var mu sync.Mutex
	var peak int64
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			if u := diskUsage(root); u > peak {
				mu.Lock()
				peak = u
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(done)
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

// gzipLayer writes a gzip-compressed layer of n files of size bytes of
// zeros each (a decompression bomb: a few hundred KiB unpacking to
// n*size bytes).
func gzipLayer(t *testing.T, n int, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bomb.tar.gz")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zw, _ := gzip.NewWriterLevel(f, gzip.BestCompression)
	tw := tar.NewWriter(zw)
	zero := make([]byte, 1<<20)
	for i := range n {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("zeros-%d", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
			t.Fatal(err)
		}
		for left := size; left > 0; {
			k := min(left, int64(len(zero)))
			if _, err := tw.Write(zero[:k]); err != nil {
				t.Fatal(err)
			}
			left -= k
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPrepareLimits: what an image makes root write is bounded by
// Options.Limits (microvm.toml [images]); each limit fails the conversion
// with ErrLimit naming its key, and a decompression bomb stops at the
// limit: the cache never holds much more than the limit.
func TestPrepareLimits(t *testing.T) {
	fx := fixtures(t)
	needTools(t, "truncate")
	const MiB = 1 << 20
	sparse := func(t *testing.T) string {
		// 256 MiB of zeros compress to a squashfs of a few KiB.
		d := t.TempDir()
		os.Mkdir(filepath.Join(d, "usr"), 0o755)
		if out, err := exec.Command("truncate", "-s", "256M", filepath.Join(d, "usr", "zeros")).CombinedOutput(); err != nil {
			t.Fatalf("truncate: %v: %s", err, out)
		}
		sq := filepath.Join(openTempDir(t), "bomb.sqsh")
		if out, err := exec.Command("mksquashfs", d, sq, "-noappend", "-quiet", "-no-progress").CombinedOutput(); err != nil {
			t.Fatalf("mksquashfs: %v: %s", err, out)
		}
		os.Chmod(sq, 0o644)
		return sq
	}
	cases := []struct {
		name   string
		image  func(t *testing.T) string
		limits Limits
		key    string
	}{
		{"gzip bomb passes the image size", func(t *testing.T) string {
			return writeOCIArchive(t, gzipLayer(t, 128, 4*MiB))
		}, Limits{ImageBytes: 16 * MiB}, KeyMaxImage},
		{"one layer passes the layer size", func(t *testing.T) string {
			return writeOCIArchive(t, layerTar(t, []tarEntry{{name: "small", body: "x"}}), gzipLayer(t, 1, 3*MiB))
		}, Limits{LayerBytes: 2 * MiB}, KeyMaxLayer},
		{"too many entries", func(t *testing.T) string {
			var es []tarEntry
			for i := range 3000 {
				es = append(es, tarEntry{name: fmt.Sprintf("f%d", i)})
			}
			return writeOCIArchive(t, layerTar(t, es))
		}, Limits{Entries: 1000}, KeyMaxEntry},
		{"squashfs bomb passes the image size", sparse, Limits{ImageBytes: 16 * MiB}, KeyMaxImage},
		{"directory passes the image size", func(*testing.T) string { return fx.rootfs }, Limits{ImageBytes: MiB}, KeyMaxImage},
		{"archive passes the user's cache", func(*testing.T) string { return fx.docker }, Limits{UserCacheBytes: MiB}, KeyUserCache},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.image(t)
			o := opts(t)
			o.Limits = tc.limits
			stop := peakWatcher(o.CacheRoot)
			start := time.Now()
			_, err := Prepare(context.Background(), p, o)
			peak := stop()
			t.Logf("Prepare (%v, cache peak %d KiB): %v", time.Since(start).Round(time.Millisecond), peak>>10, err)
			if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("Prepare = %v; want ErrLimit naming %s", err, tc.key)
			}
			if tc.key == KeyUserCache && !strings.Contains(err.Error(), fmt.Sprintf("sudo slurm-microvm image rm --uid %d", o.UID)) {
				t.Errorf("quota error %q: want the command an administrator runs to free the cache", err)
			}
			if locks := lockFiles(t, o.CacheRoot, o.UID); len(locks) != 0 {
				t.Errorf("a refused conversion left lock files %q", locks)
			}
			if limit := tc.limits.withDefaults().ImageBytes; peak > limit+8*MiB {
				t.Errorf("the cache grew to %d MiB during the conversion, past the %d MiB limit", peak>>20, limit>>20)
			}
		})
	}
}

// slowZeros is a tar stream of one member of 1 TiB of zeros, delivered at
// 64 KiB a millisecond. Once ctx is done it goes on for 3 s more and then
// fails, so that an extractor that does not watch ctx ends anyway.
type slowZeros struct {
	ctx    context.Context
	header []byte
	until  time.Time
}

func (z *slowZeros) Read(p []byte) (int, error) {
	if len(z.header) > 0 {
		n := copy(p, z.header)
		z.header = z.header[n:]
		return n, nil
	}
	if z.ctx.Err() != nil {
		if z.until.IsZero() {
			z.until = time.Now().Add(3 * time.Second)
		} else if time.Now().After(z.until) {
			return 0, errors.New("slowZeros: gave up")
		}
	}
	time.Sleep(time.Millisecond)
	n := min(len(p), 64<<10)
	clear(p[:n])
	return n, nil
}

// TestExtractCancelHugeEntry: cancelling a conversion stops the extraction
// of a single huge member promptly (the data is copied in chunks between
// which ctx is checked), not at the member's end.
func TestExtractCancelHugeEntry(t *testing.T) {
	var hdr strings.Builder
	tw := tar.NewWriter(&hdr)
	if err := tw.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40, Format: tar.FormatPAX}); err != nil {
		t.Fatal(err)
	}
	tw.Flush()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	x, err := newExtractor(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	done := make(chan error, 1)
	go func() { done <- x.extractStream(ctx, &slowZeros{ctx: ctx, header: []byte(hdr.String())}, nil) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("extract = %v; want context.Canceled", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("extraction ended %v after the cancel; want promptly", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("extraction still running 10 s after the cancel")
	}
}

// TestCleanAbandoned: a work directory whose digest lock nobody holds (its
// conversion was killed) is removed; one whose lock another process holds
// (a conversion in progress) is kept; a lock file nobody holds and with no
// disk is removed, a held one or one next to a disk is kept; nothing else
// in the cache is touched.
func TestCleanAbandoned(t *testing.T) {
	needRoot(t)
	needTools(t, "flock")
	root := filepath.Join(t.TempDir(), "cache")
	dir, err := userDir(root, 1000, true)
	if err != nil {
		t.Fatal(err)
	}
	h1, h2 := strings.Repeat("a", 64), strings.Repeat("b", 64)
	abandoned := filepath.Join(dir, tmpPrefix+h1+"-000000000001")
	busy := filepath.Join(dir, tmpPrefix+h2+"-000000000002")
	for _, w := range []string{abandoned, busy} {
		if err := os.MkdirAll(filepath.Join(w, "rootfs", "usr"), 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(w, "rootfs", "usr", "f"), []byte("x"), 0o600)
	}
	disk := filepath.Join(dir, h1+diskSuffix)
	os.WriteFile(disk, []byte("disk"), 0o444)
	os.WriteFile(filepath.Join(dir, h1+lockSuffix), nil, 0o600) // a lock file nobody holds
	h3 := strings.Repeat("d", 64)
	orphan := filepath.Join(dir, h3+lockSuffix)
	os.WriteFile(orphan, nil, 0o600) // nobody holds it, and no disk: an orphan

	holder := exec.Command("flock", filepath.Join(dir, h2+lockSuffix), "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	pid := holder.Process.Pid
	t.Cleanup(func() {
		if p, err := os.FindProcess(pid); err == nil {
			p.Kill()
		}
		holder.Wait()
	})
	for deadline := time.Now().Add(5 * time.Second); ; {
		lk, held, err := tryLockDigest(dir, h2)
		if err != nil {
			t.Fatal(err)
		}
		if held {
			break
		}
		lk.unlock()
		if time.Now().After(deadline) {
			t.Fatal("flock did not take the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}

	removed, err := CleanAbandoned(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 || removed[0] != abandoned || removed[1] != orphan {
		t.Errorf("removed %q; want only %s and %s", removed, abandoned, orphan)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("orphan lock file: %v; want removed", err)
	}
	for _, keep := range []string{h1 + lockSuffix, h2 + lockSuffix} {
		if _, err := os.Stat(filepath.Join(dir, keep)); err != nil {
			t.Errorf("lock file %s: %v; want kept", keep, err)
		}
	}
	if _, err := os.Stat(abandoned); !os.IsNotExist(err) {
		t.Errorf("abandoned work directory: %v; want removed", err)
	}
	if _, err := os.Stat(filepath.Join(busy, "rootfs", "usr", "f")); err != nil {
		t.Errorf("work directory of a conversion in progress: %v; want kept", err)
	}
	if _, err := os.Stat(disk); err != nil {
		t.Errorf("cached disk: %v; want kept", err)
	}
	if r, err := CleanAbandoned(context.Background(), filepath.Join(t.TempDir(), "missing")); err != nil || r != nil {
		t.Errorf("CleanAbandoned of a missing cache = %v, %v; want nothing", r, err)
	}
}

// TestDefaultLimitsMatchConfig: the defaults of microvm.toml's [images]
// are this package's DefaultLimits.
func TestDefaultLimitsMatchConfig(t *testing.T) {
	c := config.Defaults().Images
	got := Limits{ImageBytes: int64(c.MaxImageMiB) << 20, LayerBytes: int64(c.MaxLayerMiB) << 20, Entries: c.MaxEntries, UserCacheBytes: int64(c.UserCacheMiB) << 20, CacheBytes: int64(c.CacheMiB) << 20}
	if got != DefaultLimits() {
		t.Errorf("config defaults %+v, image defaults %+v", got, DefaultLimits())
	}
}

// lockFiles returns the lock files in the cache of uid under root.
func lockFiles(t *testing.T, root string, uid uint32) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(root, strconv.FormatUint(uint64(uid), 10), "*"+lockSuffix))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
