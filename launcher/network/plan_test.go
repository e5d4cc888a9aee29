package network

import (
	"net/netip"
	"strings"
	"testing"
)

func twoNodes() []Node {
	return []Node{
		{Name: "node1", Addr: netip.MustParseAddr("192.0.2.1")},
		{Name: "node-2.example", Addr: netip.MustParseAddr("192.0.2.2")},
	}
}

func stepReq(node string) Request {
	return Request{
		Mode: Step, Node: node, Job: 1234, Step: 0, Restart: 0,
		Nodes:  twoNodes(),
		Subnet: netip.MustParsePrefix("10.224.0.0/16"),
	}
}

func TestPlanAddresses(t *testing.T) {
	tests := []struct {
		node             string
		addr, peer       string
		mac              [6]byte
		underlay, remote string
	}{
		{"node1", "10.224.0.2/16", "10.224.0.3", [6]byte{2, 0x4d, 10, 224, 0, 2}, "192.0.2.1", "192.0.2.2"},
		{"node-2.example", "10.224.0.3/16", "10.224.0.2", [6]byte{2, 0x4d, 10, 224, 0, 3}, "192.0.2.2", "192.0.2.1"},
	}
	var vnis []uint32
	for _, tt := range tests {
		t.Run(tt.node, func(t *testing.T) {
			p, err := NewPlan(stepReq(tt.node))
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Guest.Addr.String(); got != tt.addr {
				t.Errorf("guest address %s, want %s", got, tt.addr)
			}
			if p.Guest.MAC != tt.mac {
				t.Errorf("guest MAC %x, want %x", p.Guest.MAC, tt.mac)
			}
			if p.Underlay.String() != tt.underlay {
				t.Errorf("underlay %v, want %s", p.Underlay, tt.underlay)
			}
			if len(p.Peers) != 1 || p.Peers[0].Guest.String() != tt.peer || p.Peers[0].Underlay.String() != tt.remote || p.Peers[0].MAC != MACOf(p.Peers[0].Guest) {
				t.Errorf("peers %+v, want one at %s on %s", p.Peers, tt.peer, tt.remote)
			}
			if len(p.Guest.Neighbors) != 1 || p.Guest.Neighbors[0].Addr.String() != tt.peer {
				t.Errorf("neighbors %+v, want the peer only", p.Guest.Neighbors)
			}
			if p.Guest.Gateway.IsValid() {
				t.Errorf("gateway %v without services", p.Guest.Gateway)
			}
			if len(p.Guest.Hosts) != 2 || p.Guest.Hosts[0].Names[0] != "node1" || p.Guest.Hosts[0].Addr.String() != "10.224.0.2" ||
				p.Guest.Hosts[1].Names[0] != "node-2.example" || p.Guest.Hosts[1].Addr.String() != "10.224.0.3" {
				t.Errorf("hosts %+v", p.Guest.Hosts)
			}
			if p.VXLANPort != DefaultVXLANPort {
				t.Errorf("port %d", p.VXLANPort)
			}
			vnis = append(vnis, p.VNI)
		})
	}
	if len(vnis) == 2 && vnis[0] != vnis[1] {
		t.Errorf("VNI differs between nodes: %d, %d", vnis[0], vnis[1])
	}
}

func TestPlanServicesGateway(t *testing.T) {
	r := stepReq("node1")
	r.Services = []Service{{Prefix: netip.MustParsePrefix("192.0.2.10/32"), Proto: "tcp", Port: 443}}
	p, err := NewPlan(r)
	if err != nil {
		t.Fatal(err)
	}
	if p.Guest.Gateway.String() != "10.224.0.1" {
		t.Errorf("gateway %v, want 10.224.0.1", p.Guest.Gateway)
	}
	last := p.Guest.Neighbors[len(p.Guest.Neighbors)-1]
	if last.Addr != p.Guest.Gateway || last.MAC != MACOf(p.Guest.Gateway) {
		t.Errorf("no permanent neighbor for the gateway: %+v", p.Guest.Neighbors)
	}
}

func TestVNIStableNonzero(t *testing.T) {
	// The documented formula: first 3 bytes of sha256("1234.0.0").
	// printf %s 1234.0.0 | sha256sum | cut -c1-6
	if got, want := VNI(1234, 0, 0), uint32(0xf2a0fd); got != want {
		t.Errorf("VNI(1234,0,0) = %#x, want %#x (the documented formula)", got, want)
	}
	seen := map[uint32]int{}
	for job := uint32(1); job < 2000; job++ {
		for step := uint32(0); step < 3; step++ {
			v := VNI(job, step, 0)
			if v == 0 || v >= 1<<24 {
				t.Fatalf("VNI(%d,%d,0) = %d: must be 1..2^24-1", job, step, v)
			}
			if v != VNI(job, step, 0) {
				t.Fatal("VNI not deterministic")
			}
			seen[v]++
		}
	}
	if VNI(1, 0, 0) == VNI(1, 0, 1) || VNI(1, 0, 0) == VNI(1, 1, 0) {
		t.Error("restart or step does not change the VNI")
	}
}

func TestNames(t *testing.T) {
	a := NamesFor("node1", 1234, 0, 0)
	b := NamesFor("node2", 1234, 0, 0)
	c := NamesFor("node1", 1234, 1, 0)
	long := NamesFor(strings.Repeat("n", maxNodeName), 4294967295, 4294967295, 4294967295)
	for _, n := range []Names{a, b, c, long} {
		for _, ifn := range []string{n.Bridge, n.VXLAN, n.Tap, n.Veth} {
			if len(ifn) > 15 || !ifnameRE.MatchString(ifn) {
				t.Errorf("interface name %q: must be ≤15 bytes smv<8 hex><role>", ifn)
			}
			if !Leftover(ifn, "") || !Leftover("eth9", n.Alias) {
				t.Errorf("Leftover misses %q / %q", ifn, n.Alias)
			}
		}
		if !Leftover(n.Table, "") {
			t.Errorf("Leftover misses table %q", n.Table)
		}
	}
	// printf %s 'node1 1234.0.0' | sha256sum | cut -c1-8
	if a.Bridge != "smv"+a.Bridge[3:11]+"b" || a.Tap[:11] != a.Bridge[:11] {
		t.Errorf("names of one step differ beyond the role letter: %+v", a)
	}
	if a.Bridge == b.Bridge || a.Bridge == c.Bridge {
		t.Errorf("names collide across nodes or steps: %s %s %s", a.Bridge, b.Bridge, c.Bridge)
	}
	if a.Alias != "slurm-microvm node1 1234.0.0" || a.Table != "slurm-microvm_1234.0.0_node1" {
		t.Errorf("alias %q table %q", a.Alias, a.Table)
	}
	o, ok := parseTable(NamesFor("a_b-c.d", 7, 8, 9).Table)
	if !ok || o != (owner{"a_b-c.d", 7, 8, 9}) {
		t.Errorf("parseTable: %+v %v", o, ok)
	}
	o, ok = parseAlias(NamesFor("a-b.c", 7, 8, 9).Alias)
	if !ok || o != (owner{"a-b.c", 7, 8, 9}) {
		t.Errorf("parseAlias: %+v %v", o, ok)
	}
	for _, s := range []string{"eth0", "smv0000000g", "smvabcdef01q", "br0", "slurm-microvm"} {
		if Leftover(s, "") || Leftover("x", s) {
			t.Errorf("Leftover(%q) true", s)
		}
	}
}

func TestPlanErrors(t *testing.T) {
	mod := func(f func(*Request)) Request { r := stepReq("node1"); f(&r); return r }
	tests := []struct {
		name string
		r    Request
		want string
	}{
		{"mode", mod(func(r *Request) { r.Mode = "bridge" }), "Request.Mode"},
		{"node name", mod(func(r *Request) { r.Node = "a b" }), "Request.Node"},
		{"node absent", mod(func(r *Request) { r.Node = "node9" }), "not among Request.Nodes"},
		{"duplicate node", mod(func(r *Request) { r.Nodes = append(r.Nodes, r.Nodes[0]) }), "listed twice"},
		{"same underlay", mod(func(r *Request) { r.Nodes[1].Addr = r.Nodes[0].Addr }), "same address"},
		{"ipv6 underlay", mod(func(r *Request) { r.Nodes[1].Addr = netip.MustParseAddr("2001:db8::1") }), "Request.Nodes[1].Addr"},
		{"subnet unset", mod(func(r *Request) { r.Subnet = netip.Prefix{} }), "Request.Subnet"},
		{"subnet unmasked", mod(func(r *Request) { r.Subnet = netip.MustParsePrefix("10.224.0.1/16") }), "Request.Subnet"},
		{"subnet too small", mod(func(r *Request) {
			r.Subnet = netip.MustParsePrefix("10.224.0.0/30")
			r.Nodes = append(r.Nodes, Node{"n3", netip.MustParseAddr("192.0.2.3")})
		}), "holds 1 guests"},
		{"service proto", mod(func(r *Request) {
			r.Services = []Service{{Prefix: netip.MustParsePrefix("192.0.2.9/32"), Proto: "icmp"}}
		}), "Request.Services[0].Proto"},
		{"service in subnet", mod(func(r *Request) {
			r.Services = []Service{{Prefix: netip.MustParsePrefix("10.224.0.0/24"), Proto: "tcp"}}
		}), "overlaps Request.Subnet"},
		{"mtu", mod(func(r *Request) { r.MTU = 100 }), "Request.MTU"},
		{"user fields in step", mod(func(r *Request) { r.UserAllow = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")} }), "Request.UserSubnet/UserAllow"},
		{"user services", mod(func(r *Request) {
			r.Mode = User
			r.Services = []Service{{Prefix: netip.MustParsePrefix("192.0.2.9/32"), Proto: "tcp"}}
		}), "Request.Services"},
		{"user subnet", mod(func(r *Request) { r.Mode = User; r.UserSubnet = netip.MustParsePrefix("100.64.0.0/31") }), "Request.UserSubnet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPlan(tt.r)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one naming %q", err, tt.want)
			}
		})
	}
}

func TestPlanSubnetCapacity(t *testing.T) {
	r := stepReq("node1")
	r.Subnet = netip.MustParsePrefix("10.224.0.0/30") // .2 only (.3 is broadcast)
	r.Nodes = r.Nodes[:1]
	if _, err := NewPlan(r); err != nil {
		t.Fatalf("one node in a /30: %v", err)
	}
	r.Nodes = twoNodes()
	if _, err := NewPlan(r); err == nil {
		t.Fatal("two nodes in a /30 accepted")
	}
}

func TestPlanUser(t *testing.T) {
	r := stepReq("node1")
	r.Mode, r.Subnet = User, netip.Prefix{}
	p, err := NewPlan(r)
	if err != nil {
		t.Fatal(err)
	}
	if p.Guest.Addr.String() != "10.0.2.15/24" || p.Guest.Gateway.String() != "10.0.2.2" || len(p.Guest.DNS) != 1 || p.Guest.DNS[0].String() != "10.0.2.3" {
		t.Errorf("guest %+v is not slirp's", p.Guest)
	}
	if p.UserSubnet != DefaultUserSubnet {
		t.Errorf("user subnet %v", p.UserSubnet)
	}
	blocked := map[string]bool{}
	for _, b := range p.UserBlocked {
		blocked[b.String()] = true
	}
	for _, want := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8", "192.0.2.1/32", "192.0.2.2/32"} {
		if !blocked[want] {
			t.Errorf("%s not blocked: %v", want, p.UserBlocked)
		}
	}
}
