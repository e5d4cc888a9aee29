package assets

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// fakeELF returns a minimal x86-64 ET_EXEC ELF header followed by size-64
// bytes of compressible filler: enough for debug/elf and for the
// decompressors to have real work.
func fakeELF(size int, machine uint16) []byte {
	b := make([]byte, size)
	copy(b, []byte{0x7f, 'E', 'L', 'F', 2 /* 64-bit */, 1 /* LE */, 1 /* version */})
	binary.LittleEndian.PutUint16(b[16:], 2) // ET_EXEC
	binary.LittleEndian.PutUint16(b[18:], machine)
	binary.LittleEndian.PutUint32(b[20:], 1)  // EV_CURRENT
	binary.LittleEndian.PutUint16(b[52:], 64) // e_ehsize
	binary.LittleEndian.PutUint16(b[54:], 56) // e_phentsize
	binary.LittleEndian.PutUint16(b[58:], 64) // e_shentsize
	for i := 64; i < size; i++ {
		b[i] = byte(i / 1000)
	}
	return b
}

// compressPayload compresses data as the kernel build would: gzip as is,
// zstd with the 4-byte little-endian size appended (size_append).
func compressPayload(t testing.TB, c string, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	switch c {
	case "gzip":
		z := gzip.NewWriter(&buf)
		z.Write(data)
		z.Close()
		return buf.Bytes()
	case "zstd":
		z, err := zstd.NewWriter(&buf)
		if err != nil {
			t.Fatal(err)
		}
		z.Write(data)
		z.Close()
	case "bzip2":
		buf.WriteString("BZh91AY&SY") // only the magic matters
		buf.Write(data[:100])
	default:
		t.Fatalf("compressPayload: %s", c)
	}
	binary.Write(&buf, binary.LittleEndian, uint32(len(data)))
	return buf.Bytes()
}

// fakeBzImage writes a bzImage with boot protocol 2.15, setup_sects=1, the
// version string "<release> (test@fixture) #1" and payload as its
// compressed kernel, and returns its path.
func fakeBzImage(t testing.TB, dir, release string, payload []byte) string {
	t.Helper()
	const setupSects = 1
	const pmOffset = (setupSects + 1) * 512
	const payloadOff = 0x80 // from the start of the protected-mode code
	img := make([]byte, pmOffset+payloadOff+len(payload)+512)
	img[offSetupSects] = setupSects
	copy(img[offHeaderMagic:], "HdrS")
	binary.LittleEndian.PutUint16(img[offVersion:], 0x020f)
	binary.LittleEndian.PutUint16(img[offKernelVersion:], 0x100) // string at 0x300
	copy(img[0x300:], release+" (test@fixture) #1 SMP\x00")
	binary.LittleEndian.PutUint32(img[offPayloadOffset:], payloadOff)
	binary.LittleEndian.PutUint32(img[offPayloadLength:], uint32(len(payload)))
	copy(img[pmOffset+payloadOff:], payload)
	p := filepath.Join(dir, "vmlinuz-"+release)
	if err := os.WriteFile(p, img, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeSignature is a PKCS#7-style module signature trailer: a blob of n
// bytes, struct module_signature (id_type 2 = PKEY_ID_PKCS7, sig_len n) and
// the magic.
func fakeSignature(n int) []byte {
	var b bytes.Buffer
	b.Write(bytes.Repeat([]byte{0xAA}, n))
	b.Write([]byte{0, 0, 2, 0, 0, 0, 0, 0})
	binary.Write(&b, binary.BigEndian, uint32(n))
	b.WriteString(moduleSigMagic)
	return b.Bytes()
}

// fakeModules writes /lib/modules/<release> under root with depmod-style
// files. dep lines are "path: deps...", as in modules.dep; every path gets a
// small signed .ko (ELF magic + name + fake signature).
func fakeModules(t testing.TB, root, release string, dep, softdep, alias, builtin []string) string {
	t.Helper()
	dir := filepath.Join(root, release)
	write := func(name string, lines []string) {
		if lines == nil {
			return
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write("modules.dep", dep)
	write("modules.softdep", softdep)
	write("modules.alias", alias)
	write("modules.builtin", builtin)
	for _, l := range dep {
		mod, _, _ := strings.Cut(l, ":")
		p := filepath.Join(dir, mod)
		os.MkdirAll(filepath.Dir(p), 0o755)
		content := append([]byte("\x7fELF module "+mod+"\n"), fakeSignature(64)...)
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
