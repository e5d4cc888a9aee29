package assets

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

func TestExtractVmlinuxFormats(t *testing.T) {
	vmlinux := fakeELF(3<<20, uint16(elf.EM_X86_64))
	for _, tc := range []struct {
		name    string
		payload func(t *testing.T) []byte
		want    Compression
		wantErr string // substring; "" means success
	}{
		{"gzip", func(t *testing.T) []byte { return compressPayload(t, "gzip", vmlinux) }, CompressionGzip, ""},
		{"zstd", func(t *testing.T) []byte { return compressPayload(t, "zstd", vmlinux) }, CompressionZstd, ""},
		{"bzip2 is named and refused", func(t *testing.T) []byte { return compressPayload(t, "bzip2", vmlinux) }, "", "payload is bzip2"},
		{"unknown magic", func(t *testing.T) []byte { return append([]byte("garbage!"), vmlinux[:100]...) }, "", "unknown magic"},
		{"not an ELF", func(t *testing.T) []byte {
			return compressPayload(t, "gzip", bytes.Repeat([]byte("no elf "), 1000))
		}, CompressionGzip, "not an ELF"},
		{"wrong machine", func(t *testing.T) []byte {
			return compressPayload(t, "zstd", fakeELF(4096, uint16(elf.EM_AARCH64)))
		}, CompressionZstd, "want EM_X86_64"},
		{"size trailer mismatch", func(t *testing.T) []byte {
			p := compressPayload(t, "zstd", vmlinux)
			p[len(p)-1] ^= 0xff
			return p
		}, CompressionZstd, "payload trailer says"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			img := fakeBzImage(t, dir, "6.9.0-test", tc.payload(t))
			bz, err := ReadBzImage(img)
			if err != nil {
				if tc.wantErr != "" && strings.Contains(err.Error(), tc.wantErr) {
					if !errors.Is(err, ErrUnsupportedCompression) {
						t.Errorf("error %v does not wrap ErrUnsupportedCompression", err)
					}
					return
				}
				t.Fatalf("ReadBzImage: %v", err)
			}
			if bz.Version != "6.9.0-test" || bz.Compression != tc.want || bz.Protocol != 0x020f {
				t.Errorf("header = version %q compression %q protocol %#x", bz.Version, bz.Compression, bz.Protocol)
			}
			out := filepath.Join(dir, "vmlinux")
			err = ExtractVmlinux(context.Background(), bz, out)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ExtractVmlinux error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(out)
			if !bytes.Equal(got, vmlinux) {
				t.Errorf("extracted %d bytes, not the original %d", len(got), len(vmlinux))
			}
		})
	}
}

func TestReadBzImageRejects(t *testing.T) {
	dir := t.TempDir()
	notBz := filepath.Join(dir, "elf")
	os.WriteFile(notBz, fakeELF(4096, uint16(elf.EM_X86_64)), 0o644)
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("tiny"), 0o644)
	for _, p := range []string{notBz, short, filepath.Join(dir, "missing")} {
		if _, err := ReadBzImage(p); err == nil {
			t.Errorf("ReadBzImage(%s) succeeded", filepath.Base(p))
		}
	}
}

// TestExtractDebianKernel extracts the host's real bzImage (xz with the x86
// BCJ filter on Debian 12) and reports how long it takes.
func TestExtractDebianKernel(t *testing.T) {
	if testing.Short() {
		prereq.OptIn(t, "-short: decompresses a real kernel (about 1 s)")
	}
	img, err := NewestKernel(DefaultBootDir, DefaultModulesRoot)
	if err != nil {
		prereq.Missing(t, "no host kernel: %v", err)
	}
	bz, err := ReadBzImage(img)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(img, "vmlinuz-"+bz.Version) {
		t.Errorf("header version %q does not match the file name %s", bz.Version, img)
	}
	out := filepath.Join(t.TempDir(), "vmlinux")
	start := time.Now()
	if err := ExtractVmlinux(context.Background(), bz, out); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(out)
	t.Logf("%s: %s payload %d bytes -> vmlinux %d bytes in %v", img, bz.Compression, bz.PayloadLength, st.Size(), time.Since(start).Round(time.Millisecond))
}

func TestExtractHonoursContext(t *testing.T) {
	dir := t.TempDir()
	img := fakeBzImage(t, dir, "6.9.0-test", compressPayload(t, "gzip", fakeELF(1<<20, uint16(elf.EM_X86_64))))
	bz, err := ReadBzImage(img)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ExtractVmlinux(ctx, bz, filepath.Join(dir, "vmlinux")); !errors.Is(err, context.Canceled) {
		t.Errorf("ExtractVmlinux with a cancelled context = %v, want context.Canceled", err)
	}
}

func TestNewestKernel(t *testing.T) {
	boot, mods := t.TempDir(), t.TempDir()
	for _, r := range []string{"6.1.0-9-amd64", "6.1.0-57-amd64", "6.10.0-1-amd64", "5.10.0-30-amd64"} {
		os.WriteFile(filepath.Join(boot, "vmlinuz-"+r), []byte("x"), 0o644)
	}
	for _, r := range []string{"6.1.0-9-amd64", "6.1.0-57-amd64", "5.10.0-30-amd64"} {
		os.MkdirAll(filepath.Join(mods, r), 0o755)
	}
	got, err := NewestKernel(boot, mods)
	if err != nil {
		t.Fatal(err)
	}
	// 6.10.0-1 is newer but has no modules directory.
	if want := filepath.Join(boot, "vmlinuz-6.1.0-57-amd64"); got != want {
		t.Errorf("NewestKernel = %s, want %s", got, want)
	}
	if _, err := NewestKernel(t.TempDir(), mods); err == nil {
		t.Error("NewestKernel in an empty directory succeeded")
	}
}

func TestVersionLess(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"6.1.0-9-amd64", "6.1.0-57-amd64", true},
		{"6.1.0-57-amd64", "6.1.0-9-amd64", false},
		{"6.1.0-57-amd64", "6.10.0-1-amd64", true},
		{"6.1.0-57-amd64", "6.1.0-57-amd64", false},
		{"6.1", "6.1.1", true},
		{"6.1.0-007", "6.1.0-8", true},
		{"6.1.0-1-amd64", "6.1.0-1-cloud-amd64", true},
	} {
		if got := versionLess(tc.a, tc.b); got != tc.want {
			t.Errorf("versionLess(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestGuestKernelRelease(t *testing.T) {
	k, err := NewestKernel(DefaultBootDir, DefaultModulesRoot)
	if err != nil {
		prereq.Missing(t, "no Debian kernel in /boot: %v", err)
	}
	rel, err := GuestKernelRelease("")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimPrefix(filepath.Base(k), "vmlinuz-"); rel != want {
		t.Errorf("GuestKernelRelease = %q, want %q (from %s)", rel, want, k)
	}
	if _, err := GuestKernelRelease("/etc/hostname"); err == nil {
		t.Error("a file that is not a bzImage gave a release")
	}
}
