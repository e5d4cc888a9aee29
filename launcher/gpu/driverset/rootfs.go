package driverset

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// maxHops bounds the symbolic links followed resolving one path: Linux's
// own limit (MAXSYMLINKS, 40, fs/namei.c).
const maxHops = 40

// errEscape is returned when a path leads out of the root.
var errEscape = errors.New("leads out of the driver root")

// rootFS reads a driver tree as if it were "/": symbolic links are
// followed inside dir (absolute targets re-rooted under it, relative ones
// from the link's directory), never out of it.
type rootFS struct {
	dir string // absolute, clean
}

func newRootFS(dir string) (rootFS, error) {
	if dir == "" {
		dir = "/"
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return rootFS{}, fmt.Errorf("driver root %q: %w", dir, err)
	}
	fi, err := os.Stat(abs)
	if errors.Is(err, os.ErrNotExist) {
		return rootFS{}, fmt.Errorf("the driver root %s does not exist: install the NVIDIA driver there, or set gpu.driver.root in microvm.toml to where it is installed", abs)
	}
	if err != nil {
		return rootFS{}, fmt.Errorf("driver root: %w", err)
	}
	if !fi.IsDir() {
		return rootFS{}, fmt.Errorf("driver root %s is not a directory", abs)
	}
	return rootFS{dir: abs}, nil
}

// host is where rel (relative to the root, slash-separated) is on the host.
func (r rootFS) host(rel string) string { return filepath.Join(r.dir, filepath.FromSlash(rel)) }

// rel turns a host path under the root back into one relative to it; ok
// is false when p is not lexically under the root.
func (r rootFS) rel(p string) (string, bool) {
	p = filepath.Clean(p)
	if r.dir == "/" {
		return strings.TrimPrefix(p, "/"), strings.HasPrefix(p, "/")
	}
	if p == r.dir {
		return "", true
	}
	rest, ok := strings.CutPrefix(p, r.dir+"/")
	return rest, ok
}

// resolve follows the symbolic links of p (a path inside the root,
// absolute or not) and returns the path relative to the root that it names,
// free of links when it was walked. A ".." above the root (naming the link
// that led there), more than maxHops links or a missing component is an
// error.
func (r rootFS) resolve(p string) (string, error) {
	var done []string
	todo := splitPath(p)
	hops := 0
	via := "" // the last link followed, for the error
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) == 0 {
				if via != "" {
					return "", fmt.Errorf("resolve %s: symbolic link %s: %w", r.host(p), via, errEscape)
				}
				return "", fmt.Errorf("resolve %s: %w", r.host(p), errEscape)
			}
			done = done[:len(done)-1]
			continue
		}
		cur := r.host(path.Join(path.Join(done...), c))
		fi, err := os.Lstat(cur)
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			done = append(done, c)
			continue
		}
		if hops++; hops > maxHops {
			return "", fmt.Errorf("resolve %s: more than %d symbolic links: %w", r.host(p), maxHops, unix.ELOOP)
		}
		target, err := os.Readlink(cur)
		if err != nil {
			return "", err
		}
		via = cur + " -> " + target
		if strings.HasPrefix(target, "/") {
			done = nil // absolute targets are re-rooted
		}
		todo = append(splitPath(target), todo...)
	}
	return path.Join(done...), nil
}

func splitPath(p string) []string { return strings.Split(p, "/") }

// open opens rel (a path relative to the root with no symbolic links, as
// resolve returns) one component at a time with O_NOFOLLOW, so that a link
// put in place after resolve fails the open instead of being followed.
func (r rootFS) open(rel string, flags int) (*os.File, error) {
	fd, err := unix.Open(r.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: r.dir, Err: err}
	}
	comps := strings.Split(rel, "/")
	if rel == "" {
		comps = []string{"."}
	}
	for i, c := range comps {
		fl := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i == len(comps)-1 {
			fl = flags | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK
		}
		nfd, err := unix.Openat(fd, c, fl, 0)
		unix.Close(fd)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: r.host(rel), Err: err}
		}
		fd = nfd
	}
	return os.NewFile(uintptr(fd), r.host(rel)), nil
}

// openFile resolves p inside the root and opens the regular file it names
// for reading; it returns the file and its path relative to the root.
func (r rootFS) openFile(p string) (*os.File, string, error) {
	rel, err := r.resolve(p)
	if err != nil {
		return nil, "", err
	}
	f, err := r.open(rel, unix.O_RDONLY)
	if err != nil {
		return nil, "", err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, "", err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, "", fmt.Errorf("%s is not a regular file (%s)", r.host(rel), fi.Mode().Type())
	}
	return f, rel, nil
}

// readFile reads the regular file p names inside the root; limit bounds
// its size in bytes.
func (r rootFS) readFile(p string, limit int64) ([]byte, string, error) {
	f, rel, err := r.openFile(p)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, "", fmt.Errorf("read %s: %w", r.host(rel), err)
	}
	if int64(len(b)) > limit {
		return nil, "", fmt.Errorf("read %s: more than %d bytes", r.host(rel), limit)
	}
	return b, rel, nil
}
