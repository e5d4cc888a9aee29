package driverset

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/decompress"
	"github.com/slurm-microvm/slurm-microvm/launcher/flock"
)

const (
	// layoutVersion enters every key: a change of the entry layout makes
	// new keys rather than reusing entries of the old layout.
	layoutVersion = "driverset-layout-1"
	// keepEntries is how many entries, newest first, pruning keeps besides
	// those in use.
	keepEntries = 2
	// inUseFile is the file of an entry that Use holds a shared flock on;
	// inUseMode keeps everyone but root from opening (and locking) it.
	inUseFile = ".inuse"
	inUseMode = 0o600
	// setFile is the Set an entry was built from, written last.
	setFile = "set.json"

	fileMode = 0o644
	binMode  = 0o755
	dirMode  = 0o755
)

// keyRE matches entry names (Version "-" 16 hex digits): pruning removes
// nothing else from the cache directory.
var keyRE = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._+~-]*-[0-9a-f]{16}$`)

// input is one source file of a build and where it goes.
type input struct {
	kind       string // module, firmware, library, binary
	src        string // host path, under the set's Root
	dst        string // path in the entry
	soname     string // libraries
	mode       os.FileMode
	decompress bool // a compressed module
	f          *os.File
	st         unix.Stat_t
}

// Build copies s into cacheDir/<key> (or finds it there) and returns it.
// The key is s.Version, "-", and 16 hex digits of a SHA-256 over the
// kernel release, the modules with their parameters and every input
// file's path, size, mtime (ns), inode and device: a changed file makes a
// new entry, an unchanged set finds the old one without copying.
//
// The entry holds modules/<name>.ko (decompressed), firmware/<entry>,
// lib64/<file> with its soname and unversioned links, bin/<tool> and
// set.json; files are 0644 (tools 0755) and directories 0755 whatever
// the umask. Files are hard links to their sources when these are
// root-owned regular files of exactly that mode on the cache's file
// system, else copies. Sources are read inside s.Root: a symbolic link
// leading out of it is an error.
//
// Entries appear by an atomic rename, so a concurrent Build of the same
// key finds either nothing (and builds too: the loser discards its copy)
// or a complete entry. After a build, entries other than the newest
// keepEntries and not held by Use are removed.
func Build(ctx context.Context, s *Set, cacheDir string) (*Built, error) {
	b, err := build(ctx, s, cacheDir)
	if err != nil {
		return nil, fmt.Errorf("build the NVIDIA driver set in %s: %w", cacheDir, err)
	}
	return b, nil
}

func build(ctx context.Context, s *Set, cacheDir string) (*Built, error) {
	if s == nil {
		return nil, errors.New("no driver set")
	}
	b, inputs, err := plan(s)
	if err != nil {
		return nil, err
	}
	r, err := newRootFS(s.Root)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, in := range inputs {
			if in.f != nil {
				in.f.Close()
			}
		}
	}()
	for _, in := range inputs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := in.open(r); err != nil {
			return nil, err
		}
	}
	b.Key = s.Version + "-" + key(s, inputs)
	b.Dir = filepath.Join(cacheDir, b.Key)

	if err := mkdirReadable(cacheDir); err != nil {
		return nil, err
	}
	if complete(b.Dir) {
		now := time.Now()
		_ = os.Chtimes(b.Dir, now, now) // newest for pruning; best effort
		return b, nil
	}
	tmp, done, err := newTmp(ctx, cacheDir)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := fill(ctx, tmp, s, inputs); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	// Every directory on disk before the rename: after a crash an entry
	// is whole or absent.
	if err := syncDirs(tmp); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("publish: %w", err)
	}
	err = os.Rename(tmp, b.Dir)
	if err != nil && (errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST)) && !complete(b.Dir) {
		// An entry without its set.json (a crash of an older build
		// before its directories reached the disk): moved aside under
		// a .tmp-* name, which the next Build removes, and replaced.
		if aside, aerr := os.MkdirTemp(cacheDir, ".tmp-incomplete-"); aerr == nil {
			if os.Rename(b.Dir, filepath.Join(aside, "entry")) == nil {
				err = os.Rename(tmp, b.Dir)
			}
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
		if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("publish: %w", err)
		}
		// Another builder of the same key won; use its entry.
		if !complete(b.Dir) {
			return nil, fmt.Errorf("%s exists but has no %s: remove it", b.Dir, setFile)
		}
		return b, nil
	}
	if d, err := os.Open(cacheDir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	if err := prune(ctx, cacheDir, b.Key); err != nil {
		b.Notes = append(b.Notes, err.Error())
	}
	return b, nil
}

// plan validates s and lists its inputs; the Built it returns lacks Key
// and Dir.
func plan(s *Set) (*Built, []*input, error) {
	if !versionRE.MatchString(s.Version) {
		return nil, nil, fmt.Errorf("driver version %q is not a version", s.Version)
	}
	if !versionRE.MatchString(s.KernelRelease) {
		return nil, nil, fmt.Errorf("kernel release %q is not a release", s.KernelRelease)
	}
	if len(s.Modules) == 0 {
		return nil, nil, errors.New("the set has no kernel modules")
	}
	b := &Built{LibDir: "lib64", BinDir: "bin"}
	var inputs []*input
	dsts := map[string]bool{setFile: true, inUseFile: true}
	claim := func(dst string) error {
		if dsts[dst] {
			return fmt.Errorf("two files of the set go to %s", dst)
		}
		dsts[dst] = true
		return nil
	}
	for _, m := range s.Modules {
		if !moduleNameRE.MatchString(m.Name) {
			return nil, nil, fmt.Errorf("module name %q: letters, digits and '_' only", m.Name)
		}
		if strings.ContainsAny(m.Params, "\n\x00") {
			return nil, nil, fmt.Errorf("parameters of %s hold a newline or NUL", m.Name)
		}
		if !isModuleFile(m.Path) {
			return nil, nil, fmt.Errorf("module %s: %s is not a .ko, .ko.xz, .ko.zst or .ko.gz file", m.Name, m.Path)
		}
		dst := "modules/" + m.Name + ".ko"
		if err := claim(dst); err != nil {
			return nil, nil, err
		}
		inputs = append(inputs, &input{kind: "module", src: m.Path, dst: dst, mode: fileMode, decompress: !strings.HasSuffix(m.Path, ".ko")})
		b.Modules = append(b.Modules, BuiltModule{Name: m.Name, File: dst, Params: m.Params})
	}
	for _, f := range s.Firmware {
		if !relUnder(f.Rel, "firmware", false) {
			return nil, nil, fmt.Errorf("firmware %s: destination %q is not a path under firmware/", f.Path, f.Rel)
		}
		// Decompressed, as the modules: a guest kernel may lack the
		// loader's decompressor (Debian 12's has XZ but not ZSTD).
		dst := decompress.Trim(f.Rel)
		compressed := dst != f.Rel
		if err := claim(dst); err != nil {
			return nil, nil, err
		}
		inputs = append(inputs, &input{kind: "firmware", src: f.Path, dst: dst, mode: fileMode, decompress: compressed})
		b.FirmwareDir = "firmware"
	}
	for _, l := range s.Libraries {
		if !relUnder(l.Rel, "lib64", true) {
			return nil, nil, fmt.Errorf("library %s: destination %q is not a file name under lib64/", l.Path, l.Rel)
		}
		if !relUnder("lib64/"+l.Soname, "lib64", true) {
			return nil, nil, fmt.Errorf("library %s: soname %q is not a file name", l.Path, l.Soname)
		}
		if err := claim(l.Rel); err != nil {
			return nil, nil, err
		}
		for _, link := range libLinks(l) {
			if err := claim("lib64/" + link[0]); err != nil {
				return nil, nil, err
			}
		}
		inputs = append(inputs, &input{kind: "library", src: l.Path, dst: l.Rel, soname: l.Soname, mode: fileMode})
	}
	for _, f := range s.Binaries {
		if !relUnder(f.Rel, "bin", true) {
			return nil, nil, fmt.Errorf("tool %s: destination %q is not a file name under bin/", f.Path, f.Rel)
		}
		if err := claim(f.Rel); err != nil {
			return nil, nil, err
		}
		inputs = append(inputs, &input{kind: "binary", src: f.Path, dst: f.Rel, mode: binMode})
	}
	return b, inputs, nil
}

// relUnder reports whether rel is a clean relative path below dir (one
// component below it when flat).
func relUnder(rel, dir string, flat bool) bool {
	rest, ok := strings.CutPrefix(rel, dir+"/")
	if !ok || rest == "" || path.Clean(rel) != rel || strings.ContainsRune(rel, 0) {
		return false
	}
	for _, c := range strings.Split(rest, "/") {
		if c == ".." || c == "." || c == "" {
			return false
		}
	}
	return !flat || !strings.Contains(rest, "/")
}

// libLinks are the symbolic links of a library in lib64, as {name,
// target}: the soname to the file (libcuda.so.1 -> libcuda.so.550.54.15)
// and the unversioned development name to the soname (libcuda.so ->
// libcuda.so.1), as the NVIDIA container toolkit's create-symlinks hook
// makes them. Links that would name the file itself are left out.
func libLinks(l Library) [][2]string {
	file := path.Base(l.Rel)
	var out [][2]string
	if l.Soname != file {
		out = append(out, [2]string{l.Soname, file})
	}
	if i := strings.Index(l.Soname, ".so."); i > 0 {
		if dev := l.Soname[:i+3]; dev != file && dev != l.Soname {
			out = append(out, [2]string{dev, l.Soname})
		}
	}
	return out
}

// open opens the input inside r, refusing links out of it, and records
// its identity.
func (in *input) open(r rootFS) error {
	rel, ok := r.rel(in.src)
	if !ok {
		return fmt.Errorf("%s %s is not under the driver root %s", in.kind, in.src, r.dir)
	}
	f, _, err := r.openFile(rel)
	if err != nil {
		return fmt.Errorf("open %s: %w", in.kind, err)
	}
	if err := unix.Fstat(int(f.Fd()), &in.st); err != nil {
		f.Close()
		return fmt.Errorf("open %s %s: %w", in.kind, in.src, err)
	}
	in.f = f
	return nil
}

// key is 16 hex digits of the SHA-256 over what the entry is made of.
func key(s *Set, inputs []*input) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\nrelease %q\nversion %q\nopen %v\n", layoutVersion, s.KernelRelease, s.Version, s.Open)
	for _, m := range s.Modules {
		fmt.Fprintf(h, "module %q params %q dependency %v\n", m.Name, m.Params, m.Dependency)
	}
	for _, in := range inputs {
		fmt.Fprintf(h, "%s %q -> %q soname %q size %d mtime %d.%09d inode %d device %d\n",
			in.kind, in.src, in.dst, in.soname, in.st.Size, in.st.Mtim.Sec, in.st.Mtim.Nsec, in.st.Ino, in.st.Dev)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// complete reports whether dir is a published entry.
// syncDirs fsyncs every directory of the tree at root (files are synced
// as they are written).
func syncDirs(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
}

func complete(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return false
	}
	fi, err = os.Lstat(filepath.Join(dir, setFile))
	return err == nil && fi.Mode().IsRegular()
}

// mkdirReadable makes dir (and its missing parents) mode 0755 whatever
// the umask; existing directories keep their mode.
func mkdirReadable(dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if err := mkdirReadable(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, dirMode); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return os.Chmod(dir, dirMode)
}

// newTmp makes cacheDir/.tmp-<random> for a build and holds an exclusive
// flock on it until done is called; under cacheDir/.lock it first removes
// the .tmp-* left by builders that died (whose flock nobody holds).
func newTmp(ctx context.Context, cacheDir string) (string, func(), error) {
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, ".lock"))
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	sweep(cacheDir)
	tmp, err := os.MkdirTemp(cacheDir, ".tmp-")
	if err != nil {
		return "", nil, err
	}
	d, err := os.Open(tmp)
	if err == nil {
		err = unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		if d != nil {
			d.Close()
		}
		os.RemoveAll(tmp)
		return "", nil, fmt.Errorf("lock %s: %w", tmp, err)
	}
	return tmp, func() { d.Close() }, nil
}

// sweep removes the .tmp-* directories of cacheDir that no live builder
// holds. The caller holds cacheDir/.lock, under which builders create and
// lock theirs, so an unlocked one is a dead builder's (or a pruner's, and
// pruners work under the same lock).
func sweep(cacheDir string) {
	ents, err := os.ReadDir(cacheDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		p := filepath.Join(cacheDir, e.Name())
		d, err := os.Open(p)
		if err != nil {
			continue
		}
		if unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			os.RemoveAll(p)
		}
		d.Close()
	}
}

// fill writes the entry into tmp.
func fill(ctx context.Context, tmp string, s *Set, inputs []*input) error {
	if err := os.Chmod(tmp, dirMode); err != nil {
		return err
	}
	var dev uint64
	var st unix.Stat_t
	if err := unix.Stat(tmp, &st); err == nil {
		dev = st.Dev
	}
	for _, in := range inputs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := mkdirsUnder(tmp, path.Dir(in.dst)); err != nil {
			return err
		}
		dst := filepath.Join(tmp, filepath.FromSlash(in.dst))
		var err error
		if in.decompress {
			err = writeModule(dst, in)
		} else {
			err = place(dst, in, dev)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", in.kind, in.src, err)
		}
	}
	for _, d := range []string{"lib64", "bin"} {
		if err := mkdirsUnder(tmp, d); err != nil {
			return err
		}
	}
	for _, l := range s.Libraries {
		for _, link := range libLinks(l) {
			if err := os.Symlink(link[1], filepath.Join(tmp, "lib64", link[0])); err != nil {
				return err
			}
		}
	}
	// Root's alone (0600): flock needs only an open file, so a readable
	// .inuse would let any local user, or the job's QEMU through its open
	// directory, hold it exclusively and stall every GPU step's Use.
	if err := writeFrom(filepath.Join(tmp, inUseFile), inUseMode, bytes.NewReader(nil), -1); err != nil {
		return err
	}
	js, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(tmp, setFile), append(js, '\n'))
}

// mkdirsUnder makes rel (slash-separated) under base, each directory 0755.
func mkdirsUnder(base, rel string) error {
	if rel == "." || rel == "" {
		return nil
	}
	p := base
	for _, c := range strings.Split(rel, "/") {
		p = filepath.Join(p, c)
		if err := os.Mkdir(p, dirMode); err != nil {
			if errors.Is(err, os.ErrExist) {
				continue
			}
			return err
		}
		if err := os.Chmod(p, dirMode); err != nil {
			return err
		}
	}
	return nil
}

// place hard-links the input to dst when that is safe and gives the
// wanted mode (a regular file of root, not writable by group or others,
// of exactly in.mode, on device dev), else copies it.
func place(dst string, in *input, dev uint64) error {
	if in.st.Uid == 0 && in.st.Mode&unix.S_IFMT == unix.S_IFREG && os.FileMode(in.st.Mode&0o7777) == in.mode && in.st.Dev == dev {
		// Link the very inode opened (and hashed), not whatever the path
		// names now.
		fdPath := "/proc/self/fd/" + strconv.Itoa(int(in.f.Fd()))
		if unix.Linkat(unix.AT_FDCWD, fdPath, unix.AT_FDCWD, dst, unix.AT_SYMLINK_FOLLOW) == nil {
			return nil
		}
	}
	if _, err := in.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return writeFrom(dst, in.mode, in.f, -1)
}

// writeModule writes the decompressed module (or firmware file) to dst.
func writeModule(dst string, in *input) error {
	if _, err := in.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	z, done, err := decompress.Reader(in.src, in.f)
	if err != nil {
		return err
	}
	defer done()
	return writeFrom(dst, in.mode, z, maxModuleSize)
}

// writeFrom writes r to a new file dst of the given mode, synced; limit
// (bytes, -1 for none) bounds it.
func writeFrom(dst string, mode os.FileMode, r io.Reader, limit int64) error {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if limit >= 0 {
		r = io.LimitReader(r, limit+1)
	}
	n, err := io.Copy(f, r)
	if err == nil && limit >= 0 && n > limit {
		err = fmt.Errorf("more than %d bytes", limit)
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func writeFile(dst string, data []byte) error {
	return writeFrom(dst, fileMode, bytes.NewReader(data), -1)
}

// prune removes the entries of cacheDir other than keep and the newest
// keepEntries (by modification time) that no Use holds; it takes each
// one's .inuse exclusively without waiting and skips it when busy.
func prune(ctx context.Context, cacheDir, keep string) error {
	unlock, err := lockFile(ctx, filepath.Join(cacheDir, ".lock"))
	if err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	defer unlock()
	ents, err := os.ReadDir(cacheDir)
	if err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	type entry struct {
		name  string
		mtime time.Time
	}
	var es []entry
	for _, e := range ents {
		if !e.IsDir() || !keyRE.MatchString(e.Name()) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		es = append(es, entry{e.Name(), fi.ModTime()})
	}
	slices.SortFunc(es, func(a, b entry) int {
		if c := b.mtime.Compare(a.mtime); c != 0 {
			return c
		}
		return strings.Compare(b.name, a.name)
	})
	var errs []error
	kept := 0
	for _, e := range es {
		if e.name == keep || kept < keepEntries {
			kept++
			continue
		}
		if err := removeIdle(cacheDir, e.name); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("prune old driver sets: %w", err)
	}
	return nil
}

// removeIdle removes cacheDir/name unless its .inuse is locked: it is
// renamed to a .tmp-* first, so that no Build finds it half removed.
func removeIdle(cacheDir, name string) error {
	dir := filepath.Join(cacheDir, name)
	f, err := os.Open(filepath.Join(dir, inUseFile))
	if err == nil {
		defer f.Close()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil // in use
			}
			return fmt.Errorf("lock %s: %w", f.Name(), err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	gone := filepath.Join(cacheDir, ".tmp-pruned-"+hex.EncodeToString(rnd[:]))
	if err := os.Rename(dir, gone); err != nil {
		return err
	}
	return os.RemoveAll(gone)
}

// ErrPruned is returned (wrapped) by Use for an entry that pruning removed
// between Build and Use: build it again.
var ErrPruned = errors.New("it was removed as an old entry before it could be taken; build it again")

// Use marks b in use until release is called: it holds a shared flock on
// the entry's .inuse (root's, 0600), which pruning (an exclusive,
// non-blocking flock) respects. The launcher holds it for the life of the
// step whose guest reads the entry. It waits, polling, while a pruner
// holds the file, until ctx ends. An entry pruned before Use took it is
// an error wrapping ErrPruned (build it again).
func Use(ctx context.Context, b *Built) (release func(), err error) {
	p := filepath.Join(b.Dir, inUseFile)
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("use the driver set %s: %w", b.Dir, err)
	}
	// Entries of an older build made it 0644.
	if err := f.Chmod(inUseMode); err != nil {
		f.Close()
		return nil, fmt.Errorf("use the driver set %s: %w", b.Dir, err)
	}
	if err := flock.Wait(ctx, f, unix.LOCK_SH); err != nil {
		f.Close()
		if errors.Is(err, ctx.Err()) {
			return nil, fmt.Errorf("use the driver set %s: waiting for its lock: %w", b.Dir, err)
		}
		return nil, fmt.Errorf("use the driver set %s: lock: %w", b.Dir, err)
	}
	held, err1 := f.Stat()
	now, err2 := os.Stat(p)
	if err1 != nil || err2 != nil || !os.SameFile(held, now) {
		f.Close()
		return nil, fmt.Errorf("use the driver set %s: %w", b.Dir, ErrPruned)
	}
	var once sync.Once
	return func() { once.Do(func() { f.Close() }) }, nil
}

// lockFile takes the cache's build lock (package flock).
func lockFile(ctx context.Context, p string) (func(), error) {
	return flock.Exclusive(ctx, p, "another builder")
}
