package assets

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// A module tree shaped like Debian 6.1's for the default module list, plus
// cases the real tree lacks (post softdeps, cycles, a module that is both a
// soft and a hard dependency).
var fixtureDep = []string{
	"kernel/drivers/virtio/virtio_ring.ko:",
	"kernel/drivers/virtio/virtio.ko:",
	"kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko",
	"kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko",
	"kernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko",
	"kernel/arch/x86/crypto/crc32c-intel.ko:",
	"kernel/crypto/crc32c_generic.ko:",
	"kernel/lib/libcrc32c.ko:",
	"kernel/fs/erofs/erofs.ko: kernel/lib/libcrc32c.ko",
	"kernel/fs/overlayfs/overlay.ko:",
	"kernel/drivers/ipmi/ipmi_msghandler.ko:",
	"kernel/drivers/ipmi/ipmi_devintf.ko: kernel/drivers/ipmi/ipmi_msghandler.ko",
	"kernel/test/a.ko: kernel/test/b.ko",
	"kernel/test/b.ko:",
	"kernel/test/uses-generic.ko: kernel/crypto/crc32c_generic.ko",
}

var fixtureSoftdep = []string{
	"# Soft dependencies extracted from modules themselves.",
	"softdep libcrc32c pre: crc32c",
	"softdep ipmi_msghandler post: ipmi_devintf",
	"softdep b pre: a",                 // a cycle through a soft dependency
	"softdep cifs gcm",                 // no pre:/post:, ignored
	"softdep erofs pre: no-such-thing", // unresolvable: skipped
}

var fixtureAlias = []string{
	"alias crc32c crc32c_intel",
	"alias crc32c crc32c_generic",
	"alias crypto-crc32c crc32c_generic",
	"alias pci:v00001AF4d*sv*sd*bc*sc*i* virtio_pci",
}

var fixtureBuiltin = []string{"kernel/drivers/tty/serial/8250/8250.ko", "kernel/lib/crc32.ko"}

func TestResolve(t *testing.T) {
	dir := fakeModules(t, t.TempDir(), "6.9.0-test", fixtureDep, fixtureSoftdep, fixtureAlias, fixtureBuiltin)
	ix, err := LoadModuleIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		requested []string
		required  []string
		want      []string // module names, "?" suffix for optional
		wantErr   string
	}{
		{
			name:      "dependencies first",
			requested: []string{"virtio_mmio", "virtio_blk"},
			want:      []string{"virtio", "virtio_ring", "virtio_mmio", "virtio_blk"},
		},
		{
			name:      "softdep through alias, optional, before its module",
			requested: []string{"erofs"},
			want:      []string{"crc32c_intel?", "crc32c_generic?", "libcrc32c", "erofs"},
		},
		{
			name:      "a soft dependency that is also requested is not optional",
			requested: []string{"erofs", "crc32c_generic"},
			want:      []string{"crc32c_intel?", "crc32c_generic", "libcrc32c", "erofs"},
		},
		{
			name:      "hardened by a later hard dependency",
			requested: []string{"erofs", "uses_generic"},
			want:      []string{"crc32c_intel?", "crc32c_generic", "libcrc32c", "erofs", "uses_generic"},
		},
		{
			name:      "post softdep after its module",
			requested: []string{"ipmi_msghandler"},
			want:      []string{"ipmi_msghandler", "ipmi_devintf?"},
		},
		{
			name:      "soft cycle terminates, hard order kept",
			requested: []string{"a"},
			want:      []string{"b", "a"},
		},
		{
			name:      "dash and underscore are the same module",
			requested: []string{"crc32c-intel", "virtio-ring"},
			want:      []string{"crc32c_intel", "virtio_ring"},
		},
		{
			name:      "built-in needs nothing",
			requested: []string{"8250", "overlay"},
			required:  []string{"8250"},
			want:      []string{"overlay"},
		},
		{
			name:      "missing optional skipped",
			requested: []string{"9p", "overlay"},
			required:  RequiredModules,
			want:      []string{"overlay"},
		},
		{
			name:      "missing required is an error",
			requested: []string{"virtio_pci", "virtiofs", "overlay"},
			required:  []string{"virtiofs", "virtio-pci"},
			wantErr:   "required virtio_pci, virtiofs not found",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logBuf bytes.Buffer
			entries, err := ix.Resolve(tc.requested, tc.required, slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug})))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Resolve error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range entries {
				n := e.Name()
				if e.Optional {
					n += "?"
				}
				got = append(got, n)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Resolve(%q) = %q, want %q", tc.requested, got, tc.want)
			}
			if slices.Contains(tc.requested, "9p") && !strings.Contains(logBuf.String(), "module=9p") {
				t.Errorf("skipped module not logged: %s", logBuf.String())
			}
		})
	}
}

// TestResolveDebianDefaults resolves DefaultModules against the host's real
// module tree and checks the order rules on it.
func TestResolveDebianDefaults(t *testing.T) {
	img, err := NewestKernel(DefaultBootDir, DefaultModulesRoot)
	if err != nil {
		prereq.Missing(t, "no host kernel: %v", err)
	}
	bz, err := ReadBzImage(img)
	if err != nil {
		t.Fatal(err)
	}
	ix, err := LoadModuleIndex(DefaultModulesRoot + "/" + bz.Version)
	if err != nil {
		prereq.Missing(t, "no modules for %s: %v", bz.Version, err)
	}
	entries, err := ix.Resolve(DefaultModules, RequiredModules, nil)
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, e := range entries {
		pos[e.Name()] = i
	}
	for _, m := range DefaultModules {
		if _, ok := pos[guestmod.ModuleName(m)]; !ok && !ix.Builtin(m) {
			t.Errorf("%s missing from the order", m)
		}
	}
	for _, before := range [][2]string{
		{"crc32c_generic", "libcrc32c"}, {"libcrc32c", "erofs"}, {"virtio_ring", "virtio_mmio"},
		{"virtio", "virtio_blk"}, {"9pnet", "9pnet_virtio"}, {"fuse", "virtiofs"}, {"vsock", "vmw_vsock_virtio_transport"},
	} {
		a, aok := pos[before[0]]
		b, bok := pos[before[1]]
		if aok && bok && a > b {
			t.Errorf("%s is loaded after %s", before[0], before[1])
		}
	}
	t.Logf("%d modules for %s", len(entries), bz.Version)
}
