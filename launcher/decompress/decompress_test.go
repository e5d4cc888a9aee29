package decompress

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestReader decodes what the real xz, zstd and gzip tools write, and
// reads a plain file as it is.
func TestReader(t *testing.T) {
	prereq.Tools(t, "xz", "zstd", "gzip")
	dir := t.TempDir()
	want := bytes.Repeat([]byte("module contents "), 4096)
	plain := filepath.Join(dir, "m.ko")
	if err := os.WriteFile(plain, want, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ tool, suffix string }{{"xz", ".xz"}, {"zstd", ".zst"}, {"gzip", ".gz"}, {"", ""}} {
		name := plain + tc.suffix
		if tc.tool != "" {
			if out, err := exec.Command(tc.tool, "-k", "-q", "-f", plain).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v %s", tc.tool, err, out)
			}
		}
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		r, done, err := Reader(name, f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		done()
		f.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes, %v", name, len(got), err)
		}
		if Trim(name) != plain {
			t.Errorf("Trim(%s) = %s", name, Trim(name))
		}
	}
	if _, _, err := Reader("x.xz", bytes.NewReader([]byte("not xz"))); err == nil {
		t.Error("garbage read as xz")
	}
}
