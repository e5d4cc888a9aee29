package network

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func userReq(job uint32, allow ...netip.Prefix) Request {
	return Request{Mode: User, Node: "node1", Job: job, Nodes: []Node{n1}, UserAllow: allow}
}

// sendFrom sends payload to dst:port from a socket made in ns.
func sendFrom(t *testing.T, ns netns.NsHandle, dst string, port int, payload string) {
	t.Helper()
	enter(t, ns)
	c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(dst), Port: port})
	if err != nil {
		t.Fatalf("dialing %s:%d from the step's namespace: %v", dst, port, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(payload)); err != nil {
		t.Fatalf("sending to %s:%d: %v", dst, port, err)
	}
}

// TestUserMode: the step's own namespace reaches a public address
// through the node's NAT, not a private one (unless allowed), nor the
// node itself; and nothing of it outlives the VMM's namespace and
// Teardown.
func TestUserMode(t *testing.T) {
	lockNS(t)
	node := newNS(t)
	outside := newNS(t)
	joinNS(t, node, outside, "up0", "203.0.113.1/24", "up0", "203.0.113.2/24")
	for _, side := range []struct {
		ns   netns.NsHandle
		addr string
	}{{outside, "10.9.9.2/24"}, {node, "10.9.9.1/24"}} {
		enter(t, side.ns)
		l, _ := netlink.LinkByName("up0")
		a, _ := netlink.ParseAddr(side.addr)
		if err := netlink.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
	}
	enter(t, outside)
	public := listenUDP(t, "203.0.113.2", 9000)
	private := listenUDP(t, "10.9.9.2", 9001)

	enter(t, node)
	p, err := NewPlan(userReq(1))
	if err != nil {
		t.Fatal(err)
	}
	sysctl(t, "ipv4/ip_forward", "0")
	if _, err := Setup(context.Background(), p, nil); err == nil || !strings.Contains(err.Error(), "net.ipv4.ip_forward") {
		t.Fatalf("user mode with ip_forward=0: %v, want an error naming net.ipv4.ip_forward", err)
	}
	noneLeft(t)
	sysctl(t, "ipv4/ip_forward", "1")

	p, at := setup(t, node, userReq(1))
	if !at.Network.User || at.Network.NetNS == nil || at.Network.Tap != nil {
		t.Fatalf("attachment %+v: want User, a namespace and no tap", at.Network)
	}
	if at.Network.Guest.Addr.String() != "10.0.2.15/24" {
		t.Errorf("guest %v", at.Network.Guest.Addr)
	}
	veth, err := netlink.LinkByName(p.Names.Veth)
	if err != nil || veth.Attrs().Alias != p.Names.Alias {
		t.Fatalf("veth %s: %v (alias %q)", p.Names.Veth, err, veth.Attrs().Alias)
	}
	addrs, _ := netlink.AddrList(veth, netlink.FAMILY_V4)
	if len(addrs) != 1 || !DefaultUserSubnet.Contains(netip.MustParseAddr(addrs[0].IP.String())) || addrs[0].Mask.String() != "fffffffc" {
		t.Fatalf("veth addresses %v: want one /30 in %v", addrs, DefaultUserSubnet)
	}
	hostIP := addrs[0].IP.String()
	stepNS := netns.NsHandle(int(at.Network.NetNS.Fd()))
	rules := inspect(t, node, "nft", "list", "table", "inet", p.Names.Table)
	for _, want := range []string{`iifname "` + p.Names.Veth + `" drop`, "ip daddr 10.0.0.0/8 drop", "ip daddr 192.0.2.1 drop", "masquerade"} {
		if !strings.Contains(rules, want) {
			t.Errorf("table lacks %q:\n%s", want, rules)
		}
	}
	if out := inspect(t, stepNS, "ip", "route", "show"); !strings.Contains(out, "default via "+hostIP+" dev eth0") {
		t.Errorf("step namespace's routes lack the default via %s:\n%s", hostIP, out)
	}

	enter(t, node)
	nodeSelf := listenUDP(t, hostIP, 9002)
	sendFrom(t, stepNS, "203.0.113.2", 9000, "to-public")
	sendFrom(t, stepNS, "10.9.9.2", 9001, "to-private")
	sendFrom(t, stepNS, hostIP, 9002, "to-node")
	buf := make([]byte, 100)
	public.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, from, err := public.ReadFromUDP(buf)
	if err != nil || string(buf[:n]) != "to-public" {
		t.Fatalf("the public destination got %q, %v: want to-public", buf[:n], err)
	}
	if from.IP.String() != "203.0.113.1" {
		t.Errorf("source %v: want the node's address (masquerade)", from)
	}
	if received(t, private, "to-private", 500*time.Millisecond) {
		t.Error("the step reached a private address")
	}
	if received(t, nodeSelf, "to-node", 300*time.Millisecond) {
		t.Error("the step reached its node")
	}

	// Controls: a step allowed 10.9.9.0/24 reaches it; without the
	// input chain the node is reached.
	_, at2 := setup(t, node, userReq(2, netip.MustParsePrefix("10.9.9.0/24")))
	sendFrom(t, netns.NsHandle(int(at2.Network.NetNS.Fd())), "10.9.9.2", 9001, "allowed-private")
	if !received(t, private, "allowed-private", 3*time.Second) {
		t.Error("a step with user_allow 10.9.9.0/24 did not reach 10.9.9.2")
	}
	enter(t, node)
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	c.DelChain(&nftables.Chain{Table: &nftables.Table{Family: nftables.TableFamilyINet, Name: p.Names.Table}, Name: "input"})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	sendFrom(t, stepNS, hostIP, 9002, "to-node-2")
	if !received(t, nodeSelf, "to-node-2", 2*time.Second) {
		t.Error("control: without the input chain the node was not reached either")
	}

	// The VMM gone (its namespace closed): the veth goes with it.
	enter(t, node)
	at.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := netlink.LinkByName(p.Names.Veth); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("veth %s outlived the step's namespace", p.Names.Veth)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := Teardown(context.Background(), p.Names); err != nil {
		t.Fatal(err)
	}
	if out := inspect(t, node, "nft", "list", "tables"); strings.Contains(out, p.Names.Table) {
		t.Errorf("table left: %s", out)
	}
}

// TestUserSlots: steps on one node get distinct /30s of user_subnet
// (probing past the hashed slot), and a full user_subnet is refused.
func TestUserSlots(t *testing.T) {
	lockNS(t)
	node := newNS(t)
	sysctl(t, "ipv4/ip_forward", "1")
	small := netip.MustParsePrefix("100.64.0.0/29") // two /30s
	seen := map[string]bool{}
	for job := uint32(1); job <= 2; job++ {
		r := userReq(job)
		r.UserSubnet = small
		p, _ := setup(t, node, r)
		l, err := netlink.LinkByName(p.Names.Veth)
		if err != nil {
			t.Fatal(err)
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		if len(addrs) != 1 || !small.Contains(netip.MustParseAddr(addrs[0].IP.String())) {
			t.Fatalf("job %d: addresses %v, want one in %v", job, addrs, small)
		}
		if seen[addrs[0].IP.String()] {
			t.Fatalf("job %d got %v, already taken", job, addrs[0].IP)
		}
		seen[addrs[0].IP.String()] = true
	}
	r := userReq(3)
	r.UserSubnet = small
	p, _ := NewPlan(r)
	if _, err := Setup(context.Background(), p, nil); err == nil || !strings.Contains(err.Error(), "[network.user] subnet") {
		t.Fatalf("third step in a /29: %v, want an error naming [network.user] subnet", err)
	}
	if _, err := netlink.LinkByName(p.Names.Veth); err == nil {
		t.Errorf("the refused step left its veth")
	}
}
