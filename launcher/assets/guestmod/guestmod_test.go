package guestmod

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestModuleName(t *testing.T) {
	for in, want := range map[string]string{
		"kernel/arch/x86/crypto/crc32c-intel.ko": "crc32c_intel",
		"kernel/fs/erofs/erofs.ko.xz":            "erofs",
		"kernel/fs/fuse/virtiofs.ko.zst":         "virtiofs",
		"9pnet_virtio.ko.gz":                     "9pnet_virtio",
		"vmw_vsock_virtio_transport":             "vmw_vsock_virtio_transport",
		"virtio-pci":                             "virtio_pci",
	} {
		if got := ModuleName(in); got != want {
			t.Errorf("ModuleName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOrderRoundTrip(t *testing.T) {
	in := []Entry{
		{Path: "kernel/drivers/virtio/virtio.ko"},
		{Path: "kernel/arch/x86/crypto/crc32c-intel.ko", Optional: true},
		{Path: "kernel/fs/erofs/erofs.ko"},
		{Path: "kernel/net/core/failover.ko", Net: true},
		{Path: "kernel/drivers/net/virtio_net.ko", Net: true, Share: true, Boot: true},
	}
	var b bytes.Buffer
	if err := WriteOrder(&b, "6.1.0-57-amd64", in); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "# slurm-microvm module load order for 6.1.0-57-amd64") {
		t.Errorf("no header comment: %q", b.String())
	}
	out, err := ParseOrder(&b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(in, out) {
		t.Errorf("round trip: %v != %v", out, in)
	}
}

func TestOrderRejects(t *testing.T) {
	for name, text := range map[string]string{
		"unknown flag":  "kernel/a.ko soft\n",
		"absolute path": "/lib/modules/x/a.ko\n",
		"escapes":       "../../etc/passwd\n",
	} {
		if _, err := ParseOrder(strings.NewReader(text)); err == nil {
			t.Errorf("%s: ParseOrder(%q) succeeded", name, text)
		}
	}
	if err := WriteOrder(&bytes.Buffer{}, "r", []Entry{{Path: "a b.ko"}}); err == nil {
		t.Error("WriteOrder accepted a path with a space")
	}
}

// TestLoadErrors runs Load against files that are not modules: the kernel
// rejects them (ENOEXEC as root, EPERM without CAP_SYS_MODULE), so nothing
// is ever loaded into the host kernel. Errors must name the module, and an
// optional module's failure must not be an error.
func TestLoadErrors(t *testing.T) {
	root := t.TempDir()
	const rel = "9.9.9-test"
	dir := filepath.Join(root, "lib", "modules", rel)
	os.MkdirAll(filepath.Join(dir, "kernel"), 0o755)
	for _, n := range []string{"bad.ko", "soft.ko"} {
		os.WriteFile(filepath.Join(dir, "kernel", n), []byte("not an ELF module"), 0o644)
	}
	var order bytes.Buffer
	WriteOrder(&order, rel, []Entry{{Path: "kernel/soft.ko", Optional: true}, {Path: "kernel/bad.ko"}, {Path: "kernel/missing.ko"}})
	os.WriteFile(filepath.Join(dir, OrderFile), order.Bytes(), 0o644)

	res, err := Load(context.Background(), Config{Root: root, Release: rel})
	if err == nil {
		t.Fatal("Load of garbage modules succeeded")
	}
	var names []string
	for _, e := range []error{err} {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				var me *ModuleError
				if !errors.As(x, &me) {
					t.Errorf("error %v is not a *ModuleError", x)
					continue
				}
				names = append(names, me.Module)
			}
		}
	}
	if !slices.Equal(names, []string{"bad", "missing"}) {
		t.Errorf("failed modules %q, want [bad missing]; err: %v", names, err)
	}
	if !strings.Contains(err.Error(), "load module bad (") {
		t.Errorf("error does not name the module: %v", err)
	}
	if len(res.OptionalFailed) != 1 || res.OptionalFailed[0].Module != "soft" {
		t.Errorf("OptionalFailed = %v, want [soft]", res.OptionalFailed)
	}
	if len(res.Loaded) != 0 {
		t.Errorf("Loaded = %v", res.Loaded)
	}
}

func TestLoadAllNoOrderFile(t *testing.T) {
	err := LoadAll(context.Background(), t.TempDir())
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("LoadAll without an order file = %v, want fs.ErrNotExist", err)
	}
}

func TestLoadCancelled(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "lib", "modules", "r")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, OrderFile), []byte("kernel/a.ko\n"), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Load(ctx, Config{Root: root, Release: "r"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Load with a cancelled context = %v", err)
	}
}
