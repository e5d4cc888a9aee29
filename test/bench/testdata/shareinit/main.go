// Command shareinit is the guest /init of test/bench's BenchmarkShares: it
// loads the initramfs' modules, mounts the two host shares (tag ro0
// read-only at /mnt/ro, tag rw0 writable at /mnt/rw) with the filesystem
// and options named on the kernel command line (smv_fs=9p|virtiofs,
// smv_opts=mount options, smv_write_mib=N), runs the sharebench workloads
// (read-only data twice: cold, then warm guest cache; writes on rw0), tries
// to write to the read-only share and to a submount of its source (also
// after a remount rw), prints "SMV-BENCH key value" lines on the console
// and powers the VM off.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
	"github.com/slurm-microvm/slurm-microvm/test/bench/internal/sharebench"
)

const (
	ro = "/mnt/ro"
	rw = "/mnt/rw"
)

func main() {
	out := os.Stdout
	say := func(k string, v any) { fmt.Fprintf(out, "SMV-BENCH %s %v\n", k, v) }
	defer func() {
		unix.IoctlSetInt(int(out.Fd()), unix.TCSBRK, 1)
		unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	}()
	_ = unix.Mount("proc", "/proc", "proc", 0, "")
	if _, err := guestmod.Load(context.Background(), guestmod.Config{}); err != nil {
		say("error", "modules: "+strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	fstype, opts := os.Getenv("smv_fs"), os.Getenv("smv_opts")
	writeMiB, _ := strconv.Atoi(os.Getenv("smv_write_mib"))
	roFlags := uintptr(unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	for _, m := range []struct {
		tag, dir string
		flags    uintptr
	}{{"ro0", ro, roFlags}, {"rw0", rw, unix.MS_NOSUID | unix.MS_NODEV}} {
		_ = os.MkdirAll(m.dir, 0o755)
		if err := unix.Mount(m.tag, m.dir, fstype, m.flags, opts); err != nil {
			say("error", fmt.Sprintf("mount %s %s (%s): %v", fstype, m.tag, opts, err))
			return
		}
	}
	say("mount_options", mountOptions(ro))
	result := func(k string, r sharebench.Result, err error) bool {
		if err != nil {
			say("error", fmt.Sprintf("%s: %v", k, strings.ReplaceAll(err.Error(), " ", "_")))
			return false
		}
		sum := r.Sum
		if sum == "" {
			sum = "-"
		}
		say(k, fmt.Sprintf("%d %d %d %s", r.Files, r.Bytes, r.Took.Nanoseconds(), sum))
		return true
	}
	// Read-only data: metadata first (a cold cache), then contents twice.
	for _, w := range []struct {
		k string
		f func(string) (sharebench.Result, error)
	}{
		{"stat1", sharebench.StatTree}, {"tree1", sharebench.WalkTree}, {"tree2", sharebench.WalkTree},
		{"stat2", sharebench.StatTree}, {"big1", sharebench.ReadBig}, {"big2", sharebench.ReadBig},
	} {
		r, err := w.f(ro)
		if !result(w.k, r, err) {
			return
		}
	}
	if err := sharebench.CheckWide(ro); err != nil {
		say("wide", strings.ReplaceAll(err.Error(), " ", "_"))
	} else {
		say("wide", "ok")
	}
	// Writable share: writes, then the guest reads its own writes back.
	if writeMiB > 0 {
		r, err := sharebench.WriteBig(rw, writeMiB)
		if !result("wbig", r, err) {
			return
		}
		r, err = sharebench.WriteTree(rw, sharebench.TreeDirs/4)
		if !result("wtree", r, err) {
			return
		}
		r, err = sharebench.ReadBig(rw)
		if !result("rwbig", r, err) {
			return
		}
	}
	say("write", writeErr(""))
	say("write_sub", writeErr("sub/"))
	// A guest root that remounts the share read-write must still not write.
	err := unix.Mount("", ro, "", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, opts)
	say("remount_rw", errString(err))
	say("write_after_remount", writeErr(""))
	say("write_sub_after_remount", writeErr("sub/"))
	say("chmod", errString(unix.Chmod(ro+"/"+sharebench.BigFile, 0o777)))
	say("done", 1)
}

// mountOptions returns the options /proc/mounts shows for dir (what the
// kernel negotiated: 9p's msize is capped by the transport).
func mountOptions(dir string) string {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return "?"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fl := strings.Fields(sc.Text()); len(fl) >= 4 && fl[1] == dir {
			return fl[3]
		}
	}
	return "?"
}

// writeErr tries to create a file in dir of the read-only share ("" or
// "sub/", a submount of the source on the host).
func writeErr(dir string) string {
	f, err := os.OpenFile(ro+"/"+dir+"smv-write-test", os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		f.Close()
	}
	return errString(err)
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	if e, ok := err.(*os.PathError); ok {
		err = e.Err
	}
	if e, ok := err.(unix.Errno); ok {
		return unix.ErrnoName(e)
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}
