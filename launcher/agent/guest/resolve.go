package guest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultPath is the search path used when the image's config sets none
// (the value Docker and OCI runtimes use).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// errNotFound reports that argv[0] names no executable in the image.
var errNotFound = errors.New("command not found")

// maxSymlinks bounds symlink resolution, as the kernel's MAXSYMLINKS does.
const maxSymlinks = 40

// secureJoin resolves p (absolute, as seen inside root) to a host path below
// root, following symlinks with absolute targets relative to root and never
// letting ".." climb out of it.
func secureJoin(root, p string) (string, error) {
	var resolved string // path below root, "" or starting with '/'
	rest := strings.Split(path.Clean("/"+p), "/")
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			resolved = path.Dir("/" + resolved)
			if resolved == "/" {
				resolved = ""
			}
			continue
		}
		next := resolved + "/" + c
		fi, err := os.Lstat(root + next)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		links++
		if links > maxSymlinks {
			return "", fmt.Errorf("resolve %s: too many levels of symbolic links", p)
		}
		target, err := os.Readlink(root + next)
		if err != nil {
			return "", fmt.Errorf("resolve %s: %w", p, err)
		}
		if strings.HasPrefix(target, "/") {
			resolved = ""
		}
		rest = append(strings.Split(target, "/"), rest...)
	}
	return root + resolved, nil
}

// lookPath resolves argv0 the way a shell would, but inside root with the
// image's search path. It returns the path as seen inside root.
func lookPath(root, argv0, searchPath string) (string, error) {
	r := openRoot(root)
	defer r.close()
	return lookPathIn(r, argv0, searchPath)
}

func lookPathIn(r *resolveRoot, argv0, searchPath string) (string, error) {
	if strings.Contains(argv0, "/") {
		p := argv0
		if !strings.HasPrefix(p, "/") {
			return p, nil // relative to the working directory: execve decides
		}
		if r.isExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("%s: %w", argv0, errNotFound)
	}
	if searchPath == "" {
		searchPath = DefaultPath
	}
	for _, dir := range strings.Split(searchPath, ":") {
		if dir == "" || !strings.HasPrefix(dir, "/") {
			continue
		}
		p := path.Join(dir, argv0)
		if r.isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w (PATH=%s)", argv0, errNotFound, searchPath)
}

// resolveRoot looks up paths inside a root directory: with openat2's
// RESOLVE_IN_ROOT on a descriptor of it where the kernel has it (5.6+),
// one call per path that resolves ".." and every symlink, absolute ones
// included, inside the root as the kernel does for the chrooted process;
// else by secureJoin, component by component.
type resolveRoot struct {
	root string
	fd   int // -1: secureJoin
}

func openRoot(root string) *resolveRoot {
	r := &resolveRoot{root: root, fd: -1}
	dir := root
	if dir == "" {
		dir = "/"
	}
	if fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		r.fd = fd
	}
	return r
}

func (r *resolveRoot) close() {
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}

// isExecutable reports whether p (absolute, inside the root) is a regular
// file with an execute bit.
func (r *resolveRoot) isExecutable(p string) bool {
	if r.fd < 0 {
		return isExecutable(r.root, p)
	}
	fd, err := unix.Openat2(r.fd, p, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err == unix.ENOSYS { // a kernel before 5.6
		r.close()
		r.fd = -1
		return isExecutable(r.root, p)
	}
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0
}

func isExecutable(root, p string) bool {
	hp, err := secureJoin(root, p)
	if err != nil {
		return false
	}
	fi, err := os.Stat(hp)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// envValue returns the value of key in a KEY=VALUE list (last one wins).
func envValue(env []string, key string) (string, bool) {
	v, ok := "", false
	for _, kv := range env {
		if k, val, found := strings.Cut(kv, "="); found && k == key {
			v, ok = val, true
		}
	}
	return v, ok
}
