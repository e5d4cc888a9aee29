package assets

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"errors"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/u-root/u-root/pkg/cpio"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

const fixtureRelease = "6.9.0-test"

// fixture is a fake kernel (gzip bzImage), module tree and agent: fast to
// build, independent of the host's kernel.
type fixture struct {
	boot, modules, cache, agent, kernel string
	log                                 *syncBuffer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{boot: t.TempDir(), modules: t.TempDir(), cache: filepath.Join(t.TempDir(), "cache"), log: &syncBuffer{}}
	f.kernel = fakeBzImage(t, f.boot, fixtureRelease, compressPayload(t, "gzip", fakeELF(1<<20, uint16(elf.EM_X86_64))))
	os.WriteFile(filepath.Join(f.boot, "config-"+fixtureRelease), []byte("CONFIG_MODULE_SIG=y\n# CONFIG_MODULE_SIG_FORCE is not set\n"), 0o644)
	fakeModules(t, f.modules, fixtureRelease, fixtureDep, fixtureSoftdep, fixtureAlias, fixtureBuiltin)
	f.agent = filepath.Join(t.TempDir(), "agent")
	// A static ELF executable: the fake vmlinux has no PT_INTERP.
	os.WriteFile(f.agent, fakeELF(64<<10, uint16(elf.EM_X86_64)), 0o755)
	return f
}

func (f *fixture) options() Options {
	return Options{
		KernelImage: f.kernel, Agent: f.agent, CacheDir: f.cache, ModulesRoot: f.modules,
		Modules: []string{"virtio_mmio", "virtio_blk", "virtio_console", "erofs", "overlay", "9p"},
		Logger:  slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent loggers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), sub)
}

// readArchive reads every record of an initramfs (gzip or not) into memory.
func readArchive(t *testing.T, p string) map[string]cpio.Record {
	t.Helper()
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.HasPrefix(raw, []byte{0x1f, 0x8b}) {
		z, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		if raw, err = io.ReadAll(z); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(raw)))
	if err != nil {
		t.Fatalf("read cpio: %v", err)
	}
	out := map[string]cpio.Record{}
	for _, r := range recs {
		out[r.Name] = r
	}
	return out
}

func recordData(t *testing.T, r cpio.Record) []byte {
	t.Helper()
	b, err := io.ReadAll(io.NewSectionReader(r.ReaderAt, 0, int64(r.FileSize)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEnsureInitramfsContents(t *testing.T) {
	for _, comp := range []InitrdCompression{InitrdUncompressed, InitrdGzip} {
		t.Run(string(comp), func(t *testing.T) {
			f := newFixture(t)
			o := f.options()
			o.Compression = comp
			a, err := Ensure(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if a.KernelVersion != fixtureRelease || a.Compression != comp {
				t.Errorf("Assets = %+v", a)
			}
			if e, err := elf.Open(a.Kernel); err != nil {
				t.Errorf("kernel %s: %v", a.Kernel, err)
			} else {
				e.Close()
			}
			recs := readArchive(t, a.Initrd)
			for _, d := range []string{"dev", "proc", "sys", "tmp", "run", "mnt"} {
				if r, ok := recs[d]; !ok || r.Mode&cpio.S_IFMT != cpio.S_IFDIR {
					t.Errorf("/%s missing or not a directory", d)
				}
			}
			if r := recs["tmp"]; r.Mode&0o7777 != 0o1777 {
				t.Errorf("/tmp mode %o, want 1777", r.Mode&0o7777)
			}
			con, ok := recs["dev/console"]
			if !ok || con.Mode&cpio.S_IFMT != cpio.S_IFCHR || con.Rmajor != 5 || con.Rminor != 1 {
				t.Errorf("/dev/console = %+v, want char 5:1", con.Info)
			}
			ini, ok := recs["init"]
			agent, _ := os.ReadFile(f.agent)
			if !ok || ini.Mode&0o777 != 0o755 || !bytes.Equal(recordData(t, ini), agent) {
				t.Errorf("/init is not the agent with mode 0755: %+v", ini.Info)
			}
			modDir := "lib/modules/" + fixtureRelease
			order, ok := recs[modDir+"/"+guestmod.OrderFile]
			if !ok {
				t.Fatalf("no %s/%s; records: %v", modDir, guestmod.OrderFile, slices.Sorted(maps.Keys(recs)))
			}
			entries, err := guestmod.ParseOrder(bytes.NewReader(recordData(t, order)))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(entries, a.Modules) {
				t.Errorf("order file %v != Assets.Modules %v", entries, a.Modules)
			}
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
				r, ok := recs[modDir+"/"+e.Path]
				if !ok {
					t.Errorf("order names %s, not in the archive", e.Path)
					continue
				}
				data := recordData(t, r)
				if !bytes.HasPrefix(data, []byte("\x7fELF module ")) || bytes.Contains(data, []byte(moduleSigMagic)) {
					t.Errorf("%s: signature not stripped or content wrong: %q", e.Path, data)
				}
				for d := dirOf(modDir + "/" + e.Path); d != "."; d = dirOf(d) {
					if _, ok := recs[d]; !ok {
						t.Errorf("parent directory %s of %s missing (the kernel would drop the file)", d, e.Path)
					}
				}
			}
			want := []string{"virtio", "virtio_ring", "virtio_mmio", "virtio_blk", "virtio_console", "crc32c_intel", "crc32c_generic", "libcrc32c", "erofs", "overlay"}
			if !slices.Equal(names, want) {
				t.Errorf("modules %q, want %q", names, want)
			}
			if f.log.count("module=9p") == 0 {
				t.Error("skipped optional module 9p was not logged")
			}
		})
	}
}

func dirOf(p string) string {
	i := strings.LastIndex(p, "/")
	if i < 0 {
		return "."
	}
	return p[:i]
}

func TestEnsureCaching(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a1, err := Ensure(ctx, f.options())
	if err != nil {
		t.Fatal(err)
	}
	st1, _ := os.Stat(a1.Initrd)

	a2, err := Ensure(ctx, f.options())
	if err != nil {
		t.Fatal(err)
	}
	st2, _ := os.Stat(a2.Initrd)
	if a2.Key != a1.Key || !os.SameFile(st1, st2) {
		t.Errorf("second Ensure rebuilt: %s vs %s", a1.Key, a2.Key)
	}

	// A new agent: new initramfs, same extracted kernel.
	os.WriteFile(f.agent, fakeELF(80<<10, uint16(elf.EM_X86_64)), 0o755)
	a3, err := Ensure(ctx, f.options())
	if err != nil {
		t.Fatal(err)
	}
	if a3.Key == a1.Key || a3.Kernel != a1.Kernel {
		t.Errorf("agent change: key %s (was %s), kernel %s (was %s)", a3.Key, a1.Key, a3.Kernel, a1.Kernel)
	}
	if n := f.log.count("extracted guest kernel"); n != 1 {
		t.Errorf("kernel extracted %d times, want 1", n)
	}

	// A new module list: new key.
	o := f.options()
	o.Modules = append(o.Modules, "ipmi_msghandler")
	a4, err := Ensure(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if a4.Key == a3.Key {
		t.Error("module list change kept the key")
	}

	// A new kernel: new key, new vmlinux.
	fakeBzImage(t, f.boot, fixtureRelease, compressPayload(t, "zstd", fakeELF(1<<20, uint16(elf.EM_X86_64))))
	a5, err := Ensure(ctx, f.options())
	if err != nil {
		t.Fatal(err)
	}
	if a5.Key == a3.Key || a5.Kernel == a3.Kernel {
		t.Error("kernel change kept the key or the vmlinux")
	}

	// A damaged entry is rebuilt.
	os.Remove(a5.Initrd)
	a6, err := Ensure(ctx, f.options())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a6.Initrd); err != nil {
		t.Errorf("damaged entry not rebuilt: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(f.cache, ".tmp-*")); len(left) > 0 {
		t.Errorf("temporary directories left: %v", left)
	}
}

func TestEnsureConcurrentBuildsOnce(t *testing.T) {
	f := newFixture(t)
	const n = 8
	var wg sync.WaitGroup
	keys := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			a, err := Ensure(context.Background(), f.options())
			errs[i] = err
			if err == nil {
				keys[i] = a.Key
			}
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || keys[i] != keys[0] {
			t.Errorf("caller %d: key %s err %v", i, keys[i], errs[i])
		}
	}
	if b := f.log.count("built guest initramfs"); b != 1 {
		t.Errorf("initramfs built %d times by %d concurrent callers, want 1", b, n)
	}
}

func TestEnsureWaitHonoursContext(t *testing.T) {
	f := newFixture(t)
	os.MkdirAll(f.cache, 0o755)
	unlock, err := lockFile(context.Background(), filepath.Join(f.cache, ".lock")) // a builder in progress
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := Ensure(ctx, f.options()); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Ensure while locked = %v, want DeadlineExceeded", err)
	}
}

func TestEnsureErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mod     func(f *fixture, o *Options)
		wantErr string
	}{
		{"no agent", func(f *fixture, o *Options) { o.Agent = "" }, "no agent binary"},
		{"agent missing", func(f *fixture, o *Options) { o.Agent = filepath.Join(f.boot, "nope") }, "no such file"},
		{"agent dynamic", func(f *fixture, o *Options) { o.Agent = "/bin/sh" }, "dynamically linked"},
		{"required module missing", func(f *fixture, o *Options) {
			o.Modules = append(o.Modules, "virtiofs")
			o.Required = []string{"virtiofs"}
		}, "required virtiofs not found"},
		{"no modules for the kernel", func(f *fixture, o *Options) { o.ModulesRoot = f.boot }, "modules.dep"},
		{"bad compression", func(f *fixture, o *Options) { o.Compression = "lz4" }, "unknown compression"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			o := f.options()
			tc.mod(f, &o)
			if _, err := Ensure(context.Background(), o); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Ensure = %v, want error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestSignaturesKeptWhenForced(t *testing.T) {
	f := newFixture(t)
	os.WriteFile(filepath.Join(f.boot, "config-"+fixtureRelease), []byte("CONFIG_MODULE_SIG_FORCE=y\n"), 0o644)
	a, err := Ensure(context.Background(), f.options())
	if err != nil {
		t.Fatal(err)
	}
	recs := readArchive(t, a.Initrd)
	r := recs["lib/modules/"+fixtureRelease+"/kernel/fs/erofs/erofs.ko"]
	if !bytes.HasSuffix(recordData(t, r), []byte(moduleSigMagic)) {
		t.Error("signature stripped although the kernel enforces module signatures")
	}
}

func TestCompressedModules(t *testing.T) {
	dir := t.TempDir()
	plain := []byte("\x7fELF a compressed module")
	var gz, zs bytes.Buffer
	w := gzip.NewWriter(&gz)
	w.Write(plain)
	w.Close()
	zw, _ := zstd.NewWriter(&zs)
	zw.Write(plain)
	zw.Close()
	os.WriteFile(filepath.Join(dir, "m.ko.gz"), gz.Bytes(), 0o644)
	os.WriteFile(filepath.Join(dir, "m.ko.zst"), zs.Bytes(), 0o644)
	for _, name := range []string{"m.ko.gz", "m.ko.zst"} {
		data, rel, err := readModule(filepath.Join(dir, name), "kernel/x/"+name)
		if err != nil {
			t.Fatal(err)
		}
		if rel != "kernel/x/m.ko" || !bytes.Equal(data, plain) {
			t.Errorf("%s: stored as %s with %q", name, rel, data)
		}
	}
}

func TestStripModuleSignature(t *testing.T) {
	body := []byte("\x7fELF body")
	for _, tc := range []struct {
		name string
		in   []byte
		want []byte
	}{
		{"signed", append(append([]byte{}, body...), fakeSignature(300)...), body},
		{"unsigned", body, body},
		{"length beyond the file", append([]byte("\x7fELF"), fakeSignature(300)[290:]...), append([]byte("\x7fELF"), fakeSignature(300)[290:]...)},
	} {
		if got := stripModuleSignature(tc.in); !bytes.Equal(got, tc.want) {
			t.Errorf("%s: got %q", tc.name, got)
		}
	}
}

// TestEnsureConcurrentProcesses runs Ensure in several processes at once
// (this test binary re-executed): the flock must make exactly one build.
func TestEnsureConcurrentProcesses(t *testing.T) {
	f := newFixture(t)
	const n = 4
	type result struct {
		out []byte
		err error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperEnsureProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), "ASSETS_HELPER_KERNEL="+f.kernel, "ASSETS_HELPER_AGENT="+f.agent,
				"ASSETS_HELPER_CACHE="+f.cache, "ASSETS_HELPER_MODULES="+f.modules)
			out, err := cmd.CombinedOutput()
			results[i] = result{out, err}
		})
	}
	wg.Wait()
	builds, keys := 0, map[string]bool{}
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("process %d: %v\n%s", i, r.err, r.out)
		}
		builds += strings.Count(string(r.out), "built guest initramfs")
		for _, l := range strings.Split(string(r.out), "\n") {
			if k, ok := strings.CutPrefix(l, "KEY "); ok {
				keys[k] = true
			}
		}
	}
	if builds != 1 || len(keys) != 1 {
		t.Errorf("%d processes: %d builds, keys %v; want 1 build, 1 key", n, builds, keys)
	}
}

// TestHelperEnsureProcess is TestEnsureConcurrentProcesses' child.
func TestHelperEnsureProcess(t *testing.T) {
	cache := os.Getenv("ASSETS_HELPER_CACHE")
	if cache == "" {
		prereq.OptIn(t, "helper process for TestEnsureConcurrentProcesses")
	}
	a, err := Ensure(context.Background(), Options{
		KernelImage: os.Getenv("ASSETS_HELPER_KERNEL"), Agent: os.Getenv("ASSETS_HELPER_AGENT"),
		CacheDir: cache, ModulesRoot: os.Getenv("ASSETS_HELPER_MODULES"),
		Modules: []string{"virtio_mmio", "erofs"},
		Logger:  slog.New(slog.NewTextHandler(os.Stdout, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("\nKEY " + a.Key + "\n")
}

// TestEnsureReadableUnderUmask077: QEMU runs as the job's user, so the
// cache must be world-readable whatever umask the launcher inherited.
func TestEnsureReadableUnderUmask077(t *testing.T) {
	old := unix.Umask(0o077)
	t.Cleanup(func() { unix.Umask(old) })
	f := newFixture(t)
	f.cache = filepath.Join(f.cache, "a", "b")
	a, err := Ensure(context.Background(), f.options())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Dir(filepath.Dir(f.cache)), filepath.Dir(f.cache), f.cache, filepath.Dir(a.Kernel), filepath.Dir(a.Initrd)} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("%s: mode %v (err %v), want 0755", p, st.Mode().Perm(), err)
		}
	}
	for _, p := range []string{a.Kernel, a.Initrd} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o644 {
			t.Errorf("%s: mode %v (err %v), want 0644", p, st.Mode().Perm(), err)
		}
	}
}

// TestNetModulesFlagged: the default module set packs virtio_net with its
// dependencies, flagged "net" (loaded when a step has a network), not
// "boot".
func TestNetModulesFlagged(t *testing.T) {
	f := newFixture(t)
	fakeModules(t, f.modules, fixtureRelease, append(slices.Clone(fixtureDep),
		"kernel/net/core/failover.ko:",
		"kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko",
		"kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko",
	), fixtureSoftdep, fixtureAlias, fixtureBuiltin)
	o := f.options()
	o.Modules = nil // DefaultModules
	a, err := Ensure(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	net := map[string]bool{}
	for _, e := range a.Modules {
		if e.Net {
			net[e.Name()] = true
			if e.Boot && e.Name() != "virtio" && e.Name() != "virtio_ring" {
				t.Errorf("%s flagged boot: the network modules load with the network", e.Name())
			}
		}
	}
	for _, m := range []string{"virtio_net", "net_failover", "failover", "virtio", "virtio_ring"} {
		if !net[m] {
			t.Errorf("%s not flagged net; modules %+v", m, a.Modules)
		}
	}
	if net["erofs"] || net["virtio_blk"] {
		t.Errorf("unrelated modules flagged net: %v", net)
	}
}
