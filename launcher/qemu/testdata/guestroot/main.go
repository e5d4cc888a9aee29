// Command guestroot is installed setuid root in a test image: run by the
// job's (unprivileged) user in the guest, it becomes the guest's root and
// tries, in the share named by its argument, what would make a host root
// file: a root-owned file, a setuid-root file, a device node. It prints
// one line per attempt; the test judges the host side.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

func main() {
	dir := os.Args[1]
	if err := syscall.Setresuid(0, 0, 0); err != nil {
		fmt.Println("setuid:", err)
		os.Exit(1)
	}
	_ = syscall.Setresgid(0, 0, 0)
	fmt.Printf("euid=%d egid=%d\n", os.Geteuid(), os.Getegid())
	try := func(what string, err error) { fmt.Printf("%s: %v\n", what, err) }
	f := filepath.Join(dir, "rootfile")
	try("create", os.WriteFile(f, []byte("#!/bin/sh\nid\n"), 0o755))
	try("chown", os.Chown(f, 0, 0))
	try("chmod", os.Chmod(f, 0o4755|os.ModeSetuid|os.ModeSetgid))
	try("chmod-bits", syscall.Chmod(f, 0o6755))
	try("mknod", syscall.Mknod(filepath.Join(dir, "null"), syscall.S_IFCHR|0o666, 1<<8|3))
	try("mknod-block", syscall.Mknod(filepath.Join(dir, "sda"), syscall.S_IFBLK|0o666, 8<<8))
	d := filepath.Join(dir, "rootdir")
	try("mkdir", os.Mkdir(d, 0o755))
	try("chown-dir", os.Chown(d, 0, 0))
	try("chmod-dir", syscall.Chmod(d, 0o2777))
}
