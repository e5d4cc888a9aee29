package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// probeResult is what probing a local path yields: its kind, its digest
// ("sha256:<hex>", the cache key) and its size in bytes: of a file; of the
// regular files of a root filesystem directory (each inode once); for an
// OCI layout directory, the most bytes its stream (writeLayoutTar) can
// have. Entries counts a root filesystem directory's entries. Size and
// Entries bound what root accepts from the stream of the path.
// It is also the JSON the helper child prints for the "probe" operation.
type probeResult struct {
	Kind    Kind   `json:"kind"`
	Digest  string `json:"digest,omitempty"`
	Size    int64  `json:"size"`
	Entries int64  `json:"entries,omitempty"`
}

// Magic numbers, each at its offset in the first block of a file.
var (
	magicSquashfs = []byte("hsqs")     // offset 0, little-endian squashfs 4.0
	magicUstar    = []byte("ustar")    // offset 257 (POSIX and GNU tar)
	magicGzip     = []byte{0x1f, 0x8b} // offset 0
	magicZstd     = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicXz       = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	magicBzip2    = []byte("BZh")
	magicErofs    = []byte{0xe2, 0xe1, 0xf5, 0xe0} // offset 1024, EROFS_SUPER_MAGIC_V1 little-endian
)

// probePath detects what the local path p is and validates it cheaply, with
// the credentials of the calling process (the job's user: the helper child,
// or `validate` run by srun). With digest set it also computes the cache key,
// which for a squashfs file means reading the whole file. Errors are *Error
// with Ref left empty.
func probePath(p string, digest bool) (probeResult, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return probeResult{}, pathErr("", err)
	}
	switch {
	case fi.IsDir():
		return probeDir(p, digest)
	case fi.Mode().IsRegular():
		return probeFile(p, digest)
	default:
		return probeResult{}, newErr("", ErrUnsupported, "a "+fileType(fi.Mode())+", not a file or directory", hintLocal, nil)
	}
}

func probeDir(p string, digest bool) (probeResult, error) {
	d, err := os.Open(p)
	if err != nil {
		return probeResult{}, pathErr("", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return probeResult{}, pathErr("", err)
	}
	if len(names) == 0 {
		return probeResult{}, newErr("", ErrCorrupt, "empty directory", hintLocal, nil)
	}
	if _, err := os.Lstat(filepath.Join(p, "oci-layout")); err == nil {
		info, err := inspectOCI(dirLayout(p))
		if err != nil {
			return probeResult{}, err
		}
		n, err := layoutStreamBound(p)
		if err != nil {
			return probeResult{}, err
		}
		return probeResult{Kind: KindOCILayout, Digest: info.digest.String(), Size: n}, nil
	}
	if !looksLikeRoot(names) {
		return probeResult{}, newErr("", ErrUnsupported, "the directory is not a root filesystem (it has neither usr nor bin)", hintLocal, nil)
	}
	th := newTreeHasher()
	r := probeResult{Kind: KindRootfs}
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	err = walkTree(p, func(rel string, full string, fi fs.FileInfo, st *syscall.Stat_t) error {
		e, ok := treeEntryFromStat(rel, full, fi, st)
		if !ok {
			return nil
		}
		r.Entries++
		if e.typ == 'f' {
			// writeTreeTar sends the data of a hard-linked inode once.
			key := inode{uint64(st.Dev), st.Ino}
			if st.Nlink == 1 || !seen[key] {
				r.Size += e.size
			}
			if st.Nlink > 1 {
				seen[key] = true
			}
		}
		if e.typ == 'f' || e.typ == 'd' {
			mode := uint32(unix.R_OK)
			if e.typ == 'd' {
				mode |= unix.X_OK
			}
			if err := unix.Access(full, mode); err != nil {
				return pathErr(full, err)
			}
		}
		th.add(e)
		return nil
	})
	if err != nil {
		return probeResult{}, err
	}
	r.Digest = th.digest()
	return r, nil
}

func probeFile(p string, digest bool) (probeResult, error) {
	f, err := os.Open(p)
	if err != nil {
		return probeResult{}, pathErr("", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return probeResult{}, pathErr("", err)
	}
	size := fi.Size()
	head := make([]byte, 4096)
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return probeResult{}, pathErr("", err)
	}
	head = head[:n]
	if n == 0 {
		return probeResult{}, newErr("", ErrCorrupt, "empty file", hintLocal, nil)
	}
	switch {
	case bytes.HasPrefix(head, magicSquashfs):
		if err := checkSquashfsSuper(head, size); err != nil {
			return probeResult{}, newErr("", ErrCorrupt, err.Error(), "a squashfs image must be complete; rebuild it, e.g. with enroot import or mksquashfs", nil)
		}
		r := probeResult{Kind: KindSquashfs, Size: size}
		if digest {
			h := sha256.New()
			if _, err := io.Copy(h, io.NewSectionReader(f, 0, size)); err != nil {
				return probeResult{}, pathErr("", err)
			}
			r.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
		}
		return r, nil
	case len(head) >= 262 && bytes.Equal(head[257:262], magicUstar):
		a, err := indexTar(f, size)
		if err != nil {
			return probeResult{}, err
		}
		info, err := a.inspect()
		if err != nil {
			return probeResult{}, err
		}
		return probeResult{Kind: info.kind, Digest: info.digest.String(), Size: size}, nil
	case bytes.HasPrefix(head, magicGzip), bytes.HasPrefix(head, magicZstd), bytes.HasPrefix(head, magicXz), bytes.HasPrefix(head, magicBzip2):
		return probeResult{}, newErr("", ErrUnsupported, "a compressed file (gzip, zstd, xz or bzip2)", "decompress it first (e.g. gunzip or zstd -d); images are read as uncompressed docker save or OCI archives", nil)
	case len(head) >= 1028 && bytes.Equal(head[1024:1028], magicErofs):
		return probeResult{}, newErr("", ErrUnsupported, "an erofs image", hintLocal, nil)
	}
	return probeResult{}, newErr("", ErrUnsupported, "not a recognised image", hintLocal, nil)
}

// checkSquashfsSuper validates the squashfs 4.0 superblock in head (at least
// 96 bytes) against the file size: the layout is struct squashfs_super_block
// of the kernel's fs/squashfs/squashfs_fs.h.
func checkSquashfsSuper(head []byte, size int64) error {
	if len(head) < 96 {
		return errors.New("truncated squashfs superblock")
	}
	le := binary.LittleEndian
	blockSize := le.Uint32(head[12:])
	blockLog := le.Uint16(head[22:])
	major := le.Uint16(head[28:])
	bytesUsed := le.Uint64(head[40:])
	if major != 4 {
		return fmt.Errorf("squashfs version %d is not supported (want 4)", major)
	}
	if blockLog > 20 || blockSize != 1<<blockLog {
		return fmt.Errorf("bad squashfs block size %d", blockSize)
	}
	if bytesUsed > uint64(size) {
		return fmt.Errorf("truncated squashfs: the superblock says %d bytes, the file has %d", bytesUsed, size)
	}
	return nil
}

// pathErr maps an error of opening or reading a path to the package's
// classes; p names the path in the message when it is not the image itself
// (a file inside a root filesystem directory), "" otherwise.
func pathErr(p string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return newErr("", ErrNotFound, "no such file", hintLocal, nil)
	case errors.Is(err, fs.ErrPermission):
		detail := "permission denied"
		if p != "" {
			detail = p + ": permission denied"
		}
		return newErr("", ErrPermission, detail, hintRead, nil)
	}
	return newErr("", ErrCorrupt, "cannot read "+p, hintLocal, err)
}

func fileType(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	}
	return "special file"
}

// looksLikeRoot reports whether a directory's entries look like a root
// filesystem: every distribution and distroless image has usr or bin.
func looksLikeRoot(names []string) bool {
	for _, n := range names {
		if n == "usr" || n == "bin" {
			return true
		}
	}
	return false
}
