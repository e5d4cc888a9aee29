package mpi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// maxLinks bounds symlink hops while resolving one path, as the kernel's
// MAXSYMLINKS (40) does.
const maxLinks = 40

// defaultLibDirs are searched after the ld.so.cache and the ld.so.conf
// directories, in this order: Debian/Ubuntu multiarch, then the
// RHEL/SUSE lib64 and the plain lib directories, as glibc's ld.so does for
// x86-64 (its built-in system directories) plus /usr/local/lib, which most
// distributions list in ld.so.conf anyway.
var defaultLibDirs = []string{
	"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
	"/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib",
}

// Root is a tree seen as a root filesystem of its own: a host directory
// (the host's "/", an unpacked image) or an image's erofs disk read in
// this process (OpenDisk). Every path a Root takes or returns is absolute
// *inside* the root; symlinks are followed inside it, so an absolute link
// target /x means ROOT/x and ".." stops at ROOT. Nothing under a Root is
// ever read through a path that leaves it.
type Root struct {
	// Dir is the host path of the root directory, or of the disk file for
	// a root read from a disk.
	Dir  string
	tree tree         // where the files are read from
	done func() error // run by Close after the tree is closed (removes an extraction)

	dirs    []string            // library search directories (ld.so.conf, defaults)
	cache   map[string][]string // soname -> paths, from ld.so.cache, cache order
	objects map[string]*object  // real in-root path -> parsed ELF facts
	machine uint16              // the ELF machine of this process (EM_X86_64, ...)
}

// OpenRoot opens dir as a root and reads its loader configuration:
// /etc/ld.so.cache (when present and readable) and /etc/ld.so.conf with its
// include files, all inside dir. Close releases it.
func OpenRoot(dir string) (*Root, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("root %s: %w", dir, err)
	}
	fd, err := unix.Open(abs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", abs, err)
	}
	return rootOf(abs, &dirTree{dir: abs, fd: fd}), nil
}

// rootOf makes a Root of tree t (named dir) and reads its loader
// configuration.
func rootOf(dir string, t tree) *Root {
	r := &Root{Dir: dir, tree: t, objects: map[string]*object{}, machine: hostMachine()}
	if b, err := r.ReadFile("/etc/ld.so.cache", 64<<20); err == nil {
		entries, perr := parseLDCache(b, cacheFlagsFor(runtime.GOARCH))
		if perr == nil {
			r.cache = map[string][]string{}
			for _, e := range entries {
				r.cache[e.Name] = append(r.cache[e.Name], e.Path)
			}
		}
	}
	seen := map[string]bool{}
	for _, d := range r.ldSoConf("/etc/ld.so.conf", 0) {
		if !seen[d] {
			seen[d] = true
			r.dirs = append(r.dirs, d)
		}
	}
	for _, d := range defaultLibDirs {
		if !seen[d] {
			seen[d] = true
			r.dirs = append(r.dirs, d)
		}
	}
	return r
}

// Close releases what the root holds (a directory descriptor, the disk
// file) and removes what opening it made (OpenDisk's extraction). A
// second Close does nothing.
func (r *Root) Close() error {
	if r.tree == nil {
		return nil
	}
	err := r.tree.close()
	r.tree = nil
	if r.done != nil {
		if derr := r.done(); err == nil {
			err = derr
		}
		r.done = nil
	}
	return err
}

// HostPath is the host path of in-root path p (no symlink resolution);
// for a root read from a disk, the disk's path followed by p, which names
// no host file.
func (r *Root) HostPath(p string) string {
	return filepath.Join(r.Dir, filepath.FromSlash(path.Clean("/"+p)))
}

// Resolve follows every symlink in p inside the root and returns the
// resulting in-root path, which names no symlink at any component. It fails
// with fs.ErrNotExist when a component is missing, and with unix.ELOOP after
// maxLinks hops.
func (r *Root) Resolve(p string) (string, error) {
	_, real, err := r.resolveChain(p)
	return real, err
}

// resolveChain is Resolve that also returns the in-root names of every
// symlink it followed for the last component (the soname chain:
// libmpi.so.40 -> libmpi.so.40.30.4).
func (r *Root) resolveChain(p string) (links []string, real string, err error) {
	todo := splitPath(p)
	cur := "/"
	hops := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		fi, err := r.tree.lstat(next)
		if err != nil {
			return nil, "", fmt.Errorf("resolve %s in %s: %w", p, r.Dir, err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if len(todo) > 0 && !fi.IsDir() {
				return nil, "", fmt.Errorf("resolve %s in %s: %s: %w", p, r.Dir, next, unix.ENOTDIR)
			}
			cur = next
			continue
		}
		hops++
		if hops > maxLinks {
			return nil, "", fmt.Errorf("resolve %s in %s: %w", p, r.Dir, unix.ELOOP)
		}
		t, err := r.tree.readlink(next)
		if err != nil {
			return nil, "", fmt.Errorf("resolve %s in %s: %w", p, r.Dir, err)
		}
		if len(todo) == 0 {
			links = append(links, next)
		}
		if strings.HasPrefix(t, "/") {
			cur = "/"
		}
		todo = append(splitPath(t), todo...)
	}
	return links, cur, nil
}

func splitPath(p string) []string { return strings.Split(p, "/") }

// File is an open file of a Root: *os.File for a directory root, a view
// of the disk's blocks for a disk root. Name is its HostPath.
type File interface {
	io.ReaderAt
	io.Closer
	Stat() (fs.FileInfo, error)
	Name() string
}

// tree is what a Root reads files from. Paths are in-root, absolute and
// clean; lstat and readlink get paths whose every component but the last
// is a directory (Resolve walks one component at a time); open follows
// links confined to the root.
type tree interface {
	lstat(p string) (fs.FileInfo, error)
	readlink(p string) (string, error)
	open(p string) (File, error)
	readDir(p string) ([]fs.DirEntry, error)
	close() error
}

// dirTree is a host directory, read through an O_PATH descriptor of it.
type dirTree struct {
	dir string
	fd  int
}

func (t *dirTree) host(p string) string {
	return filepath.Join(t.dir, filepath.FromSlash(path.Clean("/"+p)))
}

func (t *dirTree) lstat(p string) (fs.FileInfo, error)     { return os.Lstat(t.host(p)) }
func (t *dirTree) readlink(p string) (string, error)       { return os.Readlink(t.host(p)) }
func (t *dirTree) readDir(p string) ([]fs.DirEntry, error) { return os.ReadDir(t.host(p)) }
func (t *dirTree) close() error                            { return unix.Close(t.fd) }

// open resolves p in the kernel with RESOLVE_IN_ROOT, so no link can lead
// outside the root even if the tree changes between Resolve and Open.
func (t *dirTree) open(p string) (File, error) {
	rel := strings.TrimLeft(path.Clean("/"+p), "/")
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(t.fd, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: t.host(p), Err: err}
	}
	return os.NewFile(uintptr(fd), t.host(p)), nil
}

// Open opens in-root path p read-only, following links inside the root.
func (r *Root) Open(p string) (File, error) {
	return r.tree.open(path.Clean("/" + p))
}

// ReadFile reads in-root file p, refusing files larger than max bytes.
func (r *Root) ReadFile(p string, max int64) ([]byte, error) {
	f, err := r.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("read %s: not a regular file", f.Name())
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("read %s: %d bytes, more than the %d allowed", f.Name(), fi.Size(), max)
	}
	b := make([]byte, fi.Size())
	n, err := f.ReadAt(b, 0)
	if err != nil && n != len(b) {
		return nil, fmt.Errorf("read %s: %w", f.Name(), err)
	}
	return b, nil
}

// ReadDir lists in-root directory p (after resolving it inside the root).
func (r *Root) ReadDir(p string) ([]fs.DirEntry, error) {
	real, err := r.Resolve(p)
	if err != nil {
		return nil, err
	}
	return r.tree.readDir(real)
}

// ldSoConf returns the directories listed by ld.so.conf file p and its
// include directives, in order. Unreadable files are skipped: a missing
// ld.so.conf means the loader uses its defaults only. Include patterns are
// glob patterns in their last component only (what every distribution
// writes: /etc/ld.so.conf.d/*.conf); relative ones are taken relative to
// the including file's directory, as ldconfig does.
func (r *Root) ldSoConf(p string, depth int) []string {
	if depth > 8 {
		return nil
	}
	b, err := r.ReadFile(p, 1<<20)
	if err != nil {
		return nil
	}
	var dirs []string
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		switch {
		case line == "":
		case strings.HasPrefix(line, "include") && len(line) > 7 && (line[7] == ' ' || line[7] == '\t'):
			for _, pat := range strings.Fields(line[8:]) {
				if !strings.HasPrefix(pat, "/") {
					pat = path.Join(path.Dir(p), pat)
				}
				for _, inc := range r.glob(pat) {
					dirs = append(dirs, r.ldSoConf(inc, depth+1)...)
				}
			}
		case strings.HasPrefix(line, "hwcap"):
			// obsolete "hwcap N name" lines carry no directory
		default:
			// a directory, possibly followed by "=TYPE" (libc4/libc5 era)
			d := strings.Fields(line)[0]
			if i := strings.IndexByte(d, '='); i >= 0 {
				d = d[:i]
			}
			if strings.HasPrefix(d, "/") {
				dirs = append(dirs, path.Clean(d))
			}
		}
	}
	return dirs
}

// glob expands a pattern whose wildcards are in the last component only,
// inside the root, sorted as ldconfig sorts them.
func (r *Root) glob(pat string) []string {
	dir, base := path.Split(pat)
	ents, err := r.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if ok, _ := path.Match(base, e.Name()); ok {
			out = append(out, path.Join(dir, e.Name()))
		}
	}
	slices.Sort(out)
	return out
}

// SearchDirs returns the library directories of the root in search order
// (ld.so.conf order, then the defaults), in-root paths.
func (r *Root) SearchDirs() []string { return slices.Clone(r.dirs) }

// errNotFound is returned by Lookup when no directory holds the soname.
var errNotFound = errors.New("not found")

// Lookup finds shared object soname the way the dynamic loader would for an
// object with the given DT_RUNPATH/DT_RPATH directories (extra, in-root,
// already expanded): extra first, then the ld.so.cache, then every search
// directory. Candidates that are not ELF objects for this machine are
// skipped, as ld.so skips them. It returns the in-root path found (the name
// as looked up, before links are followed).
func (r *Root) Lookup(soname string, extra []string) (string, error) {
	if strings.Contains(soname, "/") {
		if o, err := r.object(soname); err == nil && o.machine == r.machine {
			return path.Clean(soname), nil
		}
		return "", fmt.Errorf("%s: %w", soname, errNotFound)
	}
	try := func(p string) bool {
		o, err := r.object(p)
		return err == nil && o.machine == r.machine
	}
	for _, d := range extra {
		if p := path.Join(d, soname); try(p) {
			return p, nil
		}
	}
	for _, p := range r.cache[soname] {
		if try(p) {
			return p, nil
		}
	}
	for _, d := range r.dirs {
		if p := path.Join(d, soname); try(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w", soname, errNotFound)
}

// Names lists every file name in the search directories and every soname in
// the ld.so.cache for which match returns true, each with the path the
// loader would use for it (cache first, then directories in order).
func (r *Root) Names(match func(name string) bool) map[string]string {
	out := map[string]string{}
	for name, ps := range r.cache {
		if match(name) && len(ps) > 0 {
			if p, err := r.Lookup(name, nil); err == nil {
				out[name] = p
			}
		}
	}
	for _, d := range r.dirs {
		ents, err := r.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if _, ok := out[e.Name()]; ok || !match(e.Name()) {
				continue
			}
			if p, err := r.Lookup(e.Name(), nil); err == nil {
				out[e.Name()] = p
			}
		}
	}
	return out
}
