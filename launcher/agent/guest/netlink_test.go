package guest

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// inNewNetns runs fn on a thread in a fresh network namespace (never the
// host's); the thread ends with it, and so does the namespace.
func inNewNetns(t *testing.T, fn func() error) {
	t.Helper()
	if os.Geteuid() != 0 {
		prereq.Root(t, "network namespaces")
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies in the namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// tapWithMAC makes tap device name with mac in the thread's namespace; the
// returned file holds it (and its carrier).
func tapWithMAC(name string, mac net.HardwareAddr) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ifr, _ := unix.NewIfreq(name)
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(ifr))); e != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF: %w", e)
	}
	f := os.NewFile(uintptr(fd), name)
	l, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.LinkSetHardwareAddr(l, mac)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// TestConfigureLink configures a real interface (a tap in a namespace of
// the test) as the agent does in the guest and reads the result back.
func TestConfigureLink(t *testing.T) {
	c, err := parseNetwork(validNetwork())
	if err != nil {
		t.Fatal(err)
	}
	inNewNetns(t, func() error {
		other, err := tapWithMAC("other0", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 9})
		if err != nil {
			return err
		}
		defer other.Close()
		tap, err := tapWithMAC("guest0", c.mac)
		if err != nil {
			return err
		}
		defer tap.Close()
		if err := configureLink(context.Background(), c, 2*time.Second); err != nil {
			return err
		}
		l, err := netlink.LinkByName("guest0")
		if err != nil {
			return err
		}
		var errs []string
		if l.Attrs().MTU != 1400 || l.Attrs().Flags&net.FlagUp == 0 {
			errs = append(errs, fmt.Sprintf("guest0 MTU %d flags %v", l.Attrs().MTU, l.Attrs().Flags))
		}
		if o, _ := netlink.LinkByName("other0"); o != nil && o.Attrs().Flags&net.FlagUp != 0 {
			errs = append(errs, "the interface with another MAC was set up")
		}
		lo, _ := netlink.LinkByName("lo")
		if lo == nil || lo.Attrs().Flags&net.FlagUp == 0 {
			errs = append(errs, "lo not up")
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		if len(addrs) != 1 || addrs[0].IPNet.String() != "10.99.0.2/24" {
			errs = append(errs, fmt.Sprintf("addresses %v", addrs))
		}
		routes, _ := netlink.RouteList(l, netlink.FAMILY_V4)
		var rs []string
		for _, r := range routes {
			rs = append(rs, fmt.Sprintf("%v via %v", r.Dst, r.Gw))
		}
		joined := strings.Join(rs, "; ")
		if !(strings.Contains(joined, "<nil> via 10.99.0.1") || strings.Contains(joined, "0.0.0.0/0 via 10.99.0.1")) || !strings.Contains(joined, "10.98.0.0/16 via 10.99.0.1") {
			errs = append(errs, "routes "+joined)
		}
		neigh, _ := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V4)
		found := false
		for _, n := range neigh {
			if n.IP.String() == "10.99.0.3" && n.HardwareAddr.String() == "52:54:00:00:00:03" && n.State == netlink.NUD_PERMANENT {
				found = true
			}
		}
		if !found {
			errs = append(errs, fmt.Sprintf("no permanent neighbor 10.99.0.3: %v", neigh))
		}
		// Twice is fine (replace, not add).
		if err := configureLink(context.Background(), c, 2*time.Second); err != nil {
			errs = append(errs, "second run: "+err.Error())
		}
		if len(errs) > 0 {
			return fmt.Errorf("%s", strings.Join(errs, "\n"))
		}
		return nil
	})
}

// TestConfigureLinkNoSuchMAC: no interface has the MAC: the error names
// it and the interfaces there are.
func TestConfigureLinkNoSuchMAC(t *testing.T) {
	c, err := parseNetwork(validNetwork())
	if err != nil {
		t.Fatal(err)
	}
	inNewNetns(t, func() error {
		other, err := tapWithMAC("other0", net.HardwareAddr{0x52, 0x54, 0, 0, 0, 9})
		if err != nil {
			return err
		}
		defer other.Close()
		err = configureLink(context.Background(), c, 100*time.Millisecond)
		if err == nil || !strings.Contains(err.Error(), "no network interface has MAC 52:54:00:12:34:56") || !strings.Contains(err.Error(), "other0 (52:54:00:00:00:09)") {
			return fmt.Errorf("err %v, want one naming the MAC and other0", err)
		}
		return nil
	})
}
