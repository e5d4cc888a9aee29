package assets

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/therootcompany/xz"
)

// Offsets into the x86 boot protocol's setup header
// (Documentation/arch/x86/boot.rst, "The Real-Mode Kernel Header").
const (
	offSetupSects    = 0x1f1 // u8: size of the setup in 512-byte sectors (0 means 4)
	offHeaderMagic   = 0x202 // "HdrS"
	offVersion       = 0x206 // u16: boot protocol version
	offKernelVersion = 0x20e // u16: pointer to the version string, minus 0x200
	offPayloadOffset = 0x248 // u32: payload offset from the protected-mode code (protocol >= 2.08)
	offPayloadLength = 0x24c // u32: payload length in bytes
	setupHeaderEnd   = 0x268
)

// Compression is a kernel payload compression format, found by magic.
type Compression string

// Payload compressions this package decompresses. Debian 12's kernel is xz.
const (
	CompressionGzip Compression = "gzip"
	CompressionXZ   Compression = "xz"
	CompressionZstd Compression = "zstd"
)

// payloadMagics maps a magic prefix to its compression. Formats the kernel
// can use but this package does not decompress are listed with "" so the
// error can name them (arch/x86/boot/compressed/Makefile).
var payloadMagics = []struct {
	magic []byte
	comp  Compression
	name  string
}{
	{[]byte{0x1f, 0x8b}, CompressionGzip, "gzip"},
	{[]byte{0xfd, '7', 'z', 'X', 'Z', 0x00}, CompressionXZ, "xz"},
	{[]byte{0x28, 0xb5, 0x2f, 0xfd}, CompressionZstd, "zstd"},
	{[]byte{'B', 'Z', 'h'}, "", "bzip2"},
	{[]byte{0x5d, 0x00, 0x00}, "", "lzma"},
	{[]byte{0x89, 'L', 'Z', 'O'}, "", "lzo"},
	{[]byte{0x02, 0x21, 0x4c, 0x18}, "", "lz4"},
}

// ErrUnsupportedCompression is returned for a kernel payload whose
// compression is known but not decompressed here (bzip2, lzma, lzo, lz4) or
// not recognised at all.
var ErrUnsupportedCompression = errors.New("unsupported kernel compression")

// BzImage describes an x86 bzImage as read from its setup header.
type BzImage struct {
	Path            string
	Version         string // kernel release, first word of the header's version string ("6.1.0-57-amd64")
	VersionString   string // the whole version string
	Protocol        uint16 // boot protocol version, e.g. 0x020f
	PayloadOffset   int64  // file offset of the compressed vmlinux
	PayloadLength   int64  // bytes, including the 4-byte size trailer
	Compression     Compression
	UncompressedLen uint32 // from the payload's last 4 bytes (little-endian)
}

// ReadBzImage parses the setup header of the bzImage at p and locates its
// compressed payload. It needs boot protocol 2.08 or newer (Linux 2.6.26),
// the first with payload_offset/payload_length.
func ReadBzImage(p string) (*BzImage, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read kernel image: %w", err)
	}
	defer f.Close()
	hdr := make([]byte, setupHeaderEnd)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, fmt.Errorf("read kernel image %s: setup header: %w", p, err)
	}
	if string(hdr[offHeaderMagic:offHeaderMagic+4]) != "HdrS" {
		return nil, fmt.Errorf("read kernel image %s: not an x86 bzImage (no \"HdrS\" at 0x%x)", p, offHeaderMagic)
	}
	b := &BzImage{Path: p, Protocol: binary.LittleEndian.Uint16(hdr[offVersion:])}
	if b.Protocol < 0x0208 {
		return nil, fmt.Errorf("read kernel image %s: boot protocol %#04x, need 0x0208 or newer", p, b.Protocol)
	}
	setupSects := int64(hdr[offSetupSects])
	if setupSects == 0 {
		setupSects = 4 // boot.rst: "if the setup_sects field contains 0, the real value is 4"
	}
	b.PayloadOffset = (setupSects+1)*512 + int64(binary.LittleEndian.Uint32(hdr[offPayloadOffset:]))
	b.PayloadLength = int64(binary.LittleEndian.Uint32(hdr[offPayloadLength:]))
	if b.PayloadLength < 8 {
		return nil, fmt.Errorf("read kernel image %s: payload length %d is too small", p, b.PayloadLength)
	}
	if kv := binary.LittleEndian.Uint16(hdr[offKernelVersion:]); kv != 0 {
		buf := make([]byte, 256)
		n, _ := f.ReadAt(buf, int64(kv)+0x200)
		s := buf[:n]
		if i := bytes.IndexByte(s, 0); i >= 0 {
			s = s[:i]
		}
		b.VersionString = string(s)
		if fs := strings.Fields(b.VersionString); len(fs) > 0 {
			b.Version = fs[0]
		}
	}
	magic := make([]byte, 8)
	if _, err := f.ReadAt(magic, b.PayloadOffset); err != nil {
		return nil, fmt.Errorf("read kernel image %s: payload at %d: %w", p, b.PayloadOffset, err)
	}
	name := ""
	for _, m := range payloadMagics {
		if bytes.HasPrefix(magic, m.magic) {
			b.Compression, name = m.comp, m.name
			break
		}
	}
	if b.Compression == "" {
		if name == "" {
			name = fmt.Sprintf("unknown magic % x", magic)
		}
		return nil, fmt.Errorf("read kernel image %s: payload is %s: %w (supported: gzip, xz, zstd)", p, name, ErrUnsupportedCompression)
	}
	var trailer [4]byte
	if _, err := f.ReadAt(trailer[:], b.PayloadOffset+b.PayloadLength-4); err != nil {
		return nil, fmt.Errorf("read kernel image %s: payload trailer: %w", p, err)
	}
	b.UncompressedLen = binary.LittleEndian.Uint32(trailer[:])
	return b, nil
}

// ExtractVmlinux decompresses the bzImage's payload into the file dst
// (created 0644, replaced if present) and checks that the result is an
// x86-64 ELF executable of the length the payload's trailer states.
//
// The payload's last 4 bytes hold the uncompressed length: for gzip they are
// the member's ISIZE, for every other format the kernel build appends them
// (size_append in scripts/Makefile.lib), so they are cut before decoding.
func ExtractVmlinux(ctx context.Context, b *BzImage, dst string) error {
	f, err := os.Open(b.Path)
	if err != nil {
		return fmt.Errorf("extract vmlinux: %w", err)
	}
	defer f.Close()
	n := b.PayloadLength
	if b.Compression != CompressionGzip {
		n -= 4
	}
	src := bufio.NewReaderSize(io.NewSectionReader(f, b.PayloadOffset, n), 1<<20)

	var dec io.Reader
	switch b.Compression {
	case CompressionGzip:
		z, err := gzip.NewReader(src)
		if err != nil {
			return fmt.Errorf("extract vmlinux from %s: gzip: %w", b.Path, err)
		}
		z.Multistream(false)
		dec = z
	case CompressionXZ:
		// The kernel's xz payload uses the x86 BCJ filter (scripts/xz_wrap.sh),
		// which github.com/ulikunitz/xz does not implement.
		z, err := xz.NewReader(src, 0)
		if err != nil {
			return fmt.Errorf("extract vmlinux from %s: xz: %w", b.Path, err)
		}
		z.Multistream(false)
		dec = z
	case CompressionZstd:
		z, err := zstd.NewReader(src, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
		if err != nil {
			return fmt.Errorf("extract vmlinux from %s: zstd: %w", b.Path, err)
		}
		defer z.Close()
		dec = z
	default:
		return fmt.Errorf("extract vmlinux from %s: %s: %w", b.Path, b.Compression, ErrUnsupportedCompression)
	}

	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("extract vmlinux: %w", err)
	}
	written, err := io.Copy(out, ctxReader{ctx, dec})
	if err == nil {
		err = out.Chmod(0o644) // whatever the umask: QEMU may run as another user
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("extract vmlinux from %s (%s): %w", b.Path, b.Compression, err)
	}
	if uint32(written) != b.UncompressedLen {
		return fmt.Errorf("extract vmlinux from %s (%s): got %d bytes, the payload trailer says %d (mod 2^32)", b.Path, b.Compression, written, b.UncompressedLen)
	}
	if err := checkVmlinux(dst); err != nil {
		return fmt.Errorf("extract vmlinux from %s (%s): %w", b.Path, b.Compression, err)
	}
	return nil
}

// checkVmlinux verifies that p is an x86-64 ELF executable, which is what
// QEMU's -kernel needs on -M microvm to boot through the PVH entry point.
func checkVmlinux(p string) error {
	e, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("decompressed kernel is not an ELF file: %w", err)
	}
	defer e.Close()
	if e.Machine != elf.EM_X86_64 || e.Type != elf.ET_EXEC {
		return fmt.Errorf("decompressed kernel is an ELF %s %s, want EM_X86_64 ET_EXEC", e.Machine, e.Type)
	}
	return nil
}

// ctxReader stops a long copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// NewestKernel returns the /boot/vmlinuz-<release> (under bootDir) with the
// highest release by version order ("6.1.0-57" > "6.1.0-9"), preferring those
// whose modules directory (modulesRoot/<release>) exists.
func NewestKernel(bootDir, modulesRoot string) (string, error) {
	matches, err := filepath.Glob(filepath.Join(bootDir, "vmlinuz-*"))
	if err != nil {
		return "", fmt.Errorf("find kernel: %w", err)
	}
	best, bestRel, bestMods := "", "", false
	for _, m := range matches {
		rel := strings.TrimPrefix(filepath.Base(m), "vmlinuz-")
		st, err := os.Stat(m)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		_, err = os.Stat(filepath.Join(modulesRoot, rel))
		mods := err == nil
		if best == "" || (mods && !bestMods) || (mods == bestMods && versionLess(bestRel, rel)) {
			best, bestRel, bestMods = m, rel, mods
		}
	}
	if best == "" {
		return "", fmt.Errorf("find kernel: no %s/vmlinuz-* (install linux-image-amd64 or set the kernel image)", bootDir)
	}
	return best, nil
}

// versionLess compares releases piecewise: digit runs numerically, other runs
// as strings.
func versionLess(a, b string) bool {
	for a != "" && b != "" {
		ca, ra := chunk(a)
		cb, rb := chunk(b)
		if ca != cb {
			da, db := isDigit(ca[0]), isDigit(cb[0])
			switch {
			case da && db:
				x, y := strings.TrimLeft(ca, "0"), strings.TrimLeft(cb, "0")
				if len(x) != len(y) {
					return len(x) < len(y)
				}
				return x < y
			default:
				return ca < cb
			}
		}
		a, b = ra, rb
	}
	return a == "" && b != ""
}

func chunk(s string) (string, string) {
	d := isDigit(s[0])
	i := 1
	for i < len(s) && isDigit(s[i]) == d {
		i++
	}
	return s[:i], s[i:]
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// elfInterpreter returns the PT_INTERP path of the ELF executable p, "" for
// a static executable.
func elfInterpreter(p string) (string, error) {
	e, err := elf.Open(p)
	if err != nil {
		return "", fmt.Errorf("not an ELF executable: %w", err)
	}
	defer e.Close()
	for _, prog := range e.Progs {
		if prog.Type == elf.PT_INTERP {
			b, err := io.ReadAll(prog.Open())
			if err != nil {
				return "", fmt.Errorf("read PT_INTERP: %w", err)
			}
			return string(bytes.TrimRight(b, "\x00")), nil
		}
	}
	return "", nil
}

// GuestKernelRelease is the release (`uname -r` in the guest) of the
// kernel Ensure would boot for kernelImage ("" picks it as Ensure does:
// NewestKernel of /boot and /lib/modules). It reads only the bzImage's
// setup header.
func GuestKernelRelease(kernelImage string) (string, error) {
	if kernelImage == "" {
		k, err := NewestKernel(DefaultBootDir, DefaultModulesRoot)
		if err != nil {
			return "", fmt.Errorf("guest kernel: %w", err)
		}
		kernelImage = k
	}
	b, err := ReadBzImage(kernelImage)
	if err != nil {
		return "", err
	}
	return b.Version, nil
}
