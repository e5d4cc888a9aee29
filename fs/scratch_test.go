package fs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// rootOnlyDir is a new directory whose parents only root can write (under
// /run, not /tmp: a scratch base must not lie under a directory others can
// write, sticky or not), removed at the end of t.
func rootOnlyDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/run", "smv-fs-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// A base under a directory others can write (sticky /var/tmp, the old
// default's parent, or /tmp) is refused before any step, and by config
// check, whether the base exists yet or not: a user could create it first
// and fail every step of the node.
func TestCheckScratchBase(t *testing.T) {
	needRoot(t)
	good := rootOnlyDir(t)
	sticky := filepath.Join(good, "sticky")
	userOwned := filepath.Join(good, "user")
	for _, d := range []string{sticky, userOwned} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(sticky, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(userOwned, int(testUID), int(testGID)); err != nil {
		t.Fatal(err)
	}
	// What a user of the sticky directory does first.
	planted := filepath.Join(sticky, "planted")
	if err := os.Mkdir(planted, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(planted, int(testUID), int(testGID)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(good, filepath.Join(good, "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		base, wantErr string
	}{
		{filepath.Join(good, "scratch"), ""},
		{filepath.Join(good, "a/b/scratch"), ""},
		{filepath.Join(good, "link", "scratch"), ""},
		{filepath.Join(sticky, "scratch"), "its parent " + sticky},
		{planted, "owned by uid"},
		{filepath.Join(userOwned, "scratch"), "its parent " + userOwned},
		{filepath.Join(good, "link"), "not a directory"},
	}
	for _, tt := range tests {
		err := CheckScratchBase(tt.base)
		if tt.wantErr == "" && err != nil {
			t.Errorf("CheckScratchBase(%s): %v", tt.base, err)
		}
		if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("CheckScratchBase(%s) = %v, want an error containing %q", tt.base, err, tt.wantErr)
		}
		if tt.wantErr != "" {
			p := Policy{ScratchBase: tt.base}
			if _, err := p.CreateScratch(testUser, "1.0.0"); err == nil {
				t.Errorf("CreateScratch under %s accepted", tt.base)
			}
		}
	}
}

// Job ids repeat: with keep_scratch the directory of an earlier step of
// the same name (here another user's, with a file in it) is never handed
// to the new step; it is moved aside, intact and still its owner's.
// Without keep_scratch the leftover is removed.
func TestScratchNeverReused(t *testing.T) {
	needRoot(t)
	base := filepath.Join(rootOnlyDir(t), "scratch")
	other := User{Name: "other", UID: testUID + 1, GID: testGID + 1}
	for _, keep := range []bool{true, false} {
		p := Policy{ScratchBase: base, KeepScratch: keep}
		step := "77.0.0"
		first, err := p.CreateScratch(other, step)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(first, "secret"), []byte("other's"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := p.RemoveScratch(step); err != nil { // kept when keep
			t.Fatal(err)
		}
		if err := os.MkdirAll(first, 0o700); err != nil { // a crashed stop's leftover
			t.Fatal(err)
		}
		dir, err := p.CreateScratch(testUser, step)
		if err != nil {
			t.Fatalf("keep=%v: second step of the same name: %v", keep, err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(dir, &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != testUID {
			t.Errorf("keep=%v: scratch %s owned by uid %d, want the new user %d", keep, dir, st.Uid, testUID)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("keep=%v: the new step's scratch holds %v of the earlier step", keep, ents)
		}
		old, _ := filepath.Glob(filepath.Join(base, step+".old-*"))
		if keep {
			if len(old) != 1 {
				t.Fatalf("keep_scratch: earlier scratch not kept aside: %v", old)
			}
			b, err := os.ReadFile(filepath.Join(old[0], "secret"))
			if err := unix.Lstat(old[0], &st); err != nil || st.Uid != other.UID {
				t.Errorf("kept scratch %s: owner %d, %v", old[0], st.Uid, err)
			}
			if err != nil || string(b) != "other's" {
				t.Errorf("kept scratch lost its content: %q %v", b, err)
			}
			for _, o := range old {
				os.RemoveAll(o)
			}
		} else if len(old) != 0 {
			t.Errorf("keep_scratch off: leftover kept as %v", old)
		}
		os.RemoveAll(dir)
	}
}
