package guest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckWorkdir: a working directory that is a file is reported as not a
// directory, a missing one as missing, a directory passes.
func TestCheckWorkdir(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc", "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cwd, want string // want "" for no error
	}{
		{"/etc/dir", ""},
		{"/", ""},
		{"/etc/passwd", `working directory "/etc/passwd" is not a directory in the image (it is a regular file)`},
		{"/nope", `working directory "/nope" does not exist in the image`},
		{"/etc/passwd/x", `working directory "/etc/passwd/x": a parent of it is not a directory in the image`},
	} {
		err := checkWorkdir(root, tc.cwd)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want no error", tc.cwd, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %q", tc.cwd, err, tc.want)
		}
	}
}
