package network

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
)

const (
	// DefaultVXLANPort is the IANA VXLAN port, used when Request.VXLANPort is 0.
	DefaultVXLANPort = 4789
	// VXLANOverhead is what VXLAN over IPv4 adds to a guest frame (bytes):
	// outer IPv4 20, UDP 8, VXLAN 8, inner Ethernet 14.
	VXLANOverhead = 50
	// AliasPrefix starts the ifalias of every interface of slurm-microvm.
	AliasPrefix = "slurm-microvm "
	// TablePrefix starts the name of every nftables table of slurm-microvm.
	TablePrefix = "slurm-microvm_"
	// maxNodeName bounds a node name so that the alias (IFALIASZ 256) and
	// the table name (NFT_NAME_MAXLEN 256) always fit.
	maxNodeName = 128
)

// DefaultUserSubnet is where User mode's veth pairs take their /30.
var DefaultUserSubnet = netip.MustParsePrefix("100.64.0.0/16")

// userGuest is QEMU slirp's fixed guest side (QEMU docs, -netdev user:
// net=10.0.2.0/24, host=10.0.2.2, dns=10.0.2.3, first address 10.0.2.15).
var (
	userGuestAddr = netip.MustParsePrefix("10.0.2.15/24")
	userGateway   = netip.MustParseAddr("10.0.2.2")
	userDNS       = netip.MustParseAddr("10.0.2.3")
)

// privateRanges are what a User mode guest may not reach unless allowed:
// RFC 1918, RFC 6598 shared space, link-local, loopback.
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("127.0.0.0/8"),
}

// nodeNameRE is the node names accepted (Slurm host names; the table
// name puts the node last so that it parses whatever dots and dashes it has).
var nodeNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// stepID is "<job>.<step>.<restart>", as in the state directory's name.
func stepID(job, step, restart uint32) string {
	return fmt.Sprintf("%d.%d.%d", job, step, restart)
}

// VNI is the step's VXLAN network identifier: the first three bytes of
// SHA-256 of the ASCII "<job>.<step>.<restart>", big-endian, with 0
// taken as 1 (0 is valid VXLAN but reads as "no segment" in captures).
// Every node computes the same. Shell:
//
//	printf %s 1234.0.0 | sha256sum | cut -c1-6   # hex VNI
func VNI(job, step, restart uint32) uint32 {
	h := sha256.Sum256([]byte(stepID(job, step, restart)))
	v := uint32(h[0])<<16 | uint32(h[1])<<8 | uint32(h[2])
	if v == 0 {
		v = 1
	}
	return v
}

// NamesFor derives the host-side names of a step on a node: "smv", the
// first 8 hex digits of SHA-256 of "<node> <job>.<step>.<restart>", and
// a role letter (b bridge, x VXLAN, t tap, v veth): 12 bytes, under
// IFNAMSIZ-1 (15). The alias is "slurm-microvm <node> <job>.<step>.<restart>";
// the table "slurm-microvm_<job>.<step>.<restart>_<node>". Shell:
//
//	printf %s 'node1 1234.0.0' | sha256sum | cut -c1-8
func NamesFor(node string, job, step, restart uint32) Names {
	id := stepID(job, step, restart)
	h := sha256.Sum256([]byte(node + " " + id))
	base := "smv" + hex.EncodeToString(h[:4])
	return Names{
		Bridge: base + "b",
		VXLAN:  base + "x",
		Tap:    base + "t",
		Veth:   base + "v",
		Table:  TablePrefix + id + "_" + node,
		Alias:  AliasPrefix + node + " " + id,
	}
}

// owner is what an alias or table name says: the node and the step.
type owner struct {
	node               string
	job, step, restart uint32
}

// parseID reads "<job>.<step>.<restart>".
func parseID(s string) (job, step, restart uint32, ok bool) {
	f := strings.Split(s, ".")
	if len(f) != 3 {
		return 0, 0, 0, false
	}
	var v [3]uint32
	for i, x := range f {
		n, err := strconv.ParseUint(x, 10, 32)
		if err != nil {
			return 0, 0, 0, false
		}
		v[i] = uint32(n)
	}
	return v[0], v[1], v[2], true
}

// parseAlias reads an alias NamesFor made.
func parseAlias(alias string) (owner, bool) {
	rest, ok := strings.CutPrefix(alias, AliasPrefix)
	if !ok {
		return owner{}, false
	}
	node, id, ok := strings.Cut(rest, " ")
	if !ok || !nodeNameRE.MatchString(node) {
		return owner{}, false
	}
	j, s, r, ok := parseID(id)
	return owner{node, j, s, r}, ok
}

// parseTable reads a table name NamesFor made.
func parseTable(name string) (owner, bool) {
	rest, ok := strings.CutPrefix(name, TablePrefix)
	if !ok {
		return owner{}, false
	}
	id, node, ok := strings.Cut(rest, "_")
	if !ok || !nodeNameRE.MatchString(node) {
		return owner{}, false
	}
	j, s, r, ok := parseID(id)
	return owner{node, j, s, r}, ok
}

// ifnameRE is the interface names NamesFor makes.
var ifnameRE = regexp.MustCompile(`^smv[0-9a-f]{8}[bxtv]$`)

// Leftover tells whether an interface (by name and ifalias) or an
// nftables table (by name, alias "") belongs to some step of
// slurm-microvm: the test residue checks use it.
func Leftover(name, alias string) bool {
	if _, ok := parseAlias(alias); ok {
		return true
	}
	if _, ok := parseTable(name); ok {
		return true
	}
	return ifnameRE.MatchString(name)
}

// MACOf is the MAC of a guest (or a bridge) with IPv4 address a:
// 02:4d:<the four bytes of a>, locally administered and unicast, so a
// capture shows the address in the MAC.
func MACOf(a netip.Addr) [6]byte {
	b := a.As4()
	return [6]byte{0x02, 0x4d, b[0], b[1], b[2], b[3]}
}

// addrAt is base + n inside p, or false past p's last usable address
// (the broadcast address is not used).
func addrAt(p netip.Prefix, n uint32) (netip.Addr, bool) {
	b := p.Masked().Addr().As4()
	base := binary.BigEndian.Uint32(b[:])
	size := uint64(1) << (32 - p.Bits())
	if uint64(n) >= size-1 {
		return netip.Addr{}, false
	}
	var o [4]byte
	binary.BigEndian.PutUint32(o[:], base+n)
	return netip.AddrFrom4(o), true
}

// NewPlan computes one node's plan. Every node of the step computes the
// same VNI, addresses and MACs from the same request. Errors name the
// Request field and the rule broken.
func NewPlan(r Request) (*Plan, error) {
	switch r.Mode {
	case None:
		return &Plan{Mode: None, Names: NamesFor(r.Node, r.Job, r.Step, r.Restart)}, nil
	case Step, User:
	default:
		return nil, fmt.Errorf("network: Request.Mode %q: must be %q, %q or %q", r.Mode, None, Step, User)
	}
	if err := checkNodeName("Request.Node", r.Node); err != nil {
		return nil, err
	}
	if r.MTU != 0 && (r.MTU < 576 || r.MTU > 65535) {
		return nil, fmt.Errorf("network: Request.MTU %d: must be 0 (the underlay's less %d) or 576..65535", r.MTU, VXLANOverhead)
	}
	self := -1
	seenName := map[string]bool{}
	seenAddr := map[netip.Addr]string{}
	for i, n := range r.Nodes {
		field := fmt.Sprintf("Request.Nodes[%d]", i)
		if err := checkNodeName(field+".Name", n.Name); err != nil {
			return nil, err
		}
		if seenName[n.Name] {
			return nil, fmt.Errorf("network: %s.Name %q: listed twice; each node of the step once", field, n.Name)
		}
		seenName[n.Name] = true
		if !n.Addr.Is4() {
			return nil, fmt.Errorf("network: %s.Addr %v (node %s): must be an IPv4 address (the node's NodeAddr on the network between nodes)", field, n.Addr, n.Name)
		}
		if o, dup := seenAddr[n.Addr]; dup {
			return nil, fmt.Errorf("network: %s.Addr %v: nodes %s and %s have the same address; each node needs its own underlay address", field, n.Addr, o, n.Name)
		}
		seenAddr[n.Addr] = n.Name
		if n.Name == r.Node {
			self = i
		}
	}
	if self < 0 {
		return nil, fmt.Errorf("network: Request.Node %q is not among Request.Nodes (%d nodes): the step's node list must hold this node", r.Node, len(r.Nodes))
	}
	p := &Plan{
		Mode:     r.Mode,
		Names:    NamesFor(r.Node, r.Job, r.Step, r.Restart),
		VNI:      VNI(r.Job, r.Step, r.Restart),
		Underlay: r.Nodes[self].Addr,
		MTU:      r.MTU,
	}
	if r.Mode == User {
		return userPlan(r, p)
	}
	if len(r.UserAllow) > 0 || r.UserSubnet.IsValid() {
		return nil, fmt.Errorf("network: Request.UserSubnet/UserAllow are for mode %q, not %q", User, r.Mode)
	}
	p.VXLANPort = r.VXLANPort
	if p.VXLANPort == 0 {
		p.VXLANPort = DefaultVXLANPort
	}
	if !r.Subnet.IsValid() || !r.Subnet.Addr().Is4() || r.Subnet != r.Subnet.Masked() || r.Subnet.Bits() > 30 {
		return nil, fmt.Errorf("network: Request.Subnet %v: must be an IPv4 network in masked form of at most /30 (e.g. 10.224.0.0/16)", r.Subnet)
	}
	for i, s := range r.Services {
		field := fmt.Sprintf("Request.Services[%d]", i)
		if !s.Prefix.IsValid() || !s.Prefix.Addr().Is4() || s.Prefix != s.Prefix.Masked() {
			return nil, fmt.Errorf("network: %s.Prefix %v: must be an IPv4 prefix in masked form (a /32 for one host)", field, s.Prefix)
		}
		if s.Prefix.Overlaps(r.Subnet) {
			return nil, fmt.Errorf("network: %s.Prefix %v overlaps Request.Subnet %v: a service must lie outside the guests' subnet", field, s.Prefix, r.Subnet)
		}
		if s.Proto != "tcp" && s.Proto != "udp" {
			return nil, fmt.Errorf("network: %s.Proto %q: must be \"tcp\" or \"udp\"", field, s.Proto)
		}
	}
	p.Services = append([]Service(nil), r.Services...)

	guest := func(i int) (netip.Addr, error) {
		a, ok := addrAt(r.Subnet, uint32(i)+2)
		if !ok {
			return netip.Addr{}, fmt.Errorf("network: Request.Subnet %v holds %d guests (base+2 up to the last before broadcast), the step has %d nodes: use a larger subnet",
				r.Subnet, (uint64(1)<<(32-r.Subnet.Bits()))-3, len(r.Nodes))
		}
		return a, nil
	}
	self4, err := guest(self)
	if err != nil {
		return nil, err
	}
	gw, _ := addrAt(r.Subnet, 1)
	g := driver.GuestNetwork{
		MAC:  MACOf(self4),
		Addr: netip.PrefixFrom(self4, r.Subnet.Bits()),
		MTU:  r.MTU,
	}
	for i, n := range r.Nodes {
		a, err := guest(i)
		if err != nil {
			return nil, err
		}
		g.Hosts = append(g.Hosts, driver.HostEntry{Addr: a, Names: []string{n.Name}})
		if i == self {
			continue
		}
		mac := MACOf(a)
		p.Peers = append(p.Peers, Peer{Node: n.Name, Underlay: n.Addr, Guest: a, MAC: mac})
		g.Neighbors = append(g.Neighbors, driver.Neighbor{Addr: a, MAC: mac})
	}
	if len(r.Services) > 0 {
		g.Gateway = gw
		g.Neighbors = append(g.Neighbors, driver.Neighbor{Addr: gw, MAC: MACOf(gw)})
	}
	p.Guest = g
	return p, nil
}

// userPlan fills p for User mode: QEMU slirp's guest side, the veth's
// subnet and the destinations dropped.
func userPlan(r Request, p *Plan) (*Plan, error) {
	if len(r.Services) > 0 {
		return nil, fmt.Errorf("network: Request.Services: mode %q has no services (its guest reaches what the NAT reaches); list them for mode %q", User, Step)
	}
	p.UserSubnet = r.UserSubnet
	if !p.UserSubnet.IsValid() {
		p.UserSubnet = DefaultUserSubnet
	}
	if !p.UserSubnet.Addr().Is4() || p.UserSubnet != p.UserSubnet.Masked() || p.UserSubnet.Bits() > 30 {
		return nil, fmt.Errorf("network: Request.UserSubnet %v: must be an IPv4 network in masked form of at most /30 (default %v)", r.UserSubnet, DefaultUserSubnet)
	}
	for i, a := range r.UserAllow {
		if !a.IsValid() || !a.Addr().Is4() || a != a.Masked() {
			return nil, fmt.Errorf("network: Request.UserAllow[%d] %v: must be an IPv4 prefix in masked form", i, a)
		}
	}
	p.UserAllow = append([]netip.Prefix(nil), r.UserAllow...)
	p.UserBlocked = append([]netip.Prefix(nil), privateRanges...)
	for _, n := range r.Nodes {
		p.UserBlocked = append(p.UserBlocked, netip.PrefixFrom(n.Addr, 32))
	}
	p.UserBlocked = append(p.UserBlocked, p.UserSubnet)
	mtu := r.MTU
	if mtu == 0 {
		mtu = 1500 // slirp's own default; the NAT re-segments
	}
	p.MTU = mtu
	p.Guest = driver.GuestNetwork{
		MAC:     MACOf(userGuestAddr.Addr()),
		Addr:    userGuestAddr,
		MTU:     mtu,
		Gateway: userGateway,
		DNS:     []netip.Addr{userDNS},
		Hosts:   []driver.HostEntry{{Addr: userGuestAddr.Addr(), Names: []string{r.Node}}},
	}
	return p, nil
}

func checkNodeName(field, name string) error {
	if name == "" || len(name) > maxNodeName || !nodeNameRE.MatchString(name) {
		return fmt.Errorf("network: %s %q: a node name is 1 to %d of [A-Za-z0-9._-]", field, name, maxNodeName)
	}
	return nil
}
