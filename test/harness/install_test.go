package harness

import (
	"bytes"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// oldFile is a destination as a running slurmd sees it: open and mapped.
type oldFile struct {
	path    string
	content []byte
	fd      *os.File
	mapped  []byte
	ino     uint64
}

// holdOld writes content to path and keeps it open and mapped, as slurmd
// and slurmstepd keep the plugin they loaded.
func holdOld(t *testing.T, path string, content []byte) *oldFile {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, content, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fd.Close() })
	m, err := unix.Mmap(int(fd.Fd()), 0, len(content), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(m) })
	var st unix.Stat_t
	if err := unix.Fstat(int(fd.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return &oldFile{path: path, content: content, fd: fd, mapped: m, ino: st.Ino}
}

// check verifies that the old inode still holds its content (through the
// open fd and the mapping) and that path is now a new inode holding want.
func (o *oldFile) check(t *testing.T, want []byte) {
	t.Helper()
	if !bytes.Equal(o.mapped, o.content) {
		t.Errorf("%s: the old, mapped inode changed under its user (written in place)", o.path)
	}
	got := make([]byte, len(o.content)+1)
	n, _ := o.fd.ReadAt(got, 0)
	if !bytes.Equal(got[:n], o.content) {
		t.Errorf("%s: the old inode now holds %d bytes, want its %d old bytes", o.path, n, len(o.content))
	}
	var st unix.Stat_t
	if err := unix.Stat(o.path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Ino == o.ino {
		t.Errorf("%s: same inode after install: written in place", o.path)
	}
	if data, err := os.ReadFile(o.path); err != nil || !bytes.Equal(data, want) {
		t.Errorf("%s: new content wrong (%d bytes, want %d): %v", o.path, len(data), len(want), err)
	}
}

func TestInstallFileKeepsOldInode(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "new.so")
	want := bytes.Repeat([]byte("new plugin "), 1000)
	if err := os.WriteFile(src, want, 0o600); err != nil {
		t.Fatal(err)
	}
	old := holdOld(t, filepath.Join(dir, "lib", "spank_microvm.so"), bytes.Repeat([]byte("old plugin "), 500))
	if err := InstallFile(src, old.path, 0o755); err != nil {
		t.Fatal(err)
	}
	old.check(t, want)
	if fi, err := os.Stat(old.path); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755: %v", fi.Mode(), err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "lib", ".*")); len(left) > 0 {
		t.Errorf("temporary files left: %q", left)
	}
	if err := InstallFile(filepath.Join(dir, "missing"), old.path, 0o755); err == nil || !strings.Contains(err.Error(), "install "+old.path) {
		t.Errorf("missing source: %v, want an error naming the destination", err)
	}
}

// inotifyEvent is one event on a watched directory.
type inotifyEvent struct {
	dir, name string
	mask      uint32
}

// watchDirs reports events in dirs until the returned func is called.
func watchDirs(t *testing.T, dirs []string) func() []inotifyEvent {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	wds := map[int32]string{}
	for _, d := range dirs {
		wd, err := unix.InotifyAddWatch(fd, d, unix.IN_CREATE|unix.IN_DELETE|unix.IN_MODIFY|unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO|unix.IN_MOVED_FROM|unix.IN_ATTRIB)
		if err != nil {
			t.Fatal(err)
		}
		wds[int32(wd)] = d
	}
	return func() []inotifyEvent {
		defer unix.Close(fd)
		var out []inotifyEvent
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if n <= 0 || err != nil {
				return out
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)], "\x00"))
				out = append(out, inotifyEvent{dir: wds[ev.Wd], name: name, mask: ev.Mask})
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}

// make install over a live installation: every destination is replaced by
// a rename (never deleted, never written in place), and a process that
// holds an old file open and mapped keeps its content.
func TestMakeInstallRenames(t *testing.T) {
	if testing.Short() {
		prereq.OptIn(t, "-short: builds the project (make build)")
	}
	fixture.Require(t, "make", "cc", "go")
	repo := fixture.RepoRoot()
	dest := t.TempDir()
	vars := map[string]string{}
	show := exec.Command("make", "--no-print-directory", "-s", "-C", repo, "-f", "dirs.mk", "-f", "-", "show")
	show.Stdin = strings.NewReader("show:\n\t@echo BINDIR=$(BINDIR)\n\t@echo LIBEXECDIR=$(LIBEXECDIR)\n\t@echo SPANKDIR=$(SPANKDIR)\n\t@echo SYSCONFDIR=$(SYSCONFDIR)\n")
	out, err := show.Output()
	if err != nil {
		t.Fatalf("dirs.mk: %v", err)
	}
	for _, l := range strings.Fields(string(out)) {
		k, v, _ := strings.Cut(l, "=")
		vars[k] = v
	}
	files := map[string]string{ // installed path -> built file
		vars["BINDIR"] + "/slurm-microvm":           "bin/slurm-microvm",
		vars["LIBEXECDIR"] + "/slurm-microvm-agent": "bin/slurm-microvm-agent",
		vars["SPANKDIR"] + "/spank_microvm.so":      "bin/spank_microvm.so",
	}
	var olds []*oldFile
	var dirs []string
	for path := range files {
		o := holdOld(t, dest+path, bytes.Repeat([]byte("old "+filepath.Base(path)+"\n"), 300))
		olds = append(olds, o)
		dirs = append(dirs, filepath.Dir(o.path))
	}
	exe := dest + vars["BINDIR"] + "/slurm-microvm-exec"
	if err := os.Symlink("old-target", exe); err != nil {
		t.Fatal(err)
	}
	conf := dest + vars["SYSCONFDIR"] + "/microvm.toml"
	if err := os.MkdirAll(filepath.Dir(conf), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte("# the site's own\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dirs = append(dirs, filepath.Dir(conf))

	stop := watchDirs(t, dirs)
	mk := exec.Command("make", "--no-print-directory", "-C", repo, "DESTDIR="+dest, "install")
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	events := stop()

	for _, o := range olds {
		want, err := os.ReadFile(filepath.Join(repo, files[strings.TrimPrefix(o.path, dest)]))
		if err != nil {
			t.Fatal(err)
		}
		o.check(t, want)
	}
	if target, err := os.Readlink(exe); err != nil || target != "slurm-microvm" {
		t.Errorf("%s -> %q (%v), want slurm-microvm", exe, target, err)
	}
	if data, _ := os.ReadFile(conf); string(data) != "# the site's own\n" {
		t.Errorf("make install replaced the site's microvm.toml: %q", data)
	}

	replaced := map[string]bool{}
	for _, ev := range events {
		p := filepath.Join(ev.dir, ev.name)
		isDest := p == exe || p == conf
		for _, o := range olds {
			isDest = isDest || p == o.path
		}
		if !isDest {
			continue
		}
		switch {
		case ev.mask&unix.IN_DELETE != 0:
			t.Errorf("%s was deleted before its replacement existed (a job starting then finds no file)", p)
		case ev.mask&(unix.IN_MODIFY|unix.IN_CLOSE_WRITE|unix.IN_CREATE) != 0:
			t.Errorf("%s was written in place (event %#x), not renamed over", p, ev.mask)
		case ev.mask&unix.IN_MOVED_TO != 0:
			replaced[p] = true
		}
	}
	for _, o := range olds {
		if !replaced[o.path] {
			t.Errorf("%s was not replaced by a rename", o.path)
		}
	}
	if !replaced[exe] {
		t.Errorf("%s was not replaced by a rename", exe)
	}
	_ = filepath.WalkDir(dest, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), ".tmp") {
			t.Errorf("temporary file left: %s", p)
		}
		return nil
	})
}
