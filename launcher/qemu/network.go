package qemu

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
)

// NetDevice is the guest's one network device on the QEMU command line.
type NetDevice struct {
	// TapFD is the fd number (in QEMU) of an open tap device; 0 with User.
	TapFD int
	// VhostFD is the fd number of an open /dev/vhost-net for the tap's
	// in-kernel data path; 0: vhost=off.
	VhostFD int
	// User selects QEMU's user-mode NAT (slirp) instead of a tap.
	User bool
	MAC  [6]byte
}

// vhostNet is the vhost-net device; QEMU opens it by name unless given
// vhostfd, which it then uses as is.
const vhostNet = "/dev/vhost-net"

// netArgs is the -netdev and -device pair of n on bus ("device" for
// virtio-mmio, "pci" for virtio-pci).
func netArgs(n *NetDevice, bus string) ([]string, error) {
	if n.MAC[0]&1 != 0 || n.MAC == ([6]byte{}) {
		return nil, fmt.Errorf("qemu: guest MAC %s is not a unicast address (the lowest bit of the first byte must be 0, and not all zero)", net.HardwareAddr(n.MAC[:]))
	}
	var netdev string
	switch {
	case n.User && n.TapFD != 0:
		return nil, errors.New("qemu: network: both a tap and user mode given; give one")
	case n.User:
		// No hostfwd, smb or tftp: nothing on the host reaches the guest,
		// and the guest reaches what the VMM's network namespace reaches.
		netdev = "user,id=net0,ipv6=off,restrict=off"
	case n.TapFD > 2:
		netdev = fmt.Sprintf("tap,id=net0,fd=%d,vhost=off", n.TapFD)
		if n.VhostFD > 2 {
			netdev = fmt.Sprintf("tap,id=net0,fd=%d,vhost=on,vhostfd=%d", n.TapFD, n.VhostFD)
		}
	default:
		return nil, fmt.Errorf("qemu: network: neither a tap fd (> 2, got %d) nor user mode given", n.TapFD)
	}
	dev := "virtio-net-" + bus + ",netdev=net0,mac=" + net.HardwareAddr(n.MAC[:]).String()
	if bus == "pci" {
		// The guest boots its kernel directly: no option ROM to load (and
		// no file for the job's identity to open).
		dev += ",romfile="
	}
	return []string{"-netdev", netdev, "-device", dev}, nil
}

// openVhost opens /dev/vhost-net for the VMM when the tap's data path can
// use it: under KVM (vhost-net signals the guest through KVM's irqfd), and
// when the device exists. The supervisor (root) opens it and QEMU gets the
// descriptor, as libvirt does: the job's identity need not be able to open
// the node (0660 root:kvm by Debian's udev rules). nil: vhost=off.
func openVhost(accel string) (*os.File, error) {
	if accel != "kvm" {
		return nil, nil
	}
	f, err := os.OpenFile(vhostNet, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s for the VMM: %w", vhostNet, err)
	}
	return f, nil
}

// startIn starts cmd in the network namespace ns (nil: the caller's).
// The child of fork inherits the namespaces of the forking thread, so the
// start runs on a goroutine locked to its OS thread that joins ns first
// (setns(CLONE_NEWNET)); that thread then goes back to the original
// namespace, or, when that fails, is left locked so it dies with its
// goroutine and never runs other Go code in ns. Needs CAP_SYS_ADMIN.
func startIn(cmd *exec.Cmd, ns *os.File) error {
	if ns == nil {
		return cmd.Start()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open this thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter the VMM's network namespace: %w", err)
			return
		}
		err = cmd.Start()
		if serr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); serr != nil {
			// The thread stays locked and exits with this goroutine; the
			// VMM's parent-death signal (sent when the thread that forked
			// it ends) would then kill it: end it here and say why.
			if err == nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				err = fmt.Errorf("return to the supervisor's network namespace after starting the VMM: %w", serr)
			}
			errc <- err
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// networkSetup is the agent's description of the guest's interface.
func networkSetup(g driver.GuestNetwork) *api.Network {
	out := &api.Network{Mac: append([]byte(nil), g.MAC[:]...), Mtu: uint32(max(g.MTU, 0))}
	if g.Addr.IsValid() {
		out.Address = g.Addr.String()
	}
	if g.Gateway.IsValid() {
		out.Gateway = g.Gateway.String()
	}
	for _, r := range g.Routes {
		out.Routes = append(out.Routes, &api.Route{Destination: r.Dst.String(), Via: r.Via.String()})
	}
	for _, n := range g.Neighbors {
		out.Neighbors = append(out.Neighbors, &api.Neighbor{Address: n.Addr.String(), Mac: append([]byte(nil), n.MAC[:]...)})
	}
	for _, h := range g.Hosts {
		out.Hosts = append(out.Hosts, &api.HostEntry{Address: h.Addr.String(), Names: append([]string(nil), h.Names...)})
	}
	for _, d := range g.DNS {
		out.Dns = append(out.Dns, d.String())
	}
	return out
}
