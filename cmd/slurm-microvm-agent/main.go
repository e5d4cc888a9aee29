// Command slurm-microvm-agent is PID 1 of the microVM: it mounts the guest's
// pseudo filesystems, loads the kernel modules shipped in the initramfs,
// serves the agent API (launcher/agent/api) over ttrpc on the virtio-serial
// port named "agent", and powers the guest off when asked or when the host
// end goes away. Build it static: CGO_ENABLED=0.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/guest"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/transport"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
)

// portName is the name of the virtio-serial port of the control channel
// (QEMU: -device virtserialport,name=agent).
const portName = "agent"

func main() {
	if len(os.Args) == 2 && os.Args[1] == "pause" {
		pause()
	}
	start := guest.Uptime()
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "slurm-microvm-agent: must run as PID 1 inside the microVM")
		os.Exit(2)
	}
	con, err := os.OpenFile("/dev/console", os.O_WRONLY, 0)
	if err != nil {
		con = os.Stderr
	}
	if err := mountPseudo(); err != nil {
		fmt.Fprintf(con, "slurm-microvm-agent: %v\n", err)
		powerOff()
	}
	args := cmdline()
	level := slog.LevelInfo
	if args["slurm_microvm.debug"] != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(con, &slog.HandlerOptions{Level: level})).With("agent", "slurm-microvm")
	if args["slurm_microvm.poweroff"] != "" {
		// The bare-boot baseline of `make bench`: same kernel and
		// initramfs, off as soon as PID 1 runs.
		powerOff()
	}
	if err := run(context.Background(), log, start, args["slurm_microvm.modules"] == "all"); err != nil {
		log.Error("agent failed", "err", err)
	}
	powerOff()
}

// pause is the init of a Kata sandbox container (launcher/kata): it
// reaps the processes that end up as its children (orphans of the
// processes exec'd into the container) and exits 0 on SIGTERM, SIGINT or
// SIGHUP, ending the container.
func pause() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGCHLD)
	for sig := range sigs {
		if sig != unix.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// run loads the boot modules, opens the control port and serves the agent
// API on it; start is the guest uptime at which PID 1 began.
func run(ctx context.Context, log *slog.Logger, start time.Duration, allModules bool) error {
	t0 := time.Now()
	boot := &guest.BootMarks{Start: start}
	log.Info("agent started", "uptime_ms", start.Milliseconds())
	// Only what the agent needs to serve on -M microvm; features load
	// the rest. A PCI machine (GPU passthrough) needs virtio-pci too.
	if _, err := guestmod.Load(ctx, guestmod.Config{BootOnly: !allModules}); err != nil {
		return fmt.Errorf("load kernel modules: %w", err)
	}
	boot.ModulesDone = guest.Uptime()
	log.Debug("modules loaded", "ms", time.Since(t0).Milliseconds())
	if err := loopbackUp(); err != nil {
		// Only forwards over loopback (PMIx) need it: go on without.
		log.Warn("bring up lo", "err", err)
	}
	port, err := findPort(portName, 10*time.Second)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(port, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open control port %s: %w", port, err)
	}
	l, err := transport.Listen(f)
	if err != nil {
		return err
	}
	// Each process in a cgroup of its own: its OOM kills are its own.
	cgroup := guestCgroup
	if err := guest.MountCgroup(cgroup); err != nil {
		log.Warn("no cgroup2 for the processes: OOM kills are told by /proc/vmstat", "err", err)
		cgroup = ""
	}
	svc := guest.New(guest.Options{Setup: guest.MountRoot, PowerOff: powerOff, SetClock: guest.SetRealtime, Cgroup: cgroup, Boot: boot, Logger: log})
	srv, err := svc.NewServer()
	if err != nil {
		return err
	}
	boot.Serving = guest.Uptime()
	log.Info("agent serving", "port", port, "ms_since_agent_start", time.Since(t0).Milliseconds(), "uptime_ms", boot.Serving.Milliseconds())
	if err := srv.Serve(ctx, l); err != nil && !strings.Contains(err.Error(), "closed") {
		return fmt.Errorf("serve agent API: %w", err)
	}
	return nil
}

// findPort waits for the virtio-serial port called name and returns its
// device node.
func findPort(name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		matches, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, m := range matches {
			b, err := os.ReadFile(m)
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(m))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("virtio-serial port %q did not appear within %s", name, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// guestCgroup is where the agent mounts cgroup2, outside the processes'
// root.
const guestCgroup = "/run/microvm/cgroup"

func mountPseudo() error {
	type m struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}
	for _, mt := range []m{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "ptmxmode=0666,mode=0620,gid=5"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	} {
		if err := os.MkdirAll(mt.dst, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", mt.dst, err)
		}
		if err := unix.Mount(mt.src, mt.dst, mt.fstype, mt.flags, mt.data); err != nil && err != unix.EBUSY {
			return fmt.Errorf("mount %s on %s: %w", mt.fstype, mt.dst, err)
		}
	}
	return nil
}

// loopbackUp sets the guest's lo interface up (the kernel configures
// 127.0.0.1 on it by itself): listener forwards of the agent, which carry
// PMIx, listen on it.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get flags of lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

// cmdline returns the kernel command line's key=value words.
func cmdline() map[string]string {
	b, _ := os.ReadFile("/proc/cmdline")
	out := map[string]string{}
	for _, w := range strings.Fields(string(b)) {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			v = "1"
		}
		out[k] = v
	}
	return out
}

// powerOff ends the guest. On -M microvm, LINUX_REBOOT_CMD_POWER_OFF goes
// through ACPI S5 and QEMU exits with status 0 within ~11 ms (measured),
// which tells a clean end from a panic (panic=-1 with -no-reboot also ends
// QEMU, as a reset). The console is drained first or its tail is lost.
func powerOff() {
	unix.Sync()
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		_ = unix.IoctlSetInt(int(f.Fd()), unix.TCSBRK, 1) // tcdrain
		f.Close()
	}
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	os.Exit(1)
}
