//go:build smv_faults

package fault

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestSwitchedOn covers which switch files are honoured: the job's own or
// "all", root's, written by nobody else, no symlinks.
func TestSwitchedOn(t *testing.T) {
	prereq.Root(t, "switch files are honoured only when root owns them")
	const job = 42
	const nobody = 65534
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) // dir: root 0700, empty
		stage Stage
		want  bool
	}{
		{"no file", func(t *testing.T, dir string) {}, VMM, false},
		{"job file names the stage", func(t *testing.T, dir string) {
			write(t, dir, "42", "disk\nvmm\n", 0o600)
		}, VMM, true},
		{"job file names another stage", func(t *testing.T, dir string) {
			write(t, dir, "42", "disk\n", 0o600)
		}, VMM, false},
		{"another job's file", func(t *testing.T, dir string) {
			write(t, dir, "43", "vmm\n", 0o600)
		}, VMM, false},
		{"all", func(t *testing.T, dir string) {
			write(t, dir, "all", "image\n", 0o644)
		}, Image, true},
		{"all, surrounding blanks", func(t *testing.T, dir string) {
			write(t, dir, "all", "\n  share-rw \t\n", 0o600)
		}, ShareRW, true},
		{"a stage name is not a prefix match", func(t *testing.T, dir string) {
			write(t, dir, "all", "vmmx\nvm\n", 0o600)
		}, VMM, false},
		{"file not root's", func(t *testing.T, dir string) {
			p := write(t, dir, "42", "vmm\n", 0o600)
			chown(t, p, nobody)
		}, VMM, false},
		{"file group-writable", func(t *testing.T, dir string) {
			write(t, dir, "all", "vmm\n", 0o620)
		}, VMM, false},
		{"file other-writable", func(t *testing.T, dir string) {
			write(t, dir, "42", "vmm\n", 0o602)
		}, VMM, false},
		{"file is a symlink to a good one", func(t *testing.T, dir string) {
			good := write(t, t.TempDir(), "target", "vmm\n", 0o600)
			if err := os.Symlink(good, filepath.Join(dir, "all")); err != nil {
				t.Fatal(err)
			}
		}, VMM, false},
		{"file is a directory", func(t *testing.T, dir string) {
			if err := os.Mkdir(filepath.Join(dir, "all"), 0o700); err != nil {
				t.Fatal(err)
			}
		}, VMM, false},
		{"dir not root's", func(t *testing.T, dir string) {
			write(t, dir, "42", "vmm\n", 0o600)
			chown(t, dir, nobody)
		}, VMM, false},
		{"dir other-writable", func(t *testing.T, dir string) {
			write(t, dir, "42", "vmm\n", 0o600)
			chmod(t, dir, 0o703)
		}, VMM, false},
		{"dir group-writable", func(t *testing.T, dir string) {
			write(t, dir, "42", "vmm\n", 0o600)
			chmod(t, dir, 0o770)
		}, VMM, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "faults")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			tc.setup(t, dir)
			if got := switchedOn(dir, job, tc.stage); got != tc.want {
				t.Fatalf("switchedOn(%s, %d, %q) = %v, want %v", dir, job, tc.stage, got, tc.want)
			}
		})
	}
}

// TestSwitchedOnDirSymlink: a Dir that is a symlink to a good directory
// is off.
func TestSwitchedOnDirSymlink(t *testing.T) {
	prereq.Root(t, "switch files are honoured only when root owns them")
	base := t.TempDir()
	good := filepath.Join(base, "good")
	if err := os.Mkdir(good, 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, good, "all", "vmm\n", 0o600)
	if !switchedOn(good, 1, VMM) {
		t.Fatalf("the directory itself is not honoured")
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	if switchedOn(link, 1, VMM) {
		t.Fatalf("switchedOn(%s -> %s) = true: a symlinked directory must be off", link, good)
	}
}

// TestInjected: the error names the stage, as the poc and the e2e tests
// look for it.
func TestInjected(t *testing.T) {
	var err error = &Injected{Stage: Shares}
	var inj *Injected
	if !errors.As(err, &inj) || inj.Stage != Shares {
		t.Fatalf("errors.As(%v) = %v", err, inj)
	}
	if want := `fault injected at stage "shares"`; !strings.Contains(err.Error(), want) {
		t.Fatalf("%q does not contain %q", err, want)
	}
	if !Enabled {
		t.Fatal("Enabled = false in the smv_faults build")
	}
}

func write(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	chmod(t, p, mode) // past the umask
	return p
}

func chmod(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, p string, uid int) {
	t.Helper()
	if err := os.Chown(p, uid, -1); err != nil {
		t.Fatal(err)
	}
}
