// Package sharebench holds the read workloads of the host-share benchmark
// (fs's TestShareBench): the same code runs on the host and, compiled into
// a tiny guest init (fs/testdata/shareinit), inside the microVM, so that the
// two sides measure exactly the same thing.
package sharebench

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Layout of the benchmark tree under its root directory.
const (
	BigFile   = "big"  // one file of BigMiB MiB
	TreeDir   = "tree" // TreeDirs directories of TreeFiles files each
	TreeDirs  = 100
	TreeFiles = 100
	SmallSize = 4096 // bytes per small file
	BufSize   = 1 << 20
)

// Result is one timed pass.
type Result struct {
	Files int
	Bytes int64
	Took  time.Duration
}

// MBps is the throughput in MB/s (10^6 bytes per second).
func (r Result) MBps() float64 { return float64(r.Bytes) / 1e6 / r.Took.Seconds() }

// FilesPerSec is the number of files opened and read per second.
func (r Result) FilesPerSec() float64 { return float64(r.Files) / r.Took.Seconds() }

// Create writes the benchmark tree below root: BigFile of bigMiB MiB and
// TreeDirs*TreeFiles small files. Contents are not zero pages (a filesystem
// could skip them).
func Create(root string, bigMiB int) error {
	f, err := os.Create(filepath.Join(root, BigFile))
	if err != nil {
		return err
	}
	buf := make([]byte, BufSize)
	for i := range buf {
		buf[i] = byte(i*7 + i>>8)
	}
	for i := 0; i < bigMiB; i++ {
		buf[0] = byte(i)
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
	return nil
}

// ReadBig reads root/BigFile sequentially in BufSize chunks.
func ReadBig(root string) (Result, error) {
	start := time.Now()
	f, err := os.Open(filepath.Join(root, BigFile))
	if err != nil {
		return Result{}, err
	}
	defer f.Close()
	buf := make([]byte, BufSize)
	var n int64
	for {
		k, err := f.Read(buf)
		n += int64(k)
		if err == io.EOF {
			break
		}
		if err != nil {
			return Result{}, err
		}
	}
	return Result{Files: 1, Bytes: n, Took: time.Since(start)}, nil
}

// WalkTree lists every directory of root/TreeDir and reads every file in it.
func WalkTree(root string) (Result, error) {
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
	return r, nil
}
