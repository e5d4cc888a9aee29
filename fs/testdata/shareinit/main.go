// Command shareinit is the guest /init of fs's share benchmark: it loads
// the initramfs' modules, mounts the host share named on the kernel command
// line (smv_fs=9p|virtiofs, smv_tag=TAG, smv_opts=mount options), runs the
// sharebench workloads twice (cold, then warm guest cache), tries to write
// to the share and to a submount of its source (read-only enforcement,
// also after a remount rw), prints
// "SMV-BENCH key value" lines on the console and powers the VM off.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/fs/internal/sharebench"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
)

const mnt = "/mnt"

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
	fstype, tag, opts := os.Getenv("smv_fs"), os.Getenv("smv_tag"), os.Getenv("smv_opts")
	if fstype == "9p" && opts == "" {
		opts = "trans=virtio,version=9p2000.L"
	}
	_ = os.MkdirAll(mnt, 0o755)
	start := time.Now()
	if err := unix.Mount(tag, mnt, fstype, unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		say("error", fmt.Sprintf("mount %s %s (%s): %v", fstype, tag, opts, err))
		return
	}
	say("mount_ms", time.Since(start).Milliseconds())
	for pass := 1; pass <= 2; pass++ {
		r, err := sharebench.ReadBig(mnt)
		if err != nil {
			say("error", fmt.Sprintf("read big: %v", err))
			return
		}
		say(fmt.Sprintf("big%d", pass), fmt.Sprintf("%d %d", r.Bytes, r.Took.Nanoseconds()))
		r, err = sharebench.WalkTree(mnt)
		if err != nil {
			say("error", fmt.Sprintf("walk tree: %v", err))
			return
		}
		say(fmt.Sprintf("tree%d", pass), fmt.Sprintf("%d %d %d", r.Files, r.Bytes, r.Took.Nanoseconds()))
	}
	say("write", writeErr(""))
	say("write_sub", writeErr("sub/"))
	// A guest root that remounts the share read-write must still not write.
	err := unix.Mount("", mnt, "", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, opts)
	say("remount_rw", errString(err))
	say("write_after_remount", writeErr(""))
	say("write_sub_after_remount", writeErr("sub/"))
	if err := unix.Chmod(mnt+"/"+sharebench.BigFile, 0o777); err != nil {
		say("chmod", errString(err))
	} else {
		say("chmod", "ok")
	}
	say("done", 1)
}

// writeErr tries to create a file in dir of the share ("" or "sub/", a
// submount of the source on the host).
func writeErr(dir string) string {
	f, err := os.OpenFile(mnt+"/"+dir+"smv-write-test", os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		f.Close()
		return "ok"
	}
	return errString(err)
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	var errno unix.Errno
	if e, ok := err.(*os.PathError); ok {
		err = e.Err
	}
	if e, ok := err.(unix.Errno); ok {
		errno = e
		return unix.ErrnoName(errno)
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}
