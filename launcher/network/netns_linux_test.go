package network

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// lockNS locks the test's goroutine to its thread for the rest of the
// test (never unlocked: the runtime ends the thread with the goroutine,
// so no other test ever runs in a namespace this one made) and puts it
// back in its original namespace at cleanup.
func lockNS(t *testing.T) {
	t.Helper()
	prereq.Root(t, "creates network namespaces, links and nftables tables")
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Set(orig); err != nil {
			t.Errorf("back to the original namespace: %v", err)
		}
		orig.Close()
	})
}

// newNS makes a network namespace for the test, enters it and closes it
// at cleanup (which destroys it and whatever is left in it). Call
// lockNS first.
func newNS(t *testing.T) netns.NsHandle {
	t.Helper()
	ns, err := netns.New()
	if err != nil {
		t.Fatalf("creating a network namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func enter(t *testing.T, ns netns.NsHandle) {
	t.Helper()
	if err := netns.Set(ns); err != nil {
		t.Fatalf("entering namespace: %v", err)
	}
}

// sysctl writes a per-namespace sysctl of the current (test) namespace.
func sysctl(t *testing.T, path, val string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join("/proc/sys/net", path), []byte(val), 0o644); err != nil {
		t.Fatal(err)
	}
}

// inspect runs a tool in ns (nsenter on a copy of its fd) and returns
// its output.
func inspect(t *testing.T, ns netns.NsHandle, args ...string) string {
	t.Helper()
	prereq.Tools(t, "nsenter", args[0])
	fd, err := unix.Dup(int(ns))
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "netns")
	defer f.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=/proc/self/fd/3"}, args...)...)
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// underlay puts a veth pair (name and name+"p") with addr/24 on name
// in the current namespace (this kernel may lack the dummy driver).
func underlay(t *testing.T, name string, addr string) {
	t.Helper()
	d := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: 1500}, PeerName: name + "p"}
	if err := netlink.LinkAdd(d); err != nil {
		t.Fatal(err)
	}
	a, _ := netlink.ParseAddr(addr + "/24")
	if err := netlink.AddrAdd(d, a); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{name, name + "p"} {
		l, err := netlink.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
}

// joinNS connects namespaces a and b with a veth pair carrying aAddr
// and bAddr (with prefix length), both up. The current namespace is a
// at return.
func joinNS(t *testing.T, a, b netns.NsHandle, aName, aAddr, bName, bAddr string) {
	t.Helper()
	enter(t, a)
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName}, PeerName: bName, PeerNamespace: netlink.NsFd(int(b))}
	if err := netlink.LinkAdd(v); err != nil {
		t.Fatal(err)
	}
	for _, side := range []struct {
		ns         netns.NsHandle
		name, addr string
	}{{b, bName, bAddr}, {a, aName, aAddr}} {
		enter(t, side.ns)
		l, err := netlink.LinkByName(side.name)
		if err != nil {
			t.Fatal(err)
		}
		ad, err := netlink.ParseAddr(side.addr)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.AddrAdd(l, ad); err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
}

// setup runs Setup in ns and registers Teardown (in ns) and Close.
func setup(t *testing.T, ns netns.NsHandle, r Request) (*Plan, *Attachment) {
	t.Helper()
	enter(t, ns)
	p, err := NewPlan(r)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Setup(context.Background(), p, nil)
	if err != nil {
		t.Fatalf("Setup %s: %v", r.Node, err)
	}
	t.Cleanup(func() {
		a.Close()
		if err := netns.Set(ns); err != nil {
			t.Error(err)
			return
		}
		if err := Teardown(context.Background(), p.Names); err != nil {
			t.Errorf("Teardown: %v", err)
		}
	})
	return p, a
}

func csum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// udpFrame is an Ethernet frame holding an IPv4/UDP packet (UDP checksum 0).
func udpFrame(dst, src [6]byte, from, to netip.Addr, dport uint16, payload string) []byte {
	f := make([]byte, 14+20+8+len(payload))
	copy(f[0:6], dst[:])
	copy(f[6:12], src[:])
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_IP)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	ip[8], ip[9] = 64, unix.IPPROTO_UDP
	s, d := from.As4(), to.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:], csum(ip))
	udp := f[34:]
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	copy(udp[8:], payload)
	return f
}

func send(t *testing.T, tap *os.File, frame []byte) {
	t.Helper()
	if _, err := tap.Write(frame); err != nil {
		t.Fatalf("writing a frame to %s: %v", tap.Name(), err)
	}
}

// awaitFrame reads tap until a frame holding want arrives (true) or
// within passes (false); a frame holding any of never fails the test.
func awaitFrame(t *testing.T, tap *os.File, want string, within time.Duration, never ...string) bool {
	t.Helper()
	buf := make([]byte, 65536)
	deadline := time.Now().Add(within)
	for {
		if err := tap.SetReadDeadline(deadline); err != nil {
			t.Fatal(err)
		}
		n, err := tap.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return false
		}
		if err != nil {
			t.Fatalf("reading %s: %v", tap.Name(), err)
		}
		for _, bad := range never {
			if bytes.Contains(buf[:n], []byte(bad)) {
				t.Errorf("frame %q arrived on %s: the fence let it through", bad, tap.Name())
			}
		}
		if bytes.Contains(buf[:n], []byte(want)) {
			return true
		}
	}
}

// listenUDP opens a UDP socket on addr:port in the current namespace.
func listenUDP(t *testing.T, addr string, port int) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP(addr), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// received tells whether c gets a datagram holding want within d.
func received(t *testing.T, c *net.UDPConn, want string, d time.Duration) bool {
	t.Helper()
	buf := make([]byte, 65536)
	deadline := time.Now().Add(d)
	for {
		c.SetReadDeadline(deadline)
		n, err := c.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(buf[:n], []byte(want)) {
			return true
		}
	}
}
