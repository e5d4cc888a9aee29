// Command mmapwrite is installed in a test image: it writes its second
// argument into the file named by the first through a shared writable
// mapping (what SQLite's WAL index, LMDB and numpy.memmap do), then
// msyncs and prints "ok", or the error of the step that failed.
package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

func main() {
	path, data := os.Args[1], os.Args[2]
	if err := run(path, []byte(data)); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

func run(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(int64(len(data))); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, len(data), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap MAP_SHARED PROT_WRITE: %w", err)
	}
	copy(m, data)
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		return fmt.Errorf("msync: %w", err)
	}
	return unix.Munmap(m)
}
