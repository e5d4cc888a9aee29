package network

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestAttackLinkLocalDst: a guest root sends IPv4 in a frame whose
// destination MAC is an IEEE 802.1D link-local group address
// (01:80:c2:00:00:0e, LLDP's). The bridge hands such frames to
// NF_BR_LOCAL_IN (LLDP's 0x0e: to no hook at all), not to the prerouting
// chain the fence hooks, and then back to the tap's own protocol
// handlers, where the inet table's `iif <bridge> drop` does not match
// (iif is the tap). Debian's default rp_filter (2, loose) is set.
func TestAttackLinkLocalDst(t *testing.T) {
	lockNS(t)
	a := newNS(t)
	b := newNS(t)
	joinNS(t, a, b, "under0", "192.0.2.1/24", "under0", "192.0.2.2/24")
	pa, atA := setup(t, a, hostReq("node1", 1234, 0, n1, n2))
	tapA := atA.Network.Tap
	enter(t, a)
	if v := os.Getenv("RPF_ALL"); v != "" {
		sysctl(t, "ipv4/conf/all/rp_filter", v)
	}
	if v := os.Getenv("RPF_TAP"); v != "" {
		sysctl(t, "ipv4/conf/"+pa.Names.Tap+"/rp_filter", v)
	}
	own := listenUDP(t, "192.0.2.1", 9998)
	for _, last := range []byte{0x03, 0x0e} {
		lldp := [6]byte{0x01, 0x80, 0xc2, 0x00, 0x00, last}
		spoofMAC := [6]byte{0x02, 0x66, 0x66, 0x66, 0x66, 0x66}
		// Control: to the bridge's MAC, the guest's own addresses: dropped.
		send(t, tapA, udpFrame(MACOf(netip.MustParseAddr("10.224.0.1")), pa.Guest.MAC, pa.Guest.Addr.Addr(), n1.Addr, 9998, "via-bridge-mac"))
		if received(t, own, "via-bridge-mac", 500*time.Millisecond) {
			t.Error("control: reached the node via the bridge MAC")
		}
		// Attack: spoofed MAC, spoofed source address (another node's).
		send(t, tapA, udpFrame(lldp, spoofMAC, netip.MustParseAddr("192.0.2.2"), n1.Addr, 9998, "via-link-local-dst"))
		if received(t, own, "via-link-local-dst", 2*time.Second) {
			t.Errorf("HOLE: a guest reached a UDP socket on its node's own address, with spoofed MAC and source address, by sending to %x", lldp)
		}
	}
	t.Logf("node1 ruleset:\n%s", inspect(t, a, "nft", "list", "table", "bridge", pa.Names.Table))
}

// TestAttackVXLANInject: the kernel checks neither a VXLAN packet's outer
// source address nor its port, and the VNI and the peers' MACs follow from
// the job id (squeue) by the documented scheme. The underlay fence must
// keep out a host that is not the step's peer, a non-root user on a peer
// node, and anyone on the step's own node.
func TestAttackVXLANInject(t *testing.T) {
	lockNS(t)
	a := newNS(t)
	b := newNS(t)
	joinNS(t, a, b, "under0", "192.0.2.1/24", "under0", "192.0.2.2/24")
	pa, atA := setup(t, a, hostReq("node1", 1234, 0, n1, n2))
	_, _ = setup(t, b, hostReq("node2", 1234, 0, n1, n2))
	peer := MACOf(netip.MustParseAddr("10.224.0.3")) // node2's guest, computed
	inner := udpFrame(pa.Guest.MAC, peer, netip.MustParseAddr("10.224.0.3"), pa.Guest.Addr.Addr(), 9999, "injected")
	pkt := vxlanPacket(VNI(1234, 0, 0), inner)
	for _, c := range []struct {
		name string
		from *net.UDPAddr
		to   string
	}{
		// a root socket on the other node, but from an address that is
		// not the step's peer (another host of the underlay)
		{"another host's address, port 40001", &net.UDPAddr{IP: net.ParseIP("192.0.2.9"), Port: 40001}, "192.0.2.1"},
	} {
		enter(t, b)
		if l, err := netlink.LinkByName("under0"); err != nil {
			t.Fatal(err)
		} else if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("192.0.2.9"), Mask: net.CIDRMask(24, 32)}}); err != nil {
			t.Fatal(err)
		}
		conn, err := net.DialUDP("udp4", c.from, &net.UDPAddr{IP: net.ParseIP(c.to), Port: DefaultVXLANPort})
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(pkt)
		conn.Close()
		if awaitFrame(t, atA.Network.Tap, "injected", 2*time.Second) {
			t.Errorf("HOLE (%s): a plain UDP datagram put a frame into step 1234.0.0's guest on node1", c.name)
		}
	}
	// As uid 65534 (nobody), with socat, on the other node. The output
	// fence drops it at once: sendto fails with EPERM.
	if out, err := sendAsNobody(t, b, "192.0.2.1", pkt); err != nil && !strings.Contains(string(out), "Operation not permitted") {
		t.Fatalf("socat as nobody: %v\n%s", err, out)
	} else if err == nil {
		t.Errorf("a non-root user on a peer node sent to the VXLAN port: the output fence let it out")
	}
	if awaitFrame(t, atA.Network.Tap, "injected", 2*time.Second) {
		t.Errorf("HOLE (uid 65534 on node2, socat): a plain UDP datagram put a frame into the step's guest on node1")
	}
	// The same from node1 itself (a local user of the step's own node).
	enter(t, a)
	if lo, err := netlink.LinkByName("lo"); err == nil {
		netlink.LinkSetUp(lo)
	}
	for _, to := range []string{"192.0.2.1", "127.0.0.1"} {
		conn, err := net.DialUDP("udp4", &net.UDPAddr{Port: 40002}, &net.UDPAddr{IP: net.ParseIP(to), Port: DefaultVXLANPort})
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(pkt)
		conn.Close()
		if awaitFrame(t, atA.Network.Tap, "injected", 2*time.Second) {
			t.Errorf("HOLE (same node, to %s): a plain UDP datagram put a frame into the step's guest", to)
		}
	}
}

// TestAttackConntrack: with a service listed, every new 5-tuple a guest
// sends toward it is a conntrack entry of the node's namespace (the
// masquerade needs them); the step's connlimit bounds how many it holds.
func TestAttackConntrack(t *testing.T) {
	lockNS(t)
	node := newNS(t)
	svc := newNS(t)
	enter(t, node)
	underlay(t, "under0", "192.0.2.1")
	joinNS(t, node, svc, "svc0", "198.51.100.1/24", "svc0", "198.51.100.7/24")
	enter(t, node)
	sysctl(t, "ipv4/ip_forward", "1")
	r := hostReq("node1", 55, 0, n1, n2)
	r.Services = []Service{{Prefix: netip.MustParsePrefix("198.51.100.7/32"), Proto: "udp", Port: 53}}
	p, at := setup(t, node, r)
	count := func() string {
		b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
		if err != nil {
			t.Fatal(err)
		}
		return string(bytes.TrimSpace(b))
	}
	before := count()
	gw := MACOf(p.Guest.Gateway)
	for i := 0; i < 20000; i++ {
		f := udpFrame(gw, p.Guest.MAC, p.Guest.Addr.Addr(), netip.MustParseAddr("198.51.100.7"), 53, "x")
		binary.BigEndian.PutUint16(f[34:], uint16(1024+i%60000)) // source port
		binary.BigEndian.PutUint16(f[36:], 53)
		if i >= 60000 {
			break
		}
		send(t, at.Network.Tap, f)
	}
	time.Sleep(300 * time.Millisecond)
	after := count()
	t.Logf("nf_conntrack_count in the node's namespace: %s before, %s after 20000 frames from one guest (nf_conntrack_max is host-wide)", before, after)
	b, _ := strconv.Atoi(before)
	a, _ := strconv.Atoi(after)
	if a-b > MaxServiceConns+64 {
		t.Errorf("one guest made %d conntrack entries with 20000 flows to a service: want at most MaxServiceConns (%d)", a-b, MaxServiceConns)
	}
	if a-b < MaxServiceConns/2 {
		t.Errorf("only %d conntrack entries: the flows did not reach the service path (the test proves nothing)", a-b)
	}
}

// TestVXLANMitigationSkuid: the underlay fence's output rule (UDP to the
// VXLAN port from non-root sockets drops) lets the step's own VXLAN
// packets, which the kernel's root socket sends, through, and stops uid
// 65534's.
func TestVXLANMitigationSkuid(t *testing.T) {
	lockNS(t)
	a := newNS(t)
	b := newNS(t)
	joinNS(t, a, b, "under0", "192.0.2.1/24", "under0", "192.0.2.2/24")
	pa, atA := setup(t, a, hostReq("node1", 1234, 0, n1, n2))
	pb, atB := setup(t, b, hostReq("node2", 1234, 0, n1, n2))
	send(t, atB.Network.Tap, udpFrame(pa.Guest.MAC, pb.Guest.MAC, pb.Guest.Addr.Addr(), pa.Guest.Addr.Addr(), 9999, "legit"))
	if !awaitFrame(t, atA.Network.Tap, "legit", 3*time.Second) {
		t.Fatal("with the output rule, the step's own VXLAN traffic does not pass")
	}
	inner := udpFrame(pa.Guest.MAC, pb.Guest.MAC, pb.Guest.Addr.Addr(), pa.Guest.Addr.Addr(), 9999, "injected")
	out, _ := sendAsNobody(t, b, "192.0.2.1", vxlanPacket(VNI(1234, 0, 0), inner))
	if awaitFrame(t, atA.Network.Tap, "injected", 2*time.Second) {
		t.Errorf("the output rule did not stop uid 65534 (%s)", out)
	}
	t.Logf("%s", inspect(t, b, "nft", "list", "table", "inet", pb.Names.Table))
}

// TestAttackNeighTable: ARP requests for the node's address sent to a
// link-local group MAC reach the tap's own ARP: each sender address
// becomes a neighbour entry of the node's namespace (the table is shared
// by every interface; gc_thresh3 bounds it, 1024 by default).
func TestAttackNeighTable(t *testing.T) {
	lockNS(t)
	a := newNS(t)
	b := newNS(t)
	joinNS(t, a, b, "under0", "192.0.2.1/24", "under0", "192.0.2.2/24")
	pa, atA := setup(t, a, hostReq("node1", 1234, 0, n1, n2))
	enter(t, a)
	if v := os.Getenv("RPF_ALL"); v != "" {
		sysctl(t, "ipv4/conf/all/rp_filter", v)
	}
	if v := os.Getenv("RPF_TAP"); v != "" {
		sysctl(t, "ipv4/conf/"+pa.Names.Tap+"/rp_filter", v)
	}
	ll := [6]byte{0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e}
	// Control: node1 reaches node2 (resolving it) with no flood.
	enter(t, b)
	l0 := listenUDP(t, "192.0.2.2", 9001)
	enter(t, a)
	if c, err := net.Dial("udp4", "192.0.2.2:9001"); err == nil {
		c.Write([]byte("control"))
		c.Close()
	}
	if !received(t, l0, "control", 2*time.Second) {
		t.Fatal("control: node1 cannot reach node2 without a flood")
	}
	inspect(t, a, "ip", "neigh", "flush", "dev", "under0")
	replies := 0
	for i := 0; i < 1500; i++ {
		f := arpFrame(ll, [6]byte{0x02, 0x99, 0, 0, byte(i >> 8), byte(i)}, [6]byte{0x02, 0x99, 0, 0, byte(i >> 8), byte(i)}, netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)}), "")
		f[21] = 1 // request
		copy(f[38:42], []byte{192, 0, 2, 1})
		send(t, atA.Network.Tap, f)
	}
	time.Sleep(500 * time.Millisecond)
	buf := make([]byte, 1500)
	for {
		atA.Network.Tap.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := atA.Network.Tap.Read(buf)
		if err != nil {
			break
		}
		if n >= 42 && buf[12] == 8 && buf[13] == 6 && buf[21] == 2 {
			replies++
		}
	}
	out := inspect(t, a, "ip", "-4", "neigh", "show", "dev", pa.Names.Tap)
	t.Logf("ARP replies the guest got from its node: %d; neighbour entries on the tap: %d", replies, strings.Count(out, "\n"))
	// While the guest keeps it full, can the node resolve a new neighbour?
	enter(t, a)
	stop := make(chan struct{})
	go func() {
		for j := 0; ; j++ {
			select {
			case <-stop:
				return
			default:
			}
			i := 2000 + j%30000
			f := arpFrame(ll, [6]byte{0x02, 0x98, 0, 0, byte(i >> 8), byte(i)}, [6]byte{0x02, 0x98, 0, 0, byte(i >> 8), byte(i)}, netip.AddrFrom4([4]byte{10, 98, byte(i >> 8), byte(i)}), "")
			f[21] = 1
			copy(f[38:42], []byte{192, 0, 2, 1})
			atA.Network.Tap.Write(f)
		}
	}()
	time.Sleep(6 * time.Second)
	enter(t, b)
	l := listenUDP(t, "192.0.2.2", 9000)
	enter(t, a)
	inspect(t, a, "ip", "neigh", "flush", "dev", "under0")
	c, err := net.Dial("udp4", "192.0.2.2:9000")
	if err != nil {
		t.Fatal(err)
	}
	var sendErr error
	for k := 0; k < 5; k++ {
		if _, err := c.Write([]byte("node-to-node")); err != nil {
			sendErr = err
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.Close()
	got := received(t, l, "node-to-node", 2*time.Second)
	close(stop)
	t.Logf("during the flood, node1's UDP to node2 (a neighbour to resolve anew) arrived: %v (send error %v)", got, sendErr)
	if !got {
		t.Error("HOLE (DoS): a guest's ARP flood keeps its node from resolving neighbours")
	}
}

// vxlanPacket is a VXLAN payload (header and inner frame) of vni, as a
// forger would send it over UDP.
func vxlanPacket(vni uint32, inner []byte) []byte {
	pkt := make([]byte, 8, 8+len(inner))
	pkt[0] = 0x08
	binary.BigEndian.PutUint32(pkt[4:], vni<<8)
	return append(pkt, inner...)
}

// sendAsNobody sends pkt to to:4789 from source port 40003 as uid 65534,
// with socat in the network namespace ns, and returns socat's output and
// error (the underlay fence makes sendto fail with EPERM).
func sendAsNobody(t *testing.T, ns netns.NsHandle, to string, pkt []byte) ([]byte, error) {
	t.Helper()
	prereq.Tools(t, "setpriv", "socat", "nsenter")
	fd, err := unix.Dup(int(ns))
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "netns")
	defer f.Close()
	cmd := exec.Command("nsenter", "--net=/proc/self/fd/3", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		"socat", "-u", "STDIN", "UDP4-SENDTO:"+to+":4789,sourceport=40003")
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stdin = bytes.NewReader(pkt)
	return cmd.CombinedOutput()
}
