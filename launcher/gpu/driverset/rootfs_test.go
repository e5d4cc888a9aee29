package driverset

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRootFSResolve(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	tr := newTree(t, root)
	tr.write("usr/lib/x/libreal.so.1.2", []byte("real"), 0o644)
	tr.write("outside-target", nil, 0o644)
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	tr.symlink("lib", "usr/lib")                                     // relative, usr-merge
	tr.symlink("usr/lib/x/rel.so", "libreal.so.1.2")                 // same directory
	tr.symlink("usr/lib/x/abs.so", "/usr/lib/x/libreal.so.1.2")      // absolute: re-rooted
	tr.symlink("etc/alternatives/a", "/lib/x/rel.so")                // chain through a linked dir
	tr.symlink("usr/lib/x/alt.so", "/etc/alternatives/a")            // chain
	tr.symlink("usr/lib/x/up.so", "../x/../../lib/x/libreal.so.1.2") // climbing, inside
	tr.symlink("usr/lib/x/escape.so", "../../../../secret")          // out of the root
	tr.symlink("usr/lib/x/abs-escape.so", "/../secret")              // ".." above "/"
	tr.symlink("usr/lib/x/loop1", "loop2")
	tr.symlink("usr/lib/x/loop2", "loop1")
	tr.symlink("usr/lib/x/dangling", "nothing")
	tests := []struct {
		path, want string
		err        error
	}{
		{"/usr/lib/x/libreal.so.1.2", "usr/lib/x/libreal.so.1.2", nil},
		{"lib/x/rel.so", "usr/lib/x/libreal.so.1.2", nil},
		{"/lib/x/abs.so", "usr/lib/x/libreal.so.1.2", nil},
		{"/usr/lib/x/alt.so", "usr/lib/x/libreal.so.1.2", nil},
		{"/usr/lib/x/up.so", "usr/lib/x/libreal.so.1.2", nil},
		{"/usr/lib/x/escape.so", "", errEscape},
		{"/usr/lib/x/abs-escape.so", "", errEscape},
		{"/../secret", "", errEscape},
		{"/usr/lib/x/loop1", "", unix.ELOOP},
		{"/usr/lib/x/dangling", "", fs.ErrNotExist},
		{"/usr/lib/x/libreal.so.1.2/sub", "", unix.ENOTDIR},
	}
	r, err := newRootFS(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		got, err := r.resolve(tt.path)
		if tt.err != nil {
			if !errors.Is(err, tt.err) {
				t.Errorf("resolve(%q) = %q, %v; want %v", tt.path, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("resolve(%q) = %q, %v; want %q", tt.path, got, err, tt.want)
		}
	}
	// open takes a resolved path and follows no link, even one put in
	// place after the resolution.
	if _, err := r.open("usr/lib/x/rel.so", unix.O_RDONLY); !errors.Is(err, unix.ELOOP) {
		t.Errorf("open of a link: %v, want ELOOP", err)
	}
	if _, err := r.open("lib/x/libreal.so.1.2", unix.O_RDONLY); !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("open through a linked directory: %v, want ENOTDIR", err)
	}
	f, rel, err := r.openFile("/lib/x/alt.so")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if rel != "usr/lib/x/libreal.so.1.2" {
		t.Errorf("openFile rel %q", rel)
	}
	if _, _, err := r.openFile("/usr/lib"); err == nil {
		t.Errorf("openFile of a directory succeeded")
	}
	if _, _, err := r.readFile("/usr/lib/x/libreal.so.1.2", 2); err == nil {
		t.Errorf("readFile over the limit succeeded")
	}
}
