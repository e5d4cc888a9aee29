package guest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestLookPath resolves commands inside a root as the chrooted process
// would see them, by openat2 RESOLVE_IN_ROOT and by the secureJoin
// fallback alike: absolute symlinks and ".." stay inside the root, and
// only regular files with an execute bit count.
func TestLookPath(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	for _, d := range []string{"bin", "usr/bin", "sbin", "opt"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string, mode os.FileMode) {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, p string) {
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "bin/busybox"), 0o755)
	link("busybox", filepath.Join(root, "bin/true"))                      // relative
	link("/bin/busybox", filepath.Join(root, "usr/bin/abs"))              // absolute: inside the root
	link("../../../../../../bin/busybox", filepath.Join(root, "sbin/up")) // ".." clamps at the root
	write(filepath.Join(root, "bin/noexec"), 0o644)
	link("/nowhere", filepath.Join(root, "bin/dangling"))
	write(filepath.Join(outside, "escape"), 0o755)
	link(filepath.Join(outside, "escape"), filepath.Join(root, "bin/escape")) // the host's path means nothing inside
	link("/usr/bin", filepath.Join(root, "opt/bin"))                          // a symlinked directory
	const search = "/opt/bin:/usr/bin:/sbin:/bin"
	tests := []struct {
		argv0, want string // want "": not found
	}{
		{"true", "/bin/true"},
		{"abs", "/opt/bin/abs"},
		{"up", "/sbin/up"},
		{"busybox", "/bin/busybox"},
		{"/bin/true", "/bin/true"},
		{"noexec", ""},
		{"dangling", ""},
		{"escape", ""},
		{"bin", ""}, // a directory
		{"missing", ""},
		{"./rel", "./rel"}, // relative to the working directory: execve decides
	}
	for _, via := range []string{"openat2", "secureJoin"} {
		t.Run(via, func(t *testing.T) {
			for _, tt := range tests {
				r := openRoot(root)
				if via == "secureJoin" {
					r.close()
					r.fd = -1
				} else if r.fd < 0 {
					prereq.Missing(t, "no openat2(2) on this kernel (Linux 5.6 or later has it)")
				}
				got, err := lookPathIn(r, tt.argv0, search)
				r.close()
				if tt.want == "" {
					if err == nil {
						t.Errorf("%s: found %s, want not found", tt.argv0, got)
					}
					continue
				}
				if err != nil || got != tt.want {
					t.Errorf("%s: %q, %v; want %s", tt.argv0, got, err, tt.want)
				}
			}
		})
	}
}
