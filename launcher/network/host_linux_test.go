package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

func hostReq(node string, job, step uint32, nodes ...Node) Request {
	return Request{
		Mode: Step, Node: node, Job: job, Step: step,
		Nodes:  nodes,
		Subnet: netip.MustParsePrefix("10.224.0.0/16"),
	}
}

var (
	n1 = Node{Name: "node1", Addr: netip.MustParseAddr("192.0.2.1")}
	n2 = Node{Name: "node2", Addr: netip.MustParseAddr("192.0.2.2")}
)

// noneLeft fails t if any interface or table of slurm-microvm is in the
// current namespace.
func noneLeft(t *testing.T) {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if Leftover(l.Attrs().Name, l.Attrs().Alias) {
			t.Errorf("interface %s (%q) left", l.Attrs().Name, l.Attrs().Alias)
		}
	}
	tables, err := listTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if Leftover(tb.Name, "") {
			t.Errorf("table %s %s left", FamilyName(tb.Family), tb.Name)
		}
	}
}

func TestSetupTeardown(t *testing.T) {
	lockNS(t)
	ns := newNS(t)
	underlay(t, "under0", "192.0.2.1")
	r := hostReq("node1", 1234, 0, n1, n2)
	r.Services = []Service{{Prefix: netip.MustParsePrefix("198.51.100.7/32"), Proto: "tcp", Port: 443}}
	p, err := NewPlan(r)
	if err != nil {
		t.Fatal(err)
	}

	// Services without forwarding: refused, naming the sysctl; nothing made.
	sysctl(t, "ipv4/ip_forward", "0")
	if _, err := Setup(context.Background(), p, nil); err == nil || !strings.Contains(err.Error(), "net.ipv4.ip_forward") {
		t.Fatalf("Setup with services and ip_forward=0: %v, want an error naming net.ipv4.ip_forward", err)
	}
	noneLeft(t)
	sysctl(t, "ipv4/ip_forward", "1")

	a, err := Setup(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := p.Names
	if a.Network.Tap == nil || a.Network.Guest.MTU != 1450 || a.Network.Guest.Addr != p.Guest.Addr {
		t.Errorf("attachment %+v: want a tap and guest MTU 1450 (1500 - 50)", a.Network)
	}
	link := inspect(t, ns, "ip", "-d", "link", "show")
	for _, want := range []string{
		n.Bridge + ": <BROADCAST,MULTICAST,UP",
		"link/ether 02:4d:0a:e0:00:01",
		fmt.Sprintf("vxlan id %d local 192.0.2.1 ", p.VNI),
		"dstport 4789 nolearning",
		"tun type tap pi off vnet_hdr off persist off",
		"alias " + n.Alias,
		"mtu 1450 qdisc noqueue master " + n.Bridge,
		"learning off flood off",
		"mcast_snooping 0",
	} {
		if !strings.Contains(link, want) {
			t.Errorf("ip -d link lacks %q:\n%s", want, link)
		}
	}
	if strings.Contains(link, "group ") && strings.Contains(link, "vxlan id") && strings.Contains(link, " group 2") {
		t.Errorf("VXLAN has a multicast group:\n%s", link)
	}
	for _, dev := range []string{n.Tap, n.VXLAN} {
		seg := inspect(t, ns, "bridge", "-d", "link", "show", "dev", dev)
		for _, want := range []string{"learning off", "flood off", "mcast_flood off", "bcast_flood off"} {
			if !strings.Contains(seg, want) {
				t.Errorf("bridge port %s lacks %q:\n%s", dev, want, seg)
			}
		}
	}
	fdb := inspect(t, ns, "bridge", "fdb", "show")
	for _, want := range []string{
		"02:4d:0a:e0:00:02 dev " + n.Tap + " master " + n.Bridge + " static",
		"02:4d:0a:e0:00:03 dev " + n.VXLAN + " master " + n.Bridge + " static",
		"02:4d:0a:e0:00:03 dev " + n.VXLAN + " dst 192.0.2.2 self permanent",
	} {
		if !strings.Contains(fdb, want) {
			t.Errorf("bridge fdb lacks %q:\n%s", want, fdb)
		}
	}
	if strings.Contains(fdb, "00:00:00:00:00:00 dev "+n.VXLAN) {
		t.Errorf("VXLAN has a default (flooding) entry:\n%s", fdb)
	}
	addr := inspect(t, ns, "ip", "addr", "show")
	if !strings.Contains(addr, "inet 10.224.0.1/16 ") {
		t.Errorf("bridge lacks the services gateway 10.224.0.1/16:\n%s", addr)
	}
	for _, dev := range []string{n.Bridge, n.VXLAN, n.Tap} {
		if out := inspect(t, ns, "ip", "-6", "addr", "show", "dev", dev); strings.TrimSpace(out) != "" {
			t.Errorf("%s has IPv6 addresses:\n%s", dev, out)
		}
		if out := inspect(t, ns, "ip", "-d", "link", "show", "dev", dev); !strings.Contains(out, "mtu 1450 ") {
			t.Errorf("%s: MTU is not 1450:\n%s", dev, out)
		}
	}
	for _, dev := range []string{n.Bridge, n.VXLAN, n.Tap} {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + dev + "/disable_ipv6")
		if err == nil && strings.TrimSpace(string(b)) != "1" {
			t.Errorf("IPv6 on on %s", dev)
		}
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + n.Bridge + "/arp_ignore"); err != nil || strings.TrimSpace(string(b)) != "8" {
		t.Errorf("bridge arp_ignore %q, %v: want 8 (answer no ARP)", b, err)
	}
	if out := inspect(t, ns, "ip", "neigh", "show", "dev", n.Bridge); !strings.Contains(out, "10.224.0.2 lladdr 02:4d:0a:e0:00:02 PERMANENT") {
		t.Errorf("no permanent neighbour for the guest on the bridge:\n%s", out)
	}
	rules := inspect(t, ns, "nft", "list", "ruleset")
	for _, want := range []string{
		"table bridge " + n.Table,
		"table inet " + n.Table,
		`iifname "` + n.Tap + `" ether saddr != 02:4d:0a:e0:00:02 drop`,
		`iifname "` + n.Tap + `" ip saddr 10.224.0.2 accept`,
		`iifname "` + n.Tap + `" arp htype 1 arp ptype ip arp hlen 6 arp plen 4 arp saddr ether 02:4d:0a:e0:00:02 arp saddr ip 10.224.0.2 accept`,
		`iifname "` + n.Tap + `" drop`,
		`iifname "` + n.VXLAN + `" ether saddr != @peers drop`,
		`iifname "` + n.Bridge + `" drop`,
		`ip daddr 198.51.100.7 tcp dport 443 accept`,
		"ct state established,related accept",
		"masquerade",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("nft ruleset lacks %q:\n%s", want, rules)
		}
	}

	// The tap is not persistent: closing the last fd removes it.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(n.Tap); err == nil {
		t.Errorf("tap %s outlived its fd", n.Tap)
	}

	// A second Setup of the same step finds the leftovers, refuses and
	// leaves them (they are gc's).
	if _, err := Setup(context.Background(), p, nil); err == nil || !strings.Contains(err.Error(), "gc") {
		t.Errorf("Setup over leftovers: %v, want one that says to run gc", err)
	}
	if _, err := netlink.LinkByName(n.Bridge); err != nil {
		t.Errorf("the refused Setup removed the leftover bridge: %v", err)
	}

	if err := Teardown(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	noneLeft(t)
	if err := Teardown(context.Background(), n); err != nil {
		t.Errorf("second Teardown: %v", err)
	}
	if rules := inspect(t, ns, "nft", "list", "ruleset"); strings.Contains(rules, n.Table) {
		t.Errorf("tables left:\n%s", rules)
	}
}

// TestSetupUndo: refused Setups (a guest MTU above the underlay's, an
// underlay address not on the node, a name already taken) leave nothing
// and touch nothing they did not make.
func TestSetupUndo(t *testing.T) {
	lockNS(t)
	newNS(t)
	underlay(t, "under0", "192.0.2.1")
	r := hostReq("node1", 7, 0, n1, n2)
	r.MTU = 1460
	p, err := NewPlan(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Setup(context.Background(), p, nil); err == nil || !strings.Contains(err.Error(), "[network] mtu") {
		t.Errorf("MTU 1460 over a 1500 underlay: %v", err)
	}
	noneLeft(t)
	// The underlay is not on this node: refused, nothing left.
	r = hostReq("node1", 7, 0, Node{"node1", netip.MustParseAddr("192.0.2.77")}, n2)
	p, _ = NewPlan(r)
	if _, err := Setup(context.Background(), p, nil); err == nil || !strings.Contains(err.Error(), "NodeAddr") {
		t.Errorf("absent underlay: %v", err)
	}
	noneLeft(t)
	// An interface with one of the step's names (left by a crash) is
	// refused before anything is made, and left alone. (A failure after
	// the bridge exists, with its undo, is TestVNICollision's.)
	r = hostReq("node1", 7, 0, n1, n2)
	p, _ = NewPlan(r)
	d := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: p.Names.Tap}}
	if err := netlink.LinkAdd(d); err != nil {
		t.Fatal(err)
	}
	if _, err := Setup(context.Background(), p, nil); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("Setup with its tap name taken: %v", err)
	}
	if _, err := netlink.LinkByName(p.Names.Tap); err != nil {
		t.Errorf("the refused Setup removed an interface it had not made: %v", err)
	}
	if _, err := netlink.LinkByName(p.Names.Bridge); err == nil {
		t.Errorf("the refused Setup made its bridge")
	}
	netlink.LinkDel(d)
	noneLeft(t)
}

// TestVNICollision: a second VXLAN device with the step's VNI in one
// namespace (two nodes of one step sharing a namespace) fails closed,
// naming the step, and leaves the first alone.
func TestVNICollision(t *testing.T) {
	lockNS(t)
	ns := newNS(t)
	underlay(t, "under0", "192.0.2.1")
	p1, _ := setup(t, ns, hostReq("node1", 9, 0, n1))
	p, err := NewPlan(hostReq("node2", 9, 0, Node{"node2", n1.Addr}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Setup(context.Background(), p, nil)
	if err == nil || !strings.Contains(err.Error(), "VNI collision") || !strings.Contains(err.Error(), p.Names.Alias) || !strings.Contains(err.Error(), p1.Names.VXLAN) {
		t.Fatalf("second VXLAN with VNI %d: %v, want a VNI collision naming %q and %s", p.VNI, err, p.Names.Alias, p1.Names.VXLAN)
	}
	for _, name := range []string{p.Names.Bridge, p.Names.VXLAN, p.Names.Tap} {
		if _, err := netlink.LinkByName(name); err == nil {
			t.Errorf("%s left after the refused Setup", name)
		}
	}
	if _, err := netlink.LinkByName(p1.Names.VXLAN); err != nil {
		t.Errorf("the first step's VXLAN is gone: %v", err)
	}
}

func TestGC(t *testing.T) {
	lockNS(t)
	ns := newNS(t)
	underlay(t, "under0", "192.0.2.1")
	self := func(node string) Node { return Node{node, n1.Addr} }
	var mine, others []*Plan
	for _, c := range []struct {
		node      string
		job, step uint32
		mine      bool
	}{
		{"node1", 100, 0, true}, {"node1", 100, 1, true},
		{"node1", 200, 0, false}, {"node2", 100, 5, false}, {"node1", 1000, 0, false},
	} {
		p, a := setup(t, ns, hostReq(c.node, c.job, c.step, self(c.node)))
		if c.step != 1 {
			a.Close() // a crashed VMM: the tap is gone, the rest is left
		} // step 1: a VMM still holding its tap
		if c.mine {
			mine = append(mine, p)
		} else {
			others = append(others, p)
		}
	}
	// A user-mode step of the job: its veth and table go too.
	sysctl(t, "ipv4/ip_forward", "1")
	ur := userReq(100)
	ur.Step = 7
	pu, _ := setup(t, ns, ur)
	done, err := GC(context.Background(), "node1", 100)
	if err != nil {
		t.Fatal(err)
	}
	// step 0: bridge, VXLAN, 2 tables; step 1: the same and its tap;
	// user: veth, inet table.
	if len(done) != 4+5+2 {
		t.Errorf("GC removed %d objects, want 11: %q", len(done), done)
	}
	if _, err := netlink.LinkByName(pu.Names.Veth); err == nil {
		t.Errorf("GC left the user-mode veth %s", pu.Names.Veth)
	}
	for _, p := range mine {
		for _, name := range []string{p.Names.Bridge, p.Names.VXLAN} {
			if _, err := netlink.LinkByName(name); err == nil {
				t.Errorf("GC left %s of %q", name, p.Names.Alias)
			}
		}
	}
	tables, _ := listTables()
	names := map[string]int{}
	for _, tb := range tables {
		names[tb.Name]++
	}
	for _, p := range append(mine, pu) {
		if names[p.Names.Table] != 0 {
			t.Errorf("GC left table %s", p.Names.Table)
		}
	}
	for _, p := range others {
		if _, err := netlink.LinkByName(p.Names.Bridge); err != nil {
			t.Errorf("GC removed %s of %q: %v", p.Names.Bridge, p.Names.Alias, err)
		}
		if names[p.Names.Table] != 2 {
			t.Errorf("GC removed table %s of %q", p.Names.Table, p.Names.Alias)
		}
	}
	if done, err := GC(context.Background(), "node1", 100); err != nil || len(done) != 0 {
		t.Errorf("second GC: %q, %v", done, err)
	}
}

// TestTwoNodes: two namespaces as two nodes joined by an underlay veth;
// a step on both; the taps' fds stand for the guests.
func TestTwoNodes(t *testing.T) {
	lockNS(t)
	a := newNS(t)
	b := newNS(t)
	joinNS(t, a, b, "under0", "192.0.2.1/24", "under0", "192.0.2.2/24")
	pa, atA := setup(t, a, hostReq("node1", 1234, 0, n1, n2))
	pb, atB := setup(t, b, hostReq("node2", 1234, 0, n1, n2))
	_, at2A := setup(t, a, hostReq("node1", 1234, 1, n1, n2))
	_, at2B := setup(t, b, hostReq("node2", 1234, 1, n1, n2))
	tapA, tapB := atA.Network.Tap, atB.Network.Tap
	ga, gb := pa.Guest.Addr.Addr(), pb.Guest.Addr.Addr()
	frame := func(src [6]byte, from netip.Addr, payload string) []byte {
		return udpFrame(pb.Guest.MAC, src, from, gb, 9999, payload)
	}

	// The segment works, in both directions.
	send(t, tapA, frame(pa.Guest.MAC, ga, "a-to-b"))
	if !awaitFrame(t, tapB, "a-to-b", 3*time.Second) {
		t.Fatal("a frame from node1's guest to node2's did not arrive")
	}
	send(t, tapB, udpFrame(pa.Guest.MAC, pb.Guest.MAC, gb, ga, 9999, "b-to-a"))
	if !awaitFrame(t, tapA, "b-to-a", 3*time.Second) {
		t.Fatal("a frame from node2's guest to node1's did not arrive")
	}

	// Spoofed MAC, spoofed address, IPv6 and a VLAN tag: dropped. Each is
	// followed by a good frame; the bad ones must not arrive before it.
	spoofMAC := MACOf(netip.MustParseAddr("10.224.0.9"))
	send(t, tapA, frame(spoofMAC, ga, "spoofed-mac"))
	send(t, tapA, frame(pa.Guest.MAC, netip.MustParseAddr("10.224.0.9"), "spoofed-ip"))
	v6 := ipv6Frame(pb.Guest.MAC, pa.Guest.MAC, "ipv6-frame")
	send(t, tapA, v6)
	vlan := append(append(append([]byte{}, frame(pa.Guest.MAC, ga, "")[:12]...), 0x81, 0x00, 0, 5), frame(pa.Guest.MAC, ga, "vlan-frame")[12:]...)
	send(t, tapA, vlan)
	// ARP (unicast, as a reply): the guest's own passes, one claiming
	// another address or MAC does not.
	send(t, tapA, arpFrame(pb.Guest.MAC, pa.Guest.MAC, pa.Guest.MAC, netip.MustParseAddr("10.224.0.9"), "arp-spoofed-ip"))
	send(t, tapA, arpFrame(pb.Guest.MAC, pa.Guest.MAC, spoofMAC, ga, "arp-spoofed-mac"))
	send(t, tapA, arpFrame(pb.Guest.MAC, pa.Guest.MAC, pa.Guest.MAC, ga, "arp-good"))
	if !awaitFrame(t, tapB, "arp-good", 3*time.Second, "arp-spoofed-ip", "arp-spoofed-mac") {
		t.Fatal("the guest's own ARP reply did not arrive")
	}
	send(t, tapA, frame(pa.Guest.MAC, ga, "after-spoof"))
	if !awaitFrame(t, tapB, "after-spoof", 3*time.Second, "spoofed-mac", "spoofed-ip", "ipv6-frame", "vlan-frame") {
		t.Fatal("the good frame after the spoofed ones did not arrive")
	}

	// Another step on the same nodes (same guest addresses and MACs, its
	// own VNI): its frame reaches its own peer only.
	send(t, at2A.Network.Tap, frame(pa.Guest.MAC, ga, "step-1-frame"))
	if !awaitFrame(t, at2B.Network.Tap, "step-1-frame", 3*time.Second) {
		t.Fatal("step 1's frame did not reach step 1's peer")
	}
	send(t, tapA, frame(pa.Guest.MAC, ga, "step-0-frame"))
	if !awaitFrame(t, tapB, "step-0-frame", 3*time.Second, "step-1-frame") {
		t.Fatal("step 0's frame did not arrive")
	}

	// The guest cannot reach its node's own address (input) nor the
	// other node's (forward), even with forwarding on; removing the
	// chain (the control) lets the same packet through.
	enter(t, a)
	sysctl(t, "ipv4/ip_forward", "1")
	ownHost := listenUDP(t, "192.0.2.1", 9998)
	enter(t, b)
	otherHost := listenUDP(t, "192.0.2.2", 9997)
	bridgeMAC := MACOf(netip.MustParseAddr("10.224.0.1"))
	// Node 1 needs a way back to the guest for forwarding (rp_filter is 0
	// here, but a reply route keeps the control honest): the bridge route.
	enter(t, a)
	br, _ := netlink.LinkByName(pa.Names.Bridge)
	ad, _ := netlink.ParseAddr("10.224.0.1/16")
	if err := netlink.AddrAdd(br, ad); err != nil {
		t.Fatal(err)
	}
	toOwn := udpFrame(bridgeMAC, pa.Guest.MAC, ga, n1.Addr, 9998, "to-own-host")
	toOther := udpFrame(bridgeMAC, pa.Guest.MAC, ga, n2.Addr, 9997, "to-other-host")
	send(t, tapA, toOwn)
	send(t, tapA, toOther)
	if received(t, ownHost, "to-own-host", 500*time.Millisecond) {
		t.Error("the guest reached its node's own address")
	}
	if received(t, otherHost, "to-other-host", 500*time.Millisecond) {
		t.Error("the guest reached the other node's address through its node")
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: pa.Names.Table}
	c.DelChain(&nftables.Chain{Table: tbl, Name: "input"})
	c.DelChain(&nftables.Chain{Table: tbl, Name: "forward"})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	send(t, tapA, toOwn)
	send(t, tapA, toOther)
	if !received(t, ownHost, "to-own-host", 2*time.Second) {
		t.Error("control: without the input chain the packet to the node's address did not arrive either (the test proves nothing)")
	}
	if !received(t, otherHost, "to-other-host", 2*time.Second) {
		t.Error("control: without the forward chain the packet to the other node did not arrive either (the test proves nothing)")
	}
}

// ipv6Frame is an Ethernet frame holding an IPv6/UDP packet between
// link-local addresses.
func ipv6Frame(dst, src [6]byte, payload string) []byte {
	f := make([]byte, 14+40+8+len(payload))
	copy(f[0:6], dst[:])
	copy(f[6:12], src[:])
	f[12], f[13] = 0x86, 0xdd
	ip := f[14:54]
	ip[0] = 0x60
	ip[4], ip[5] = 0, byte(8+len(payload))
	ip[6], ip[7] = 17, 64
	copy(ip[8:24], netip.MustParseAddr("fe80::1").AsSlice())
	copy(ip[24:40], netip.MustParseAddr("fe80::2").AsSlice())
	udp := f[54:]
	udp[0], udp[1], udp[2], udp[3] = 0x9c, 0x40, 0x27, 0x0f
	udp[5] = byte(8 + len(payload))
	udp[6], udp[7] = 0xff, 0xff // IPv6 requires a checksum; any value reaches a bridge port
	copy(udp[8:], payload)
	return f
}

// TestServices: a listed service is reached from the guest through the
// gateway, masqueraded to the node, and its reply comes back to the tap;
// another port of the same host is not reached.
func TestServices(t *testing.T) {
	lockNS(t)
	node := newNS(t)
	svc := newNS(t)
	enter(t, node)
	underlay(t, "under0", "192.0.2.1")
	joinNS(t, node, svc, "svc0", "198.51.100.1/24", "svc0", "198.51.100.7/24")
	enter(t, svc)
	listed := listenUDP(t, "198.51.100.7", 53)
	other := listenUDP(t, "198.51.100.7", 54)
	enter(t, node)
	sysctl(t, "ipv4/ip_forward", "1")
	r := hostReq("node1", 55, 0, n1, n2)
	r.Services = []Service{{Prefix: netip.MustParsePrefix("198.51.100.7/32"), Proto: "udp", Port: 53}}
	p, at := setup(t, node, r)
	tap := at.Network.Tap
	gwMAC := MACOf(p.Guest.Gateway)
	g := p.Guest.Addr.Addr()
	svcAddr := netip.MustParseAddr("198.51.100.7")
	send(t, tap, udpFrame(gwMAC, p.Guest.MAC, g, svcAddr, 54, "to-unlisted-port"))
	send(t, tap, udpFrame(gwMAC, p.Guest.MAC, g, svcAddr, 53, "to-service"))
	buf := make([]byte, 100)
	listed.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, from, err := listed.ReadFromUDP(buf)
	if err != nil || string(buf[:n]) != "to-service" {
		t.Fatalf("the service got %q, %v", buf[:n], err)
	}
	if from.IP.String() != "198.51.100.1" {
		t.Errorf("the service saw source %v: want the node's 198.51.100.1 (masquerade)", from)
	}
	if _, err := listed.WriteToUDP([]byte("service-reply"), from); err != nil {
		t.Fatal(err)
	}
	if !awaitFrame(t, tap, "service-reply", 3*time.Second) {
		t.Error("the service's reply did not reach the guest's tap")
		t.Logf("node at the failure:\n%s\n%s\n%s", inspect(t, node, "nft", "list", "ruleset"), inspect(t, node, "ip", "-s", "-d", "link"), inspect(t, node, "ip", "neigh"))
	}
	if received(t, other, "to-unlisted-port", 300*time.Millisecond) {
		t.Error("the guest reached a port of the service host that is not listed")
	}
	// Nothing but replies toward the guest: the service host cannot open
	// a flow to it.
	enter(t, svc)
	_, guests, _ := net.ParseCIDR("10.224.0.0/16")
	if err := netlink.RouteAdd(&netlink.Route{Dst: guests, Gw: net.ParseIP("198.51.100.1")}); err != nil {
		t.Fatal(err)
	}
	c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IP(g.AsSlice()), Port: 7})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("unsolicited")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if awaitFrame(t, tap, "unsolicited", 500*time.Millisecond) {
		t.Error("a flow opened from outside reached the guest")
	}
}

// arpFrame is an Ethernet/IPv4 ARP reply from sender MAC/IP, with tag
// as padding after the ARP body so awaitFrame can tell frames apart.
func arpFrame(dst, src, sha [6]byte, spa netip.Addr, tag string) []byte {
	f := make([]byte, 14+28, 14+28+len(tag))
	copy(f[0:6], dst[:])
	copy(f[6:12], src[:])
	f[12], f[13] = 0x08, 0x06
	arp := f[14:]
	copy(arp[0:8], []byte{0, 1, 8, 0, 6, 4, 0, 2})
	copy(arp[8:14], sha[:])
	a := spa.As4()
	copy(arp[14:18], a[:])
	copy(arp[18:24], dst[:])
	copy(arp[24:28], []byte{10, 224, 0, 3})
	return append(f, tag...)
}
