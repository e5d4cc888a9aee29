package driverset

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// realCache builds shared libraries into a root and has the real
// ldconfig write its cache in format ("new" or "compat"); it returns the
// cache's bytes and what `ldconfig -p` prints of it (x86-64 entries, as
// "key=value").
func realCache(t testing.TB, format string) ([]byte, []string) {
	t.Helper()
	tr := newTree(t, t.TempDir())
	for _, l := range driverLibs(testVersion) {
		tr.lib("usr/lib64/"+l[1], l[0])
	}
	tr.lib("usr/lib/x86_64-linux-gnu/libfoo.so.3.2.1", "libfoo.so.3")
	tr.write("etc/ld.so.conf", []byte("/usr/lib64\n/usr/lib/x86_64-linux-gnu\n"), 0o644)
	ld := ldconfigPath(t)
	run(t, ld, "-c", format, "-r", tr.root, "-C", "/etc/ld.so.cache", "-f", "/etc/ld.so.conf")
	raw, err := os.ReadFile(tr.path("etc/ld.so.cache"))
	if err != nil {
		t.Fatal(err)
	}
	// ldconfig -p: "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib64/libcuda.so.1"
	var printed []string
	sc := bufio.NewScanner(bytes.NewReader(run(t, ld, "-r", tr.root, "-C", "/etc/ld.so.cache", "-p")))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		k, rest, ok := strings.Cut(line, " (")
		flags, v, ok2 := strings.Cut(rest, ") => ")
		if ok && ok2 && flags == "libc6,x86-64" {
			printed = append(printed, k+"="+v)
		}
	}
	return raw, printed
}

func entryStrings(es []ldEntry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Key+"="+e.Value)
	}
	return out
}

// TestParseLDCacheRealLdconfig reads caches written by the real ldconfig
// in both layouts and finds exactly what `ldconfig -p` prints.
func TestParseLDCacheRealLdconfig(t *testing.T) {
	needTools(t)
	for _, format := range []string{"new", "compat"} {
		t.Run(format, func(t *testing.T) {
			raw, printed := realCache(t, format)
			if format == "compat" && !bytes.HasPrefix(raw, []byte(ldCacheMagicOld)) {
				t.Fatalf("ldconfig -c compat wrote no old header: % x", raw[:16])
			}
			es, err := parseLDCache(raw)
			if err != nil {
				t.Fatal(err)
			}
			got := entryStrings(es)
			slices.Sort(got)
			slices.Sort(printed)
			if len(printed) != len(driverLibs(testVersion))+1 || !slices.Equal(got, printed) {
				t.Errorf("parsed\n %q\nldconfig -p\n %q", got, printed)
			}
			for _, e := range es {
				if e.Flags != ldFlagX8664Libc6 || e.HWCap != 0 {
					t.Errorf("entry %+v", e)
				}
			}
		})
	}
}

func TestParseLDCacheFiltersAndRejects(t *testing.T) {
	needTools(t)
	raw, _ := realCache(t, "new")
	n := int(binary.LittleEndian.Uint32(raw[20:24]))
	entry := func(b []byte, i int) []byte { return b[ldCacheHeaderNew+i*ldCacheEntryNew:] }
	tests := []struct {
		name    string
		mutate  func(b []byte) []byte
		entries int    // want this many, when no error
		err     string // else an error saying this
	}{
		{"unchanged", func(b []byte) []byte { return b }, n, ""},
		{"i386 libc6 entry dropped", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(entry(b, 0), 0x0003)
			return b
		}, n - 1, ""},
		{"x32 entry dropped", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(entry(b, 1), 0x0803)
			return b
		}, n - 1, ""},
		{"truncated header", func(b []byte) []byte { return b[:30] }, 0, "header truncated"},
		{"no magic", func(b []byte) []byte { return append([]byte("garbage!"), b...) }, 0, "no \"glibc-ld.so.cache1.1\" header"},
		{"too many entries", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[20:24], 0xffffffff)
			return b
		}, 0, "entries do not fit"},
		{"key past the end", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(entry(b, 0)[4:], uint32(len(b)))
			return b
		}, 0, "entry 0 key: offset"},
		{"value past the end", func(b []byte) []byte {
			binary.LittleEndian.PutUint32(entry(b, 0)[8:], 0xfffffff0)
			return b
		}, 0, "entry 0 value: offset"},
		{"unterminated string", func(b []byte) []byte {
			b = append(b, "libx"...)
			binary.LittleEndian.PutUint32(entry(b, 0)[4:], uint32(len(b)-4))
			return b
		}, 0, "not terminated"},
		{"big-endian", func(b []byte) []byte { b[28] = 3; return b }, 0, "big-endian"},
		{"marked invalid", func(b []byte) []byte { b[28] = 1; return b }, 0, "marked invalid"},
		{"old format only", func(b []byte) []byte {
			old := make([]byte, 16+12)
			copy(old, ldCacheMagicOld)
			binary.LittleEndian.PutUint32(old[12:], 1)
			return old
		}, 0, "old format only"},
		{"old table overrunning", func(b []byte) []byte {
			old := make([]byte, 16)
			copy(old, ldCacheMagicOld)
			binary.LittleEndian.PutUint32(old[12:], 1000)
			return append(old, b...)
		}, 0, "old table of 1000 entries"},
		{"empty", func(b []byte) []byte { return nil }, 0, "no \"glibc-ld.so.cache1.1\" header"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			es, err := parseLDCache(tt.mutate(slices.Clone(raw)))
			if tt.err == "" {
				if err != nil || len(es) != tt.entries {
					t.Fatalf("%d entries, %v; want %d", len(es), err, tt.entries)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) || !errors.Is(err, errLDCache) {
				t.Fatalf("error %v, want one saying %q", err, tt.err)
			}
		})
	}
}

// FuzzParseLDCache checks that no input makes the parser panic or return
// strings that are not in the input.
func FuzzParseLDCache(f *testing.F) {
	needTools(f)
	for _, format := range []string{"new", "compat"} {
		raw, _ := realCache(f, format)
		f.Add(raw)
		f.Add(raw[:len(raw)/2])
	}
	f.Add([]byte(ldCacheMagicNew))
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := parseLDCache(b)
		if err != nil {
			return
		}
		for _, e := range es {
			if !bytes.Contains(b, []byte(e.Key+"\x00")) || !bytes.Contains(b, []byte(e.Value+"\x00")) {
				t.Fatalf("entry %+v not in the input", e)
			}
		}
	})
}

// TestParseLDCacheHostCache reads this machine's own cache when there is
// one: whatever glibc wrote it, the parser reads it.
func TestParseLDCacheHostCache(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("/", "etc", "ld.so.cache"))
	if err != nil {
		prereq.Missing(t, "no /etc/ld.so.cache on this machine (glibc's ldconfig writes it): %v", err)
	}
	es, err := parseLDCache(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(es, func(e ldEntry) bool { return strings.HasPrefix(e.Key, "libc.so.") }) {
		t.Errorf("the host cache has no libc.so.*: %q", entryStrings(es))
	}
}
