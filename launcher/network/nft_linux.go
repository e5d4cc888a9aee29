package network

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Rule building blocks. Every expression uses register 1 (NFT_REG_1).

func ifnameData(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func iif(name string) []expr.Any { return metaCmp(expr.MetaKeyIIFNAME, expr.CmpOpEq, ifnameData(name)) }
func oif(name string) []expr.Any { return metaCmp(expr.MetaKeyOIFNAME, expr.CmpOpEq, ifnameData(name)) }
func notOif(name string) []expr.Any {
	return metaCmp(expr.MetaKeyOIFNAME, expr.CmpOpNeq, ifnameData(name))
}

func metaCmp(key expr.MetaKey, op expr.CmpOp, data []byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: data}}
}

func payloadCmp(base expr.PayloadBase, off, n uint32, op expr.CmpOp, data []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: base, Offset: off, Len: n},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

// etherType matches the Ethernet header's type (bridge family).
func etherType(t uint16) []expr.Any {
	return payloadCmp(expr.PayloadBaseLLHeader, 12, 2, expr.CmpOpEq, binary.BigEndian.AppendUint16(nil, t))
}

// ipv4 matches IPv4 packets in the inet family.
func ipv4() []expr.Any {
	return metaCmp(expr.MetaKeyNFPROTO, expr.CmpOpEq, []byte{unix.NFPROTO_IPV4})
}

// ipPrefix matches the IPv4 header's source (off 12) or destination
// (off 16) against p.
func ipPrefix(off uint32, p netip.Prefix) []expr.Any {
	a := p.Masked().Addr().As4()
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
	}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func join(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// fence holds one step's tables while they are being built.
type fence struct {
	c      *nftables.Conn
	table  *nftables.Table
	chains map[string]*nftables.Chain
}

func (f *fence) chain(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	ch := f.c.AddChain(&nftables.Chain{Name: name, Table: f.table, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept})
	f.chains[name] = ch
	return ch
}

func (f *fence) rule(ch *nftables.Chain, e ...expr.Any) {
	f.c.AddRule(&nftables.Rule{Table: f.table, Chain: ch, Exprs: append([]expr.Any{&expr.Counter{}}, e...)})
}

func newFence(c *nftables.Conn, fam nftables.TableFamily, name string) *fence {
	return &fence{c: c, table: c.AddTable(&nftables.Table{Family: fam, Name: name}), chains: map[string]*nftables.Chain{}}
}

// arpEthIPv4 is the fixed start of an ARP packet for Ethernet and IPv4
// (RFC 826: htype 1, ptype 0x0800, hlen 6, plen 4).
var arpEthIPv4 = []byte{0, 1, 8, 0, 6, 4}

// bridgeFence adds the step's bridge-family table: frames entering from
// the tap must carry the guest's MAC and address and be IPv4 or ARP;
// frames entering from the VXLAN device must come from a peer's MAC.
func bridgeFence(c *nftables.Conn, p *Plan) error {
	f := newFence(c, nftables.TableFamilyBridge, p.Names.Table)
	// -200: NF_BR_PRI_FILTER_BRIDGED, before br_netfilter (0) hands
	// frames to the inet hooks.
	ch := f.chain("guest", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityRef(-200))
	tap := p.Names.Tap
	mac := p.Guest.MAC
	g := p.Guest.Addr.Addr().As4()
	// Every rule names the tap; what passes is the guest's MAC with the
	// guest's IPv4 address, or ARP for Ethernet/IPv4 whose sender is the
	// guest; the rest from the tap (IPv6, VLAN tags, other types) drops.
	f.rule(ch, join(iif(tap), payloadCmp(expr.PayloadBaseLLHeader, 6, 6, expr.CmpOpNeq, mac[:]), []expr.Any{verdict(expr.VerdictDrop)})...)
	f.rule(ch, join(iif(tap), etherType(unix.ETH_P_IP),
		payloadCmp(expr.PayloadBaseNetworkHeader, 12, 4, expr.CmpOpEq, g[:]), []expr.Any{verdict(expr.VerdictAccept)})...)
	f.rule(ch, join(iif(tap), etherType(unix.ETH_P_ARP),
		payloadCmp(expr.PayloadBaseNetworkHeader, 0, 6, expr.CmpOpEq, arpEthIPv4),
		payloadCmp(expr.PayloadBaseNetworkHeader, 8, 6, expr.CmpOpEq, mac[:]),
		payloadCmp(expr.PayloadBaseNetworkHeader, 14, 4, expr.CmpOpEq, g[:]), []expr.Any{verdict(expr.VerdictAccept)})...)
	f.rule(ch, join(iif(tap), []expr.Any{verdict(expr.VerdictDrop)})...)

	peers := &nftables.Set{Table: f.table, Name: "peers", KeyType: nftables.TypeEtherAddr}
	var elems []nftables.SetElement
	for _, pr := range p.Peers {
		elems = append(elems, nftables.SetElement{Key: append([]byte(nil), pr.MAC[:]...)})
	}
	if err := c.AddSet(peers, elems); err != nil {
		return fmt.Errorf("network: nftables set %s of table bridge %s: %w", peers.Name, p.Names.Table, err)
	}
	f.rule(ch, join(iif(p.Names.VXLAN), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
		&expr.Lookup{SourceRegister: 1, SetName: peers.Name, SetID: peers.ID, Invert: true},
		verdict(expr.VerdictDrop),
	})...)
	return nil
}

// stepInetFence adds the step's inet table: nothing from the bridge to
// the host; forwarding from the bridge only to the services (and
// masqueraded); toward the bridge only replies.
func stepInetFence(c *nftables.Conn, p *Plan) {
	f := newFence(c, nftables.TableFamilyINet, p.Names.Table)
	br := p.Names.Bridge
	in := f.chain("input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
	// The ports too: frames to a link-local group MAC (01:80:c2:00:00:0X)
	// skip the bridge's hooks and reach the port's own stack.
	for _, dev := range []string{br, p.Names.Tap, p.Names.VXLAN} {
		f.rule(in, join(iif(dev), []expr.Any{verdict(expr.VerdictDrop)})...)
	}

	underlayFence(f, in, p)

	fw := f.chain("forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
	for _, dev := range []string{p.Names.Tap, p.Names.VXLAN} {
		f.rule(fw, join(iif(dev), []expr.Any{verdict(expr.VerdictDrop)})...)
	}
	// Bridged traffic seen here through br_netfilter enters and leaves
	// by the bridge: the bridge-family table fenced it already.
	f.rule(fw, join(iif(br), oif(br), []expr.Any{verdict(expr.VerdictAccept)})...)
	if len(p.Services) > 0 {
		// Each flow to a service is a conntrack entry of the node's
		// namespace, whose table slurmd's connections share: a step
		// holds at most MaxServiceConns at a time.
		f.rule(fw, join(iif(br), []expr.Any{
			&expr.Connlimit{Count: MaxServiceConns, Flags: expr.NFT_CONNLIMIT_F_INV},
			verdict(expr.VerdictDrop),
		})...)
	}
	for _, s := range p.Services {
		e := join(iif(br), ipv4(), ipPrefix(16, s.Prefix))
		proto := byte(unix.IPPROTO_TCP)
		if s.Proto == "udp" {
			proto = unix.IPPROTO_UDP
		}
		e = join(e, metaCmp(expr.MetaKeyL4PROTO, expr.CmpOpEq, []byte{proto}))
		if s.Port != 0 {
			e = join(e, payloadCmp(expr.PayloadBaseTransportHeader, 2, 2, expr.CmpOpEq, binary.BigEndian.AppendUint16(nil, s.Port)))
		}
		f.rule(fw, append(e, verdict(expr.VerdictAccept))...)
	}
	f.rule(fw, join(iif(br), []expr.Any{verdict(expr.VerdictDrop)})...)
	replyOnly(f, fw, br)

	if len(p.Services) > 0 {
		nat := f.chain("postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
		f.rule(nat, join(iif(br), notOif(br), ipv4(), ipPrefix(12, p.Guest.Addr.Masked()), []expr.Any{&expr.Masq{}})...)
	}
}

// MaxServiceConns bounds the connections one step's guests hold open to
// the services at a time (nftables connlimit; more are dropped).
const MaxServiceConns = 4096

// vxlanToPort matches IPv4 UDP to the underlay's VXLAN port.
func vxlanToPort(port uint16) []expr.Any {
	return join(ipv4(), metaCmp(expr.MetaKeyL4PROTO, expr.CmpOpEq, []byte{unix.IPPROTO_UDP}),
		payloadCmp(expr.PayloadBaseTransportHeader, 2, 2, expr.CmpOpEq, binary.BigEndian.AppendUint16(nil, port)))
}

// underlayFence guards the step's VXLAN segment on the underlay, which the
// kernel does not: it checks neither a packet's outer source address nor
// its port, so anyone who can send UDP to the node's VXLAN port could put
// frames on the segment (the VNI and the guests' MACs follow from the job
// id). Input: VXLAN packets carrying the step's VNI (the header's bytes
// 4-6, after the 8-byte UDP header) only from the step's other nodes.
// Output: while the step runs, no process but root's (the kernel's VXLAN
// socket is root's) sends to the VXLAN port from this node, so a user on a
// peer node cannot forge a peer's packets either.
func underlayFence(f *fence, in *nftables.Chain, p *Plan) {
	vni := []byte{byte(p.VNI >> 16), byte(p.VNI >> 8), byte(p.VNI)}
	ours := join(vxlanToPort(p.VXLANPort), payloadCmp(expr.PayloadBaseTransportHeader, 12, 3, expr.CmpOpEq, vni))
	for _, peer := range p.Peers {
		f.rule(in, join(ours, ipPrefix(12, netip.PrefixFrom(peer.Underlay, 32)), []expr.Any{verdict(expr.VerdictAccept)})...)
	}
	f.rule(in, join(ours, []expr.Any{verdict(expr.VerdictDrop)})...)
	out := f.chain("output", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter)
	f.rule(out, join(vxlanToPort(p.VXLANPort), metaCmp(expr.MetaKeySKUID, expr.CmpOpNeq, []byte{0, 0, 0, 0}), []expr.Any{verdict(expr.VerdictDrop)})...)
}

// replyOnly lets toward dev only what belongs to a connection the other
// side opened.
func replyOnly(f *fence, fw *nftables.Chain, dev string) {
	f.rule(fw, join(oif(dev), []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED),
			Xor:  []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
		verdict(expr.VerdictAccept),
	})...)
	f.rule(fw, join(oif(dev), []expr.Any{verdict(expr.VerdictDrop)})...)
}

// userInetFence adds User mode's inet table for the veth's host end.
func userInetFence(c *nftables.Conn, p *Plan, slot netip.Prefix) {
	f := newFence(c, nftables.TableFamilyINet, p.Names.Table)
	v := p.Names.Veth
	in := f.chain("input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
	f.rule(in, join(iif(v), []expr.Any{verdict(expr.VerdictDrop)})...)

	fw := f.chain("forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
	// Never the VXLAN port of any node, allowed destinations included: a
	// masqueraded packet leaves with the node's address, which the other
	// nodes' underlay fences trust.
	port := p.VXLANPort
	if port == 0 {
		port = DefaultVXLANPort
	}
	f.rule(fw, join(iif(v), vxlanToPort(port), []expr.Any{verdict(expr.VerdictDrop)})...)
	for _, a := range p.UserAllow {
		f.rule(fw, join(iif(v), ipv4(), ipPrefix(16, a), []expr.Any{verdict(expr.VerdictAccept)})...)
	}
	for _, b := range p.UserBlocked {
		f.rule(fw, join(iif(v), ipv4(), ipPrefix(16, b), []expr.Any{verdict(expr.VerdictDrop)})...)
	}
	f.rule(fw, join(iif(v), ipv4(), []expr.Any{verdict(expr.VerdictAccept)})...)
	f.rule(fw, join(iif(v), []expr.Any{verdict(expr.VerdictDrop)})...) // IPv6 and the rest
	replyOnly(f, fw, v)

	nat := f.chain("postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
	f.rule(nat, join(iif(v), notOif(v), ipv4(), ipPrefix(12, slot), []expr.Any{&expr.Masq{}})...)
}
