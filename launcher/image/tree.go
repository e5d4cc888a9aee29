package image

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// treeEntry is the metadata of one file of a root filesystem directory that
// its digest covers: path (slash-separated, "." for the top), type ('d'
// directory, 'f' regular, 'l' symlink, 'c'/'b' device, 'p' fifo), permission
// bits including setuid/setgid/sticky, owner, size (regular files only),
// modification time in ns, and symlink target.
type treeEntry struct {
	path  string
	typ   byte
	perm  uint32
	uid   int
	gid   int
	size  int64
	mtime int64
	link  string
}

// treeHasher accumulates the digest of a tree's metadata. The child (as
// the user) computes it from lstat while walking; root computes it again
// from the tar headers the child streams, and the two must agree.
type treeHasher struct{ h hash.Hash }

func newTreeHasher() *treeHasher { return &treeHasher{h: sha256.New()} }

func (t *treeHasher) add(e treeEntry) {
	fmt.Fprintf(t.h, "%q %c %o %d %d %d %d %q\n", e.path, e.typ, e.perm, e.uid, e.gid, e.size, e.mtime, e.link)
}

func (t *treeHasher) digest() string { return "sha256:" + hex.EncodeToString(t.h.Sum(nil)) }

// walkTree calls fn for root and everything below it in lexical order,
// without following symlinks. rel is slash-separated ("." for root).
func walkTree(root string, fn func(rel, full string, fi fs.FileInfo, st *syscall.Stat_t) error) error {
	return filepath.WalkDir(root, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			return pathErr(full, err)
		}
		fi, err := os.Lstat(full)
		if err != nil {
			return pathErr(full, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("lstat %s: no stat_t", full)
		}
		rel, err := filepath.Rel(root, full)
		if err != nil {
			return err
		}
		return fn(filepath.ToSlash(rel), full, fi, st)
	})
}

// treeEntryFromStat builds the entry of one walked file; ok is false for
// files the tree leaves out (sockets).
func treeEntryFromStat(rel, full string, fi fs.FileInfo, st *syscall.Stat_t) (treeEntry, bool) {
	e := treeEntry{
		path:  rel,
		perm:  uint32(st.Mode) & 0o7777,
		uid:   int(st.Uid),
		gid:   int(st.Gid),
		mtime: st.Mtim.Nano(),
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		e.typ = 'd'
	case syscall.S_IFREG:
		e.typ, e.size = 'f', st.Size
	case syscall.S_IFLNK:
		e.typ = 'l'
		e.link, _ = os.Readlink(full)
	case syscall.S_IFCHR:
		e.typ = 'c'
	case syscall.S_IFBLK:
		e.typ = 'b'
	case syscall.S_IFIFO:
		e.typ = 'p'
	default:
		return e, false
	}
	return e, true
}

// writeTreeTar streams the tree at root as a PAX tar (nanosecond mtimes,
// numeric owners, hard links as links) in walkTree order, reading every file
// with the caller's credentials. It returns the tree digest of what it wrote.
func writeTreeTar(root string, w io.Writer) (string, error) {
	tw := tar.NewWriter(w)
	th := newTreeHasher()
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	err := walkTree(root, func(rel, full string, fi fs.FileInfo, st *syscall.Stat_t) error {
		e, ok := treeEntryFromStat(rel, full, fi, st)
		if !ok {
			return nil
		}
		hdr := &tar.Header{
			Name:    rel,
			Mode:    int64(e.perm),
			Uid:     e.uid,
			Gid:     e.gid,
			ModTime: time.Unix(0, e.mtime),
			Format:  tar.FormatPAX,
		}
		var file *os.File
		switch e.typ {
		case 'd':
			hdr.Typeflag = tar.TypeDir
			if rel == "." {
				hdr.Name = "./"
			} else {
				hdr.Name = rel + "/"
			}
		case 'f':
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := seen[key]; ok && st.Nlink > 1 {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				break
			}
			if st.Nlink > 1 {
				seen[key] = rel
			}
			f, err := os.Open(full)
			if err != nil {
				return pathErr(full, err)
			}
			file = f
			hdr.Typeflag, hdr.Size = tar.TypeReg, e.size
		case 'l':
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.link
		case 'c', 'b':
			hdr.Typeflag = tar.TypeChar
			if e.typ == 'b' {
				hdr.Typeflag = tar.TypeBlock
			}
			hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		case 'p':
			hdr.Typeflag = tar.TypeFifo
		}
		th.add(e)
		if err := tw.WriteHeader(hdr); err != nil {
			if file != nil {
				file.Close()
			}
			return err
		}
		if file != nil {
			defer file.Close()
			n, err := io.CopyN(tw, file, e.size)
			if err != nil {
				if errors.Is(err, io.EOF) {
					return newErr("", ErrChanged, fmt.Sprintf("%s shrank from %d to %d bytes while being read", full, e.size, n), "run again once the directory is no longer being written", nil)
				}
				return pathErr(full, err)
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return th.digest(), nil
}

// treeHeaderHasher computes the tree digest from the tar headers of a
// stream written by writeTreeTar, on the root side.
type treeHeaderHasher struct {
	th    *treeHasher
	files map[string]treeEntry // regular files by path, to resolve hard links
}

func newTreeHeaderHasher() *treeHeaderHasher {
	return &treeHeaderHasher{th: newTreeHasher(), files: map[string]treeEntry{}}
}

func (t *treeHeaderHasher) add(hdr *tar.Header) error {
	p := cleanMember(hdr.Name)
	if p == "" {
		p = "."
	}
	e := treeEntry{
		path:  p,
		perm:  uint32(hdr.Mode) & 0o7777,
		uid:   hdr.Uid,
		gid:   hdr.Gid,
		mtime: hdr.ModTime.UnixNano(),
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		e.typ = 'd'
	case tar.TypeReg: // archive/tar reads the old TypeRegA as TypeReg
		e.typ, e.size = 'f', hdr.Size
		t.files[p] = e
	case tar.TypeLink:
		f, ok := t.files[cleanMember(hdr.Linkname)]
		if !ok {
			return newErr("", ErrCorrupt, fmt.Sprintf("hard link %q to unknown %q", hdr.Name, hdr.Linkname), "", nil)
		}
		f.path = p
		e = f
	case tar.TypeSymlink:
		e.typ, e.link = 'l', hdr.Linkname
	case tar.TypeChar:
		e.typ = 'c'
	case tar.TypeBlock:
		e.typ = 'b'
	case tar.TypeFifo:
		e.typ = 'p'
	default:
		return nil
	}
	t.th.add(e)
	return nil
}

func (t *treeHeaderHasher) digest() string { return t.th.digest() }
