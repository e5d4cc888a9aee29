// Command testinit is a minimal /init for launcher/assets' boot test: it
// loads the initramfs' modules with guestmod, prints a marker, the
// filesystems and modules the kernel now has on /dev/console, and powers the
// VM off. The kernel command line may set microvm_exit=poweroff|restart|halt|exit
// (the kernel passes unknown name=value pieces to init as environment).
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
)

func main() {
	out := os.Stdout // the kernel opened /dev/console as fds 0-2
	if err := unix.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		fmt.Fprintf(out, "MICROVM-INIT-ERROR mount /proc: %v\n", err)
	}
	var u unix.Utsname
	unix.Uname(&u)
	rel := unix.ByteSliceToString(u.Release[:])

	res, err := guestmod.Load(context.Background(), guestmod.Config{})
	for _, m := range res.Loaded {
		fmt.Fprintf(out, "MICROVM-MODULE loaded %s\n", m)
	}
	for _, e := range res.OptionalFailed {
		fmt.Fprintf(out, "MICROVM-MODULE optional-failed %s: %v\n", e.Module, e.Err)
	}
	if err != nil {
		fmt.Fprintf(out, "MICROVM-INIT-ERROR %v\n", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if f, err := os.Open("/proc/filesystems"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fmt.Fprintf(out, "MICROVM-FS %s\n", strings.TrimSpace(strings.TrimPrefix(sc.Text(), "nodev")))
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/uptime"); err == nil {
		fmt.Fprintf(out, "MICROVM-UPTIME %s\n", strings.Fields(string(b))[0])
	}
	fmt.Fprintf(out, "MICROVM-INIT-OK %s\n", rel)
	// Wait until the UART has sent everything: the tty layer buffers and
	// the power-off would cut the tail (tcdrain is ioctl TCSBRK with 1).
	unix.IoctlSetInt(int(out.Fd()), unix.TCSBRK, 1)

	switch os.Getenv("microvm_exit") {
	case "restart":
		unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	case "halt":
		unix.Reboot(unix.LINUX_REBOOT_CMD_HALT)
	case "exit":
		os.Exit(0) // kernel panics "Attempted to kill init"; panic=-1 reboots
	default:
		unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	}
	select {}
}
