// Command nodeinit is PID 1 of the cgroup v2 test node (test/cgroupv2): a
// QEMU guest whose root filesystem is the host's own, read-only over 9p
// with a tmpfs overlay for writes, and whose kernel mounts only the unified
// cgroup hierarchy (cgroup_no_v1=all). It loads the initramfs's modules
// (launcher/assets/guestmod), builds that root, runs the command named on
// the kernel command line (smv.run=PATH, arguments smv.arg=...) in it with
// stdio on the console, writes the command's exit status to
// smv.status=PATH (a file on the rw "work" share), and powers the node off.
//
// It is a test fixture: the node is the test's own machine, with loopback
// only, and it never writes the host's files (QEMU's 9p readonly=on).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
)

// Tags of the 9p shares the test attaches (test/cgroupv2 node.go).
const (
	nodePath = "/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	hostname = "cgv2node"
	rootTag  = "hostroot"
	workTag  = "work"
)

func main() {
	err := run()
	if err != nil {
		fmt.Fprintf(os.Stderr, "nodeinit: %v\n", err)
	}
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// Not reached: PID 1 exiting panics the kernel (panic=-1 reboots,
	// -no-reboot ends QEMU), which also ends the node.
	os.Exit(1)
}

type mnt struct {
	src, dst, fstype string
	flags            uintptr
	data             string
}

func mountAll(ms []mnt) error {
	for _, m := range ms {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", m.dst, err)
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s (%s) on %s: %w", m.src, m.fstype, m.dst, err)
		}
	}
	return nil
}

func run() error {
	if err := mountAll([]mnt{
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	}); err != nil {
		return err
	}
	if err := guestmod.LoadAll(context.Background(), "/"); err != nil {
		return err
	}
	args, err := cmdline()
	if err != nil {
		return err
	}
	const p9 = "trans=virtio,version=9p2000.L,msize=524288,"
	if err := mountAll([]mnt{
		{rootTag, "/lower", "9p", unix.MS_RDONLY, p9 + "cache=loose,access=any"},
		{"tmpfs", "/upper", "tmpfs", 0, "mode=0755"},
	}); err != nil {
		return err
	}
	for _, d := range []string{"/upper/u", "/upper/w"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// The host's own tree, writable in the node only. Every mount point
	// below comes after the overlay, so it covers the host's /proc, /sys,
	// /dev, /run and /tmp as seen through 9p.
	if err := mountAll([]mnt{
		{"overlay", "/newroot", "overlay", 0, "lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w"},
		{"proc", "/newroot/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "/newroot/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		// Only the unified hierarchy: the kernel runs with cgroup_no_v1=all.
		{"cgroup2", "/newroot/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "nsdelegate"},
		{"devtmpfs", "/newroot/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		{"devpts", "/newroot/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "gid=5,mode=620,ptmxmode=666"},
		{"tmpfs", "/newroot/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/newroot/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
		{"tmpfs", "/newroot/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	}); err != nil {
		return err
	}
	if args.work != "" {
		if err := mountAll([]mnt{{workTag, filepath.Join("/newroot", args.work), "9p", 0, p9 + "cache=none,access=any"}}); err != nil {
			return err
		}
	}
	if err := unix.Chroot("/newroot"); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	// What udev and systemd would make: /dev/fd and the stdio links
	// (bash's process substitution), and the node's name resolving (Slurm
	// looks its own host up).
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, "/dev/"+name); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	hosts, err := os.OpenFile("/etc/hosts", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(hosts, "127.0.1.1\t%s\n", hostname)
	if cerr := hosts.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("add %s to /etc/hosts: %w", hostname, err)
	}
	os.Setenv("PATH", nodePath)
	// Loopback, and one address on a dummy link: getaddrinfo(3) with
	// AI_ADDRCONFIG (Slurm's listening sockets) finds nothing on a
	// machine with loopback only. The node has no network device: no
	// packet leaves it.
	for _, c := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"modprobe", "dummy"},
		{"ip", "link", "add", "smv0", "type", "dummy"},
		{"ip", "addr", "add", "10.251.0.1/24", "dev", "smv0"},
		{"ip", "link", "set", "smv0", "up"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	cmd := exec.Command(args.run, args.args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	cmd.Env = append([]string{"PATH=" + nodePath, "HOME=/root", "TERM=dumb"}, args.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	t0 := time.Now()
	runErr := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(runErr, &ee):
		code = ee.ExitCode()
	case runErr != nil:
		code = 127
		fmt.Fprintf(os.Stderr, "nodeinit: run %s: %v\n", args.run, runErr)
	}
	fmt.Fprintf(os.Stderr, "nodeinit: %s exited %d after %s\n", args.run, code, time.Since(t0).Round(time.Millisecond))
	if args.status != "" {
		if err := os.WriteFile(args.status, []byte(strconv.Itoa(code)+"\n"), 0o644); err != nil {
			return fmt.Errorf("write status: %w", err)
		}
	}
	return nil
}

type nodeArgs struct {
	run, work, status string
	args, env         []string
}

// cmdline reads the smv.* parameters of /proc/cmdline. Values cannot hold
// spaces (the test passes paths and KEY=VALUE words it chose).
func cmdline() (nodeArgs, error) {
	var a nodeArgs
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return a, err
	}
	for _, f := range strings.Fields(string(b)) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "smv.run":
			a.run = v
		case "smv.arg":
			a.args = append(a.args, v)
		case "smv.env":
			a.env = append(a.env, v)
		case "smv.work":
			a.work = v
		case "smv.status":
			a.status = v
		}
	}
	if a.run == "" {
		return a, errors.New("no smv.run=PATH on the kernel command line")
	}
	return a, nil
}
