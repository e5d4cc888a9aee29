package qemu_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// testNetns is a network namespace made for one test (never the host's):
// created by unshare on a locked thread that then dies, held by its file,
// gone when the file and every process in it are.
type testNetns struct{ f *os.File }

func newTestNetns(t testing.TB) testNetns {
	t.Helper()
	type res struct {
		f   *os.File
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends in the new namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- res{nil, fmt.Errorf("unshare(CLONE_NEWNET): %w", err)}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		ch <- res{f, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("new network namespace: %v", r.err)
	}
	t.Cleanup(func() { r.f.Close() })
	ns := testNetns{r.f}
	// A fresh namespace's lo is down.
	ns.do(t, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	return ns
}

// do runs fn on a thread inside the namespace; sockets and taps fn makes
// stay in it.
func (ns testNetns) do(t testing.TB, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return // the thread stays locked and dies
		}
		err = fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// openTap creates tap device name (IFF_TAP|IFF_NO_PI) in the calling
// thread's network namespace and returns its file.
func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(ifr))); e != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, e)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}

// acceptOne accepts one connection on l, reads a line, answers reply and
// returns the line (or an error) on the channel.
func acceptOne(l net.Listener, reply string) <-chan string {
	ch := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			ch <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			ch <- "read: " + err.Error()
			return
		}
		_, _ = c.Write([]byte(reply + "\n"))
		ch <- strings.TrimSpace(line) + " from " + c.RemoteAddr().String()
	}()
	return ch
}

var (
	guestMAC = [6]byte{0x52, 0x54, 0x00, 0x0a, 0x63, 0x02}
	peerMAC  = [6]byte{0x52, 0x54, 0x00, 0x0a, 0x63, 0x07}
)

// TestNetworkTap boots a VM on a tap in a network namespace of its own
// (the host side at 10.99.0.1/24) with the VMM started in that namespace,
// and checks from inside the guest its address, MTU, routes, permanent
// neighbor, /etc/hosts, /etc/resolv.conf and host name, and that TCP
// reaches a listener on the host side of the tap (real traffic).
func TestNetworkTap(t *testing.T) {
	fixture.RequireRoot(t)
	fixture.Require(t, "qemu-system-x86_64", "mkfs.erofs", "busybox")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newVMEnv(t, ctx, "Network OS", func(rootfs string) {
		// What images carry: a hosts file naming a step node wrongly, and
		// resolv.conf as a symlink into /run.
		os.WriteFile(filepath.Join(rootfs, "etc/hosts"), []byte("6.6.6.6\tpeer7\n"), 0o644)
		os.Symlink("../run/systemd/resolve/stub-resolv.conf", filepath.Join(rootfs, "etc/resolv.conf"))
	})
	ns := newTestNetns(t)
	tapName := fmt.Sprintf("smvt%d", os.Getpid()%100000)
	var tap *os.File
	var l net.Listener
	ns.do(t, func() error {
		var err error
		if tap, err = openTap(tapName); err != nil {
			return err
		}
		link, err := netlink.LinkByName(tapName)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 99, 0, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return fmt.Errorf("address on %s: %w", tapName, err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return err
		}
		l, err = net.Listen("tcp4", "10.99.0.1:0")
		return err
	})
	t.Cleanup(func() { tap.Close(); l.Close() })
	port := l.Addr().(*net.TCPAddr).Port

	cfg := jobConfig("net", e.stateDir(t, "state"), e.disk)
	cfg.Hostname = "node1"
	cfg.Network = &driver.Network{Tap: tap, NetNS: ns.f, Guest: driver.GuestNetwork{
		MAC: guestMAC, Addr: netip.MustParsePrefix("10.99.0.2/24"), MTU: 1400, Gateway: netip.MustParseAddr("10.99.0.1"),
		Routes:    []driver.Route{{Dst: netip.MustParsePrefix("10.98.0.0/16"), Via: netip.MustParseAddr("10.99.0.1")}},
		Neighbors: []driver.Neighbor{{Addr: netip.MustParseAddr("10.99.0.7"), MAC: peerMAC}},
		Hosts: []driver.HostEntry{
			{Addr: netip.MustParseAddr("10.99.0.2"), Names: []string{"node1"}},
			{Addr: netip.MustParseAddr("10.99.0.7"), Names: []string{"peer7", "peer7.step"}},
		},
		DNS: []netip.Addr{netip.MustParseAddr("10.99.0.1")},
	}}
	t0 := time.Now()
	sb, err := e.driver(true).Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Logf("boot to agent ready with a tap: %v", time.Since(t0))
	t.Cleanup(func() { _ = sb.Stop(context.Background()) })
	run := serve(t, ctx, sb, cfg.StateDir)

	got := acceptOne(l, "pong-from-host")
	checks := []struct {
		argv []string
		want []string
	}{
		{[]string{"ip", "-o", "addr", "show", "dev", "eth0"}, []string{"inet 10.99.0.2/24"}},
		{[]string{"cat", "/sys/class/net/eth0/mtu", "/sys/class/net/eth0/address", "/sys/class/net/eth0/carrier"}, []string{"1400\n52:54:00:0a:63:02\n1\n"}},
		{[]string{"ip", "route"}, []string{"default via 10.99.0.1 dev eth0", "10.98.0.0/16 via 10.99.0.1 dev eth0", "10.99.0.0/24 dev eth0"}},
		{[]string{"ip", "neigh", "show", "10.99.0.7"}, []string{"10.99.0.7 dev eth0 lladdr 52:54:00:0a:63:07 ", " PERMANENT"}},
		{[]string{"cat", "/etc/hosts"}, []string{"127.0.0.1\tlocalhost\n", "10.99.0.2\tnode1\n", "10.99.0.7\tpeer7 peer7.step\n"}},
		{[]string{"cat", "/etc/resolv.conf"}, []string{"nameserver 10.99.0.1\n"}},
		{[]string{"hostname"}, []string{"node1\n"}},
		{[]string{"ip", "-o", "link", "show", "lo"}, []string{"UP"}},
		{[]string{"sh", "-c", fmt.Sprintf("echo ping-from-guest | nc -w 20 10.99.0.1 %d", port)}, []string{"pong-from-host"}},
	}
	for _, c := range checks {
		out, st, err := run(c.argv...)
		if err != nil || st.Code != 0 {
			t.Errorf("%q: %v, status %+v, output %q", c.argv, err, st, out)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%q: output lacks %q:\n%s", c.argv, w, out)
			}
		}
		if c.argv[0] == "cat" && c.argv[1] == "/etc/hosts" && strings.Contains(out, "6.6.6.6") {
			t.Errorf("the image's hosts line survived:\n%s", out)
		}
	}
	select {
	case s := <-got:
		if !strings.HasPrefix(s, "ping-from-guest from 10.99.0.2:") {
			t.Errorf("host side got %q, want the guest's line from 10.99.0.2", s)
		}
	case <-time.After(30 * time.Second):
		t.Error("no connection from the guest reached the host side of the tap")
	}
}

// TestNetworkUser boots a VM in user mode (QEMU's slirp NAT) with its VMM
// in a fresh network namespace whose only interface is lo: the guest's
// connection to 10.0.2.2 (slirp's host alias) reaches a listener on that
// namespace's 127.0.0.1, which the host's namespace does not have, so
// slirp runs in the VMM's namespace.
func TestNetworkUser(t *testing.T) {
	fixture.RequireRoot(t)
	fixture.Require(t, "qemu-system-x86_64", "mkfs.erofs", "busybox")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := newVMEnv(t, ctx, "User Net OS", nil)
	ns := newTestNetns(t)
	var l net.Listener
	ns.do(t, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		if len(links) != 1 || links[0].Attrs().Name != "lo" {
			return fmt.Errorf("fresh namespace has %d links, want lo only", len(links))
		}
		l, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	})
	t.Cleanup(func() { l.Close() })
	port := l.Addr().(*net.TCPAddr).Port
	// The same port on the host's loopback must not be what answers.
	if hl, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
		defer hl.Close()
		go func() {
			if c, err := hl.Accept(); err == nil {
				c.Write([]byte("wrong-namespace\n"))
				c.Close()
			}
		}()
	}

	cfg := jobConfig("user", e.stateDir(t, "state"), e.disk)
	cfg.Network = &driver.Network{User: true, NetNS: ns.f, Guest: driver.GuestNetwork{
		MAC: guestMAC, Addr: netip.MustParsePrefix("10.0.2.15/24"), Gateway: netip.MustParseAddr("10.0.2.2"),
	}}
	t0 := time.Now()
	sb, err := e.driver(true).Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Logf("boot to agent ready in user mode: %v", time.Since(t0))
	t.Cleanup(func() { _ = sb.Stop(context.Background()) })
	run := serve(t, ctx, sb, cfg.StateDir)
	got := acceptOne(l, "pong-from-vmm-netns")
	out, st, err := run("sh", "-c", fmt.Sprintf("echo ping-from-guest | nc -w 20 10.0.2.2 %d", port))
	if err != nil || st.Code != 0 || !strings.Contains(out, "pong-from-vmm-netns") {
		t.Errorf("guest nc: %v, status %+v, output %q; want the namespace's listener's answer", err, st, out)
	}
	select {
	case s := <-got:
		if !strings.HasPrefix(s, "ping-from-guest from 127.0.0.1:") {
			t.Errorf("listener got %q", s)
		}
	case <-time.After(30 * time.Second):
		t.Error("no connection reached the VMM namespace's loopback")
	}
}

// The agent's log lines around Setup (the first at debug level only).
var (
	setupReceived = regexp.MustCompile(`msg="setup received" .*?uptime_ms=(\d+)`)
	setUpAt       = regexp.MustCompile(`msg="sandbox set up" .*?uptime_ms=(\d+)`)
)

// BenchmarkBootNetwork measures boot to agent ready (Start: the VMM's
// start, the guest's boot and its Setup) and the stop, without a network,
// on a tap and in user mode:
//
//	flock /tmp/smv-e2e.lock go test -run '^$' -bench BootNetwork -benchtime 5x ./launcher/qemu/
func BenchmarkBootNetwork(b *testing.B) {
	fixture.RequireRoot(b)
	ctx := context.Background()
	e := newVMEnv(b, ctx, "Bench Net OS", nil)
	runs := 0
	for _, mode := range []string{"none", "tap", "user"} {
		b.Run(mode, func(b *testing.B) {
			ns := newTestNetns(b)
			var tap *os.File
			if mode == "tap" {
				ns.do(b, func() error {
					var err error
					if tap, err = openTap("smvb0"); err != nil {
						return err
					}
					link, err := netlink.LinkByName("smvb0")
					if err != nil {
						return err
					}
					return netlink.LinkSetUp(link)
				})
				b.Cleanup(func() { tap.Close() })
			}
			var boot time.Duration
			setupMs := 0
			for i := 0; i < b.N; i++ {
				runs++
				cfg := jobConfig("bench", e.stateDir(b, fmt.Sprintf("state-%d", runs)), e.disk)
				cfg.Debug = true // the agent logs when Setup arrived
				guest := driver.GuestNetwork{MAC: guestMAC, Addr: netip.MustParsePrefix("10.0.2.15/24"), Gateway: netip.MustParseAddr("10.0.2.2")}
				switch mode {
				case "tap":
					cfg.Network = &driver.Network{Tap: tap, NetNS: ns.f, Guest: guest}
				case "user":
					cfg.Network = &driver.Network{User: true, NetNS: ns.f, Guest: guest}
				}
				t0 := time.Now()
				sb, err := e.driver(true).Start(ctx, cfg)
				if err != nil {
					b.Fatal(err)
				}
				boot += time.Since(t0)
				_ = sb.Stop(ctx)
				// Setup's time on the guest's own clock (CLOCK_BOOTTIME,
				// logged by the agent): the network's part of the boot,
				// free of the host's start-up noise.
				con, _ := os.ReadFile(filepath.Join(cfg.StateDir, "console.log"))
				m0, m1 := setupReceived.FindSubmatch(con), setUpAt.FindSubmatch(con)
				if m0 == nil || m1 == nil {
					b.Fatalf("no Setup timing in the guest console:\n%s", con)
				}
				r0, _ := strconv.Atoi(string(m0[1]))
				r1, _ := strconv.Atoi(string(m1[1]))
				setupMs += r1 - r0
			}
			b.ReportMetric(float64(boot.Milliseconds())/float64(b.N), "ms/boot")
			b.ReportMetric(float64(setupMs)/float64(b.N), "guest-ms/setup")
		})
	}
}
