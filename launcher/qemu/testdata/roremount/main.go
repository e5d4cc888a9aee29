// Command roremount is setuid root in a test image (TestReadOnlyShareGuestRootRemount):
// it becomes guest root, remounts the read-only share rw and tries to
// change it every way it can.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	dir := os.Args[1]
	if err := syscall.Setresuid(0, 0, 0); err != nil {
		fmt.Println("setuid:", err)
		os.Exit(1)
	}
	try := func(what string, err error) { fmt.Printf("%s: %v\n", what, err) }
	b, _ := os.ReadFile(filepath.Join(dir, "marker"))
	fmt.Printf("read before: %q\n", b)
	try("remount rw", unix.Mount("", dir, "", unix.MS_REMOUNT, "trans=virtio,version=9p2000.L,msize=512000,cache=loose"))
	try("write existing", os.WriteFile(filepath.Join(dir, "marker"), []byte("guest\n"), 0o644))
	f, err := os.OpenFile(filepath.Join(dir, "marker"), os.O_RDWR, 0)
	try("open rdwr", err)
	if err == nil {
		_, err = f.WriteAt([]byte("GUEST"), 0)
		try("pwrite", err)
		m, err := unix.Mmap(int(f.Fd()), 0, 5, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		try("mmap shared rw", err)
		if err == nil {
			copy(m, "MMAPD")
			try("msync", unix.Msync(m, unix.MS_SYNC))
		}
		try("fsync", f.Sync())
		f.Close()
	}
	try("create", os.WriteFile(filepath.Join(dir, "new"), []byte("x"), 0o644))
	try("chmod", os.Chmod(filepath.Join(dir, "marker"), 0o777))
	try("truncate", os.Truncate(filepath.Join(dir, "marker"), 0))
	try("rename", os.Rename(filepath.Join(dir, "marker"), filepath.Join(dir, "moved")))
	try("mkdir", os.Mkdir(filepath.Join(dir, "d"), 0o755))
	unix.Sync()
	b, _ = os.ReadFile(filepath.Join(dir, "marker"))
	fmt.Printf("guest reads after: %q\n", b)
}
