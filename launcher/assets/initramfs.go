package assets

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	kgzip "github.com/klauspost/compress/gzip"
	"github.com/u-root/u-root/pkg/cpio"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
	"github.com/slurm-microvm/slurm-microvm/launcher/decompress"
)

// InitrdCompression is how the initramfs cpio archive is stored.
type InitrdCompression string

// Initramfs encodings. The kernel (CONFIG_RD_GZIP) unpacks both.
const (
	InitrdUncompressed InitrdCompression = "none"
	InitrdGzip         InitrdCompression = "gzip"
)

// DefaultInitrdCompression is the encoding Ensure uses when Options leaves it
// empty; see doc.go for the boot-time measurement behind the choice.
const DefaultInitrdCompression = InitrdUncompressed

// initramfsSpec is everything that goes into the archive.
type initramfsSpec struct {
	Agent   string           // host path of the binary that becomes /init
	Release string           // kernel release: modules go to lib/modules/<Release>
	ModDir  string           // host /lib/modules/<Release>
	Modules []guestmod.Entry // load order, paths relative to ModDir
	// StripSignatures drops the appended module signatures (see doc.go).
	StripSignatures bool
	Extra           []cpio.Record // more records (tests)
}

// Directories every guest needs before its first mount.
var initramfsDirs = []struct {
	name string
	mode uint64
}{
	{"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"tmp", 0o1777},
	{"run", 0o755}, {"mnt", 0o755}, {"lib", 0o755}, {"lib/modules", 0o755},
}

// writeInitramfs writes a newc cpio archive to w, compressed as c. It
// returns the module entries as stored (compressed .ko files are unpacked
// on the host, so the guest needs no decompressor and the kernel no
// CONFIG_MODULE_DECOMPRESS).
func writeInitramfs(ctx context.Context, w io.Writer, c InitrdCompression, s initramfsSpec) ([]guestmod.Entry, error) {
	var out io.Writer = w
	var closer io.Closer
	switch c {
	case InitrdUncompressed:
	case InitrdGzip:
		z, err := kgzip.NewWriterLevel(w, kgzip.DefaultCompression)
		if err != nil {
			return nil, fmt.Errorf("write initramfs: %w", err)
		}
		out, closer = z, z
	default:
		return nil, fmt.Errorf("write initramfs: unknown compression %q (want %q or %q)", c, InitrdUncompressed, InitrdGzip)
	}
	bw := bufio.NewWriterSize(out, 1<<20)
	rw := cpio.Newc.Writer(bw)
	var ino uint64
	write := func(r cpio.Record) error {
		ino++
		r.Ino = ino
		if r.Mode&cpio.S_IFMT == cpio.S_IFDIR {
			r.NLink = 2
		} else {
			r.NLink = 1
		}
		r = cpio.MakeReproducible(r)
		if err := rw.WriteRecord(r); err != nil {
			return fmt.Errorf("write initramfs: %s: %w", r.Name, err)
		}
		return nil
	}
	dirs := func(p string) error { // parents of p, outermost first
		var ds []string
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			ds = append(ds, d)
		}
		for i := len(ds) - 1; i >= 0; i-- {
			if err := write(cpio.Directory(ds[i], 0o755)); err != nil {
				return err
			}
		}
		return nil
	}

	for _, d := range initramfsDirs {
		if err := write(cpio.Directory(d.name, d.mode)); err != nil {
			return nil, err
		}
	}
	if err := write(cpio.CharDev("dev/console", 0o600, 5, 1)); err != nil {
		return nil, err
	}
	agent, err := os.ReadFile(s.Agent)
	if err != nil {
		return nil, fmt.Errorf("write initramfs: agent: %w", err)
	}
	if err := write(cpio.StaticRecord(agent, cpio.Info{Name: "init", Mode: cpio.S_IFREG | 0o755})); err != nil {
		return nil, err
	}

	modBase := path.Join("lib/modules", s.Release)
	if err := dirs(modBase + "/x"); err != nil {
		return nil, err
	}
	stored := make([]guestmod.Entry, 0, len(s.Modules))
	for _, e := range s.Modules {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("write initramfs: %w", err)
		}
		data, rel, err := readModule(filepath.Join(s.ModDir, filepath.FromSlash(e.Path)), e.Path)
		if err != nil {
			return nil, fmt.Errorf("write initramfs: %w", err)
		}
		if s.StripSignatures {
			data = stripModuleSignature(data)
		}
		name := path.Join(modBase, rel)
		if err := dirs(name); err != nil {
			return nil, err
		}
		if err := write(cpio.StaticRecord(data, cpio.Info{Name: name, Mode: cpio.S_IFREG | 0o644})); err != nil {
			return nil, err
		}
		stored = append(stored, guestmod.Entry{Path: rel, Optional: e.Optional, Boot: e.Boot, Share: e.Share, Net: e.Net})
	}
	var order bytes.Buffer
	if err := guestmod.WriteOrder(&order, s.Release, stored); err != nil {
		return nil, err
	}
	if err := write(cpio.StaticRecord(order.Bytes(), cpio.Info{Name: path.Join(modBase, guestmod.OrderFile), Mode: cpio.S_IFREG | 0o644})); err != nil {
		return nil, err
	}
	for _, r := range s.Extra {
		if err := dirs(cpio.Normalize(r.Name)); err != nil {
			return nil, err
		}
		if err := write(r); err != nil {
			return nil, err
		}
	}
	if err := cpio.WriteTrailer(rw); err != nil {
		return nil, fmt.Errorf("write initramfs: trailer: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("write initramfs: %w", err)
	}
	if closer != nil {
		if err := closer.Close(); err != nil {
			return nil, fmt.Errorf("write initramfs: %w", err)
		}
	}
	return stored, nil
}

// readModule reads a .ko file, decompressing .ko.xz, .ko.zst and .ko.gz;
// it returns the contents and the relative path to store them under (always
// ending in ".ko").
func readModule(p, rel string) ([]byte, string, error) {
	raw, err := os.ReadFile(p)
	if err != nil {
		return nil, "", fmt.Errorf("read module: %w", err)
	}
	if strings.HasSuffix(p, ".ko") {
		return raw, rel, nil
	}
	if t := decompress.Trim(p); t == p || !strings.HasSuffix(t, ".ko") {
		return nil, "", fmt.Errorf("read module %s: not a .ko, .ko.xz, .ko.zst or .ko.gz file", p)
	}
	r, done, err := decompress.Reader(p, bytes.NewReader(raw))
	if err != nil {
		return nil, "", fmt.Errorf("read module: %w", err)
	}
	defer done()
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, "", fmt.Errorf("read module %s: decompress: %w", p, err)
	}
	return data, rel[:strings.LastIndex(rel, ".ko")+3], nil
}

// moduleSigMagic ends a signed module (scripts/sign-file.c).
const moduleSigMagic = "~Module signature appended~\n"

// stripModuleSignature removes an appended module signature: the PKCS#7
// blob, the 12-byte struct module_signature before the magic (whose last 4
// bytes are the big-endian blob length, and bytes 3 and 4 the signer and key
// id lengths, zero for PKCS#7) and the magic itself
// (include/linux/module_signature.h). Unsigned or malformed input is
// returned unchanged: the kernel then judges it as it would anyway.
func stripModuleSignature(b []byte) []byte {
	if !bytes.HasSuffix(b, []byte(moduleSigMagic)) {
		return b
	}
	n := len(b) - len(moduleSigMagic)
	if n < 12 {
		return b
	}
	ms := b[n-12 : n]
	sigLen := int(ms[8])<<24 | int(ms[9])<<16 | int(ms[10])<<8 | int(ms[11])
	end := n - 12 - sigLen - int(ms[3]) - int(ms[4])
	if end <= 0 || !bytes.HasPrefix(b, []byte("\x7fELF")) {
		return b
	}
	return b[:end]
}

// moduleSigForced reports whether the kernel config next to the kernel image
// (/boot/config-<release>) enforces module signatures, or cannot be read; in
// both cases signatures are kept.
func moduleSigForced(bootDir, release string) (bool, string) {
	p := filepath.Join(bootDir, "config-"+release)
	b, err := os.ReadFile(p)
	if err != nil {
		return true, fmt.Sprintf("no kernel config %s", p)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(l) == "CONFIG_MODULE_SIG_FORCE=y" {
			return true, p + " has CONFIG_MODULE_SIG_FORCE=y"
		}
	}
	return false, ""
}
