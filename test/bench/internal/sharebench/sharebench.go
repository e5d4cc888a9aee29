// Package sharebench holds the workloads of the host-share benchmark
// (test/bench's BenchmarkShares): the same code runs on the host and,
// compiled into a tiny guest init (test/bench/testdata/shareinit), inside
// the microVM, so that the two sides measure exactly the same thing.
package sharebench

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Layout of the benchmark tree under its root directory.
const (
	BigFile   = "big"  // one file of the size Create is given
	TreeDir   = "tree" // TreeDirs directories of TreeFiles files each
	TreeDirs  = 20
	TreeFiles = 100
	SmallSize = 4096 // bytes per small file
	// WideDir holds WideFiles empty files with long names in one
	// directory: its listing takes many 9p/FUSE readdir replies.
	WideDir   = "wide"
	WideFiles = 3000
	BufSize   = 1 << 20
)

// Result is one timed pass.
type Result struct {
	Files int
	Bytes int64
	Took  time.Duration
	// Sum is the hex SHA-256 of what ReadBig read (empty otherwise).
	Sum string
}

// MBps is the throughput in MB/s (10^6 bytes per second).
func (r Result) MBps() float64 { return float64(r.Bytes) / 1e6 / r.Took.Seconds() }

// FilesPerSec is the number of files handled per second.
func (r Result) FilesPerSec() float64 { return float64(r.Files) / r.Took.Seconds() }

// WideName is the name of the i-th file of WideDir (long, so that one
// readdir reply holds few of them).
func WideName(i int) string {
	return fmt.Sprintf("entry-%05d-with-a-long-name-so-that-a-readdir-reply-holds-few-of-them", i)
}

// pattern fills buf with non-zero, position-dependent bytes (a filesystem
// could skip zero pages; a shifted read must not compare equal).
func pattern(buf []byte, block int) {
	for i := range buf {
		buf[i] = byte(i*7 + i>>8 + block*13)
	}
}

// Create writes the benchmark tree below root: BigFile of bigMiB MiB,
// TreeDirs*TreeFiles small files and WideDir.
func Create(root string, bigMiB int) error {
	f, err := os.Create(filepath.Join(root, BigFile))
	if err != nil {
		return err
	}
	buf := make([]byte, BufSize)
	for i := 0; i < bigMiB; i++ {
		pattern(buf, i)
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	small := buf[:SmallSize]
	for d := 0; d < TreeDirs; d++ {
		dir := filepath.Join(root, TreeDir, "d"+strconv.Itoa(d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for i := 0; i < TreeFiles; i++ {
			small[0] = byte(i)
			if err := os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), small, 0o644); err != nil {
				return err
			}
		}
	}
	wide := filepath.Join(root, WideDir)
	if err := os.Mkdir(wide, 0o755); err != nil {
		return err
	}
	for i := 0; i < WideFiles; i++ {
		if err := os.WriteFile(filepath.Join(wide, WideName(i)), nil, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ReadBig reads root/BigFile sequentially in BufSize requests and returns
// its SHA-256 in Sum; the hashing is outside the timed part.
func ReadBig(root string) (Result, error) {
	f, err := os.Open(filepath.Join(root, BigFile))
	if err != nil {
		return Result{}, err
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, BufSize)
	var n int64
	var took time.Duration
	for {
		t0 := time.Now()
		k, err := io.ReadFull(f, buf)
		took += time.Since(t0)
		n += int64(k)
		h.Write(buf[:k])
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return Result{}, err
		}
	}
	return Result{Files: 1, Bytes: n, Took: took, Sum: hex.EncodeToString(h.Sum(nil))}, nil
}

// WalkTree lists every directory of root/TreeDir and opens, reads and
// closes every file in it.
func WalkTree(root string) (Result, error) {
	return walk(root, true)
}

// StatTree lists every directory of root/TreeDir and stats every entry
// (what ls -lR, find and Python's import path scans do).
func StatTree(root string) (Result, error) {
	return walk(root, false)
}

func walk(root string, read bool) (Result, error) {
	start := time.Now()
	var r Result
	buf := make([]byte, 64<<10)
	var walk func(string) error
	walk = func(dir string) error {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			if e.IsDir() {
				if err := walk(p); err != nil {
					return err
				}
				continue
			}
			if !read {
				if _, err := os.Lstat(p); err != nil {
					return err
				}
				r.Files++
				continue
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			for {
				k, err := f.Read(buf)
				r.Bytes += int64(k)
				if err == io.EOF {
					break
				}
				if err != nil {
					f.Close()
					return err
				}
			}
			f.Close()
			r.Files++
		}
		return nil
	}
	if err := walk(filepath.Join(root, TreeDir)); err != nil {
		return r, err
	}
	r.Took = time.Since(start)
	if r.Files != TreeDirs*TreeFiles {
		return r, fmt.Errorf("walk %s: %d files, want %d", root, r.Files, TreeDirs*TreeFiles)
	}
	if read && r.Bytes != int64(TreeDirs*TreeFiles*SmallSize) {
		return r, fmt.Errorf("walk %s: read %d bytes, want %d", root, r.Bytes, TreeDirs*TreeFiles*SmallSize)
	}
	return r, nil
}

// CheckWide lists root/WideDir and returns an error unless it holds exactly
// the WideFiles names Create made.
func CheckWide(root string) error {
	ents, err := os.ReadDir(filepath.Join(root, WideDir))
	if err != nil {
		return err
	}
	seen := make(map[string]bool, len(ents))
	for _, e := range ents {
		seen[e.Name()] = true
	}
	for i := 0; i < WideFiles; i++ {
		if !seen[WideName(i)] {
			return fmt.Errorf("%s: %d entries listed, %s missing", WideDir, len(ents), WideName(i))
		}
	}
	if len(ents) != WideFiles || len(seen) != WideFiles {
		return fmt.Errorf("%s: %d entries listed (%d distinct), want %d", WideDir, len(ents), len(seen), WideFiles)
	}
	return nil
}

// WriteBig writes root/BigFile of mib MiB in BufSize requests and fsyncs
// it; the file then reads back with the Sum of a Create of the same size.
func WriteBig(root string, mib int) (Result, error) {
	start := time.Now()
	f, err := os.Create(filepath.Join(root, BigFile))
	if err != nil {
		return Result{}, err
	}
	buf := make([]byte, BufSize)
	for i := 0; i < mib; i++ {
		pattern(buf, i)
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return Result{}, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return Result{}, err
	}
	if err := f.Close(); err != nil {
		return Result{}, err
	}
	return Result{Files: 1, Bytes: int64(mib) * BufSize, Took: time.Since(start)}, nil
}

// WriteTree creates the TreeDir part of Create below root (n directories of
// TreeFiles files) and returns the files/s of create+write+close.
func WriteTree(root string, n int) (Result, error) {
	start := time.Now()
	var r Result
	small := make([]byte, SmallSize)
	pattern(small, 0)
	for d := 0; d < n; d++ {
		dir := filepath.Join(root, TreeDir, "d"+strconv.Itoa(d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return r, err
		}
		for i := 0; i < TreeFiles; i++ {
			small[0] = byte(i)
			if err := os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), small, 0o644); err != nil {
				return r, err
			}
			r.Files++
			r.Bytes += SmallSize
		}
	}
	r.Took = time.Since(start)
	return r, nil
}
