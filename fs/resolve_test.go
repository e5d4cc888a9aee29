package fs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// Test identities: numeric ids without passwd entries (Cred needs none).
const (
	testUID   = 43001
	testGID   = 43001
	testGroup = 43002 // supplementary group of testUser only
)

var (
	testUser  = User{Name: "smvtest", UID: testUID, GID: testGID, Groups: []uint32{testGroup}}
	otherUser = User{Name: "smvother", UID: testUID + 10, GID: testGID + 10}
)

func needRoot(t *testing.T) {
	t.Helper()
	prereq.Root(t, "opening paths as another user (setfsuid)")
}

// hostTree builds, in a directory every user can traverse:
//
//	lustre/data/x               file
//	lustre/link-in -> data      relative, stays inside
//	lustre/link-out -> ../secret
//	lustre/link-abs -> <root>/secret
//	lustre/link-gpfs -> <root>/gpfs/d   into another allowed tree
//	lustre/rootonly/            0700 root
//	lustre/grouponly/           0750 root:testGroup
//	lustre/ro-parent/sub/
//	lustre/a,b:c d/             comma, colon, space
//	lustre2/data/
//	gpfs/d/
//	secret/
//	home/ (testUser's home, 0700 testUser)
//	lustre-link -> lustre
func hostTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	// t.TempDir's directories are 0700; the test users must get through.
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"lustre/data", "lustre/rootonly", "lustre/grouponly", "lustre/ro-parent/sub", "lustre/a,b:c d", "lustre2/data", "gpfs/d", "secret", "home"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "lustre/data/x"), []byte("x\n"), 0o644))
	must(os.Chmod(filepath.Join(root, "lustre/rootonly"), 0o700))
	must(os.Chown(filepath.Join(root, "lustre/grouponly"), 0, testGroup))
	must(os.Chmod(filepath.Join(root, "lustre/grouponly"), 0o750))
	must(os.Chown(filepath.Join(root, "home"), testUID, testGID))
	must(os.Chmod(filepath.Join(root, "home"), 0o700))
	must(os.Symlink("data", filepath.Join(root, "lustre/link-in")))
	must(os.Symlink("../secret", filepath.Join(root, "lustre/link-out")))
	must(os.Symlink(filepath.Join(root, "secret"), filepath.Join(root, "lustre/link-abs")))
	must(os.Symlink(filepath.Join(root, "gpfs/d"), filepath.Join(root, "lustre/link-gpfs")))
	must(os.Symlink("lustre", filepath.Join(root, "lustre-link")))
	return root
}

func TestResolve(t *testing.T) {
	needRoot(t)
	root := hostTree(t)
	r := func(s string) string { return strings.ReplaceAll(s, "{}", root) }
	user := testUser
	user.Home = filepath.Join(root, "home")
	policy := Policy{
		Allowed:  []string{r("{}/lustre"), r("{}/gpfs"), "$HOME"},
		Writable: []string{"$HOME"},
	}
	for _, tc := range []struct {
		name     string
		p        *Policy
		u        *User
		spec     string
		errIs    error
		errMsg   string
		resolved []string // per share, in mount order
		skipped  int
	}{
		{name: "plain", spec: "{}/lustre/data:/data", resolved: []string{"{}/lustre/data"}},
		{name: "component not prefix", spec: "{}/lustre2/data:/d", errIs: ErrNotAllowed, errMsg: "outside the trees"},
		{name: "dot-dot escape", spec: "{}/lustre/../secret:/d", errIs: ErrNotAllowed, errMsg: `resolves to "{}/secret"`},
		{name: "dot-dot inside", spec: "{}/lustre/data/../ro-parent:/d", resolved: []string{"{}/lustre/ro-parent"}},
		{name: "relative symlink escape", spec: "{}/lustre/link-out:/d", errIs: ErrNotAllowed, errMsg: `resolves to "{}/secret"`},
		{name: "absolute symlink escape", spec: "{}/lustre/link-abs:/d", errIs: ErrNotAllowed},
		{name: "symlink inside", spec: "{}/lustre/link-in:/d", resolved: []string{"{}/lustre/data"}},
		{name: "symlink into another allowed tree", spec: "{}/lustre/link-gpfs:/d", resolved: []string{"{}/gpfs/d"}},
		{name: "path through a symlinked tree", spec: "{}/lustre-link/data:/d", resolved: []string{"{}/lustre/data"}},
		{name: "only root can read", spec: "{}/lustre/rootonly:/d", errIs: ErrPermission, errMsg: "permission denied for user smvtest"},
		{name: "readable through a supplementary group", spec: "{}/lustre/grouponly:/d", resolved: []string{"{}/lustre/grouponly"}},
		{name: "group directory, user without the group", u: &otherUser, spec: "{}/lustre/grouponly:/d", errIs: ErrPermission},
		{name: "missing", spec: "{}/lustre/nope:/d", errIs: ErrNotFound},
		{name: "missing optional", spec: "{}/lustre/nope:/d:ro+optional,{}/gpfs/d:/g", resolved: []string{"{}/gpfs/d"}, skipped: 1},
		{name: "not a directory", spec: "{}/lustre/data/x:/d", errIs: unix.ENOTDIR},
		{name: "rw outside writable trees", spec: "{}/lustre/data:/d:rw", errIs: ErrNotAllowed, errMsg: "may only be mounted read-only"},
		{name: "rw in home", spec: "{}/home:/out:rw", resolved: []string{"{}/home"}},
		{name: "rw in a writable tree the user cannot write", p: &Policy{Allowed: []string{r("{}/lustre")}, Writable: []string{r("{}/lustre")}}, spec: "{}/lustre/data:/d:rw", errIs: ErrPermission, errMsg: "cannot write"},
		{name: "home dot-dot escape", spec: "{}/home/..:/d", errIs: ErrNotAllowed},
		{name: "comma colon space path", spec: `{}/lustre/a\,b\:c d:/x`, resolved: []string{"{}/lustre/a,b:c d"}},
		{name: "nested in read-only share, mount point exists", spec: "{}/lustre/ro-parent:/p,{}/gpfs/d:/p/sub", resolved: []string{"{}/lustre/ro-parent", "{}/gpfs/d"}},
		{name: "nested in read-only share, mount point missing", spec: "{}/lustre/ro-parent:/p,{}/gpfs/d:/p/new", errIs: ErrConflict, errMsg: "create it on the host"},
		{name: "nested in writable share, mount point missing", spec: "{}/gpfs/d:/h/new,{}/home:/h:rw", resolved: []string{"{}/home", "{}/gpfs/d"}},
		{name: "nested through a symlink in the parent share", spec: "{}/lustre:/l,{}/gpfs/d:/l/link-in", errIs: ErrNotAllowed, errMsg: "is a symlink or not a directory"},
		{name: "site mount opened as the user", p: &Policy{Site: []string{r("{}/lustre/rootonly:/site")}}, spec: "", errIs: ErrPermission},
		{name: "site mount outside allowed trees", p: &Policy{Site: []string{r("{}/secret:/site")}}, spec: "", resolved: []string{"{}/secret"}},
		{name: "nothing allowed", p: &Policy{}, spec: "{}/lustre/data:/d", errIs: ErrNotAllowed, errMsg: "none configured or reachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := policy
			if tc.p != nil {
				p = *tc.p
			}
			u := user
			if tc.u != nil {
				u = *tc.u
			}
			tbl, err := p.Resolve(context.Background(), Request{User: u, Mounts: r(tc.spec)})
			if tc.errIs != nil {
				var se *SpecError
				if !errors.Is(err, tc.errIs) || !errors.As(err, &se) {
					t.Fatalf("Resolve(%q) = %v, want %v", tc.spec, err, tc.errIs)
				}
				t.Logf("%v", err)
				if !strings.Contains(err.Error(), r(tc.errMsg)) {
					t.Errorf("error %q lacks %q", err, r(tc.errMsg))
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tc.spec, err)
			}
			t.Cleanup(func() { tbl.Close() })
			var got []string
			for _, s := range tbl.Shares {
				got = append(got, s.Resolved)
				if s.FS.Type == "" || s.FS.Network {
					t.Errorf("share %s: filesystem %+v", s.Destination, s.FS)
				}
			}
			want := make([]string, len(tc.resolved))
			for i, w := range tc.resolved {
				want[i] = r(w)
			}
			if !slices.Equal(got, want) {
				t.Errorf("resolved %q, want %q", got, want)
			}
			if len(tbl.Skipped) != tc.skipped {
				t.Errorf("skipped %v, want %d", tbl.Skipped, tc.skipped)
			}
		})
	}
}

// The opened object is what is shared: replacing the path after Resolve
// (here with a symlink to a secret directory) changes nothing, and QEMU's
// view (/proc/self/fd/N) is the original directory.
func TestResolveSharesTheOpenedObject(t *testing.T) {
	needRoot(t)
	root := hostTree(t)
	u := testUser
	u.Home = filepath.Join(root, "home")
	src := filepath.Join(root, "lustre/data")
	var before unix.Stat_t
	if err := unix.Stat(src, &before); err != nil {
		t.Fatal(err)
	}
	tbl, err := Policy{Allowed: []string{filepath.Join(root, "lustre")}}.Resolve(context.Background(), Request{User: u, Mounts: src + ":/data"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tbl.Close() })
	if err := os.Rename(src, src+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "secret"), src); err != nil {
		t.Fatal(err)
	}
	shares, files := tbl.NineP(3)
	if len(shares) != 1 || shares[0].Path != "/proc/self/fd/3" || files[0] != tbl.Shares[0].File || !shares[0].ReadOnly {
		t.Fatalf("NineP: %+v", shares)
	}
	var st unix.Stat_t
	if err := unix.Stat(ProcFDPath(int(files[0].Fd())), &st); err != nil {
		t.Fatal(err)
	}
	if st.Ino != before.Ino || st.Dev != before.Dev {
		t.Errorf("the share's descriptor now names inode %d, was %d", st.Ino, before.Ino)
	}
	names, err := os.ReadDir(ProcFDPath(int(files[0].Fd())))
	if err != nil || len(names) != 1 || names[0].Name() != "x" {
		t.Errorf("reading the share through its descriptor: %v %v", names, err)
	}
}

func TestResolveScratch(t *testing.T) {
	needRoot(t)
	root := hostTree(t)
	u := testUser
	u.Home = filepath.Join(root, "home")
	base := filepath.Join(rootOnlyDir(t), "scratch-base")
	p := Policy{ScratchBase: base, ScratchDestination: "/scratch", Allowed: []string{filepath.Join(root, "gpfs")}}
	tbl, err := p.Resolve(context.Background(), Request{User: u, Step: "42.0.0", Mounts: filepath.Join(root, "gpfs/d") + ":/scratch/data"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tbl.Close() })
	dir := filepath.Join(base, "42.0.0")
	if tbl.ScratchDir != dir || len(tbl.Shares) != 2 || tbl.Shares[0].Destination != "/scratch" || tbl.Shares[0].ReadOnly || tbl.Shares[0].Origin != OriginScratch {
		t.Fatalf("table %+v", tbl)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != testUID || st.Gid != testGID || st.Mode&0o7777 != 0o700 {
		t.Errorf("scratch %s: uid %d gid %d mode %#o, want %d %d 0700", dir, st.Uid, st.Gid, st.Mode&0o7777, testUID, testGID)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The user cannot replace the base's entries; a planted symlink is
	// removed, not followed.
	if err := os.Symlink(filepath.Join(root, "secret"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveScratch("42.0.0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("scratch still there after RemoveScratch: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "secret")); err != nil {
		t.Errorf("symlink target removed: %v", err)
	}
	if err := p.RemoveScratch("42.0.0"); err != nil {
		t.Errorf("second RemoveScratch: %v", err)
	}

	// keep_scratch keeps it; gc of the job removes it when not kept.
	if _, err := p.CreateScratch(u, "43.1.0"); err != nil {
		t.Fatal(err)
	}
	keep := p
	keep.KeepScratch = true
	if err := keep.RemoveScratch("43.1.0"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(base, "43.1.0")); err != nil {
		t.Errorf("keep_scratch: %v", err)
	}
	if err := p.RemoveJobScratch(43, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(base, "43.1.0")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("RemoveJobScratch left %v", err)
	}

	// A failing Resolve removes the scratch it created.
	_, err = p.Resolve(context.Background(), Request{User: u, Step: "44.0.0", Mounts: filepath.Join(root, "secret") + ":/s"})
	if !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("Resolve: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(base, "44.0.0")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed Resolve left its scratch: %v", err)
	}

	// A base others can write is refused; bad step names are refused.
	if err := os.Chmod(base, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateScratch(u, "45.0.0"); err == nil || !strings.Contains(err.Error(), "writable only by root") {
		t.Errorf("world-writable base: %v", err)
	}
	for _, bad := range []string{"", ".", "..", "a/b", "x\n"} {
		if _, err := p.ScratchDir(bad); err == nil {
			t.Errorf("ScratchDir(%q) accepted", bad)
		}
	}
}

// Credentials are per thread: while paths are opened as the user on one
// thread, root's opens on every other thread keep working, and the user's
// thread has exactly the user's fsuid, fsgid and groups.
func TestOpenAsThreadCredentials(t *testing.T) {
	needRoot(t)
	root := hostTree(t)
	rootOnly := filepath.Join(root, "lustre/rootonly")
	c := testUser.Cred()
	var inside [3]any
	err := asUser(context.Background(), c, func() error {
		u, g, gs := threadCred()
		inside = [3]any{u, g, gs}
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if inside[0] != uint32(testUID) || inside[1] != uint32(testGID) || !slices.Equal(inside[2].([]uint32), []uint32{testGroup}) {
		t.Fatalf("credentials inside asUser: %v", inside)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var rootFailures, userSuccesses int
	var mu sync.Mutex
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if f, err := os.Open(rootOnly); err != nil {
					mu.Lock()
					rootFailures++
					mu.Unlock()
				} else {
					f.Close()
				}
				runtime.Gosched()
			}
		}()
	}
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		f, _, _, err := OpenDirAs(context.Background(), c, rootOnly, nil)
		if err == nil {
			f.Close()
			userSuccesses++
		}
	}
	close(stop)
	wg.Wait()
	if rootFailures > 0 || userSuccesses > 0 {
		t.Errorf("credentials leaked between threads: root failed %d times, user succeeded %d times", rootFailures, userSuccesses)
	}
	u, g, _ := threadCred()
	if u != 0 || g != 0 {
		t.Errorf("this thread now has fsuid %d fsgid %d", u, g)
	}
}

func TestOpenAsNotRoot(t *testing.T) {
	if os.Geteuid() == 0 {
		// asUser's non-root path: the same uid runs directly, another is refused.
		return
	}
	if _, _, err := OpenAs(context.Background(), Cred{UID: uint32(os.Geteuid()) + 1}, "/"); err == nil {
		t.Error("opened as another uid without root")
	}
}

func TestOpenAsContextDeadline(t *testing.T) {
	needRoot(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := OpenAs(ctx, testUser.Cred(), "/"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}
