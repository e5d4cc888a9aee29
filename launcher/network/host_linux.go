package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
)

// procSys is where the per-namespace sysctls are read and the
// per-device IPv6 switch is written.
const procSys = "/proc/sys/net"

// Close releases the files the attachment holds (not the host objects:
// Teardown removes those). A non-persistent tap disappears once the VMM
// has closed its copy too; User mode's namespace once the VMM has left it.
func (a *Attachment) Close() error {
	if a == nil || a.Network == nil {
		return nil
	}
	var errs []error
	if a.Network.Tap != nil {
		errs = append(errs, a.Network.Tap.Close())
		a.Network.Tap = nil
	}
	if a.Network.NetNS != nil {
		errs = append(errs, a.Network.NetNS.Close())
		a.Network.NetNS = nil
	}
	return errors.Join(errs...)
}

// Setup creates this node's host side of the plan in the caller's
// network namespace, as root: in Step mode the bridge, VXLAN device,
// tap, forwarding entries and nftables fence; in User mode a namespace
// of the step's own, a veth pair into it and the fence. None mode makes
// nothing. On error nothing of it is left and the error names what
// failed; objects of the step already there (a crashed run) are an error
// that says to run gc, and are not touched.
//
// Setup must run on one OS thread in the namespace it configures (the
// launcher's process is in the node's namespace; tests lock their thread).
func Setup(ctx context.Context, p *Plan, log *slog.Logger) (*Attachment, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch p.Mode {
	case None:
		return &Attachment{Names: p.Names}, nil
	case Step, User:
	default:
		return nil, fmt.Errorf("network: plan mode %q: must be %q, %q or %q", p.Mode, None, Step, User)
	}
	if err := leftBehind(p.Names); err != nil {
		return nil, err
	}
	if p.Mode == User || len(p.Services) > 0 {
		if err := needForwarding(p); err != nil {
			return nil, err
		}
	}
	var a *Attachment
	var err error
	if p.Mode == User {
		a, err = setupUser(ctx, p)
	} else {
		a, err = setupStep(ctx, p)
	}
	if err != nil {
		a.Close()
		if terr := Teardown(context.WithoutCancel(ctx), p.Names); terr != nil {
			err = fmt.Errorf("%w (and undoing: %v)", err, terr)
		}
		return nil, err
	}
	log.Info("step network set up", "mode", p.Mode, "alias", p.Names.Alias, "vni", p.VNI,
		"bridge", p.Names.Bridge, "tap", p.Names.Tap, "veth", p.Names.Veth, "table", p.Names.Table,
		"guest", a.Network.Guest.Addr, "mtu", a.Network.Guest.MTU)
	return a, nil
}

// leftBehind refuses a step whose objects already exist on this node.
func leftBehind(n Names) error {
	for _, name := range []string{n.Bridge, n.VXLAN, n.Tap, n.Veth} {
		if _, err := netlink.LinkByName(name); err == nil {
			return fmt.Errorf("network: interface %s of step %q already exists (left by an earlier run of the step): run `slurm-microvm gc` on this node", name, n.Alias)
		} else if !isNotFound(err) {
			return fmt.Errorf("network: looking up interface %s: %w", name, err)
		}
	}
	tables, err := listTables()
	if err != nil {
		return err
	}
	for _, t := range tables {
		if t.Name == n.Table {
			return fmt.Errorf("network: nftables table %s (family %s) of step %q already exists: run `slurm-microvm gc` on this node", t.Name, FamilyName(t.Family), n.Alias)
		}
	}
	return nil
}

// needForwarding refuses Services and User mode when the namespace does
// not forward IPv4: the launcher never changes host-wide sysctls.
func needForwarding(p *Plan) error {
	b, err := os.ReadFile(filepath.Join(procSys, "ipv4/ip_forward"))
	if err != nil {
		return fmt.Errorf("network: reading net.ipv4.ip_forward: %w", err)
	}
	if strings.TrimSpace(string(b)) != "1" {
		why := "[network] services are listed"
		if p.Mode == User {
			why = "mode \"user\" is asked for"
		}
		return fmt.Errorf("network: net.ipv4.ip_forward is 0 on this node but %s, which need IPv4 forwarding: set net.ipv4.ip_forward=1 (sysctl.d) or drop them; the launcher never changes host-wide sysctls", why)
	}
	return nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// underlayMTU is the MTU of the device holding addr in this namespace.
func underlayMTU(addr netip.Addr) (int, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return 0, fmt.Errorf("network: listing addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
			l, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				return 0, fmt.Errorf("network: device of underlay address %v: %w", addr, err)
			}
			return l.Attrs().MTU, nil
		}
	}
	return 0, fmt.Errorf("network: underlay address %v (this node's entry in the step's nodes, Slurm's NodeAddr) is on no interface of this node's network namespace: give the node its NodeAddr or fix NodeAddr in slurm.conf", addr)
}

// disableIPv6 turns IPv6 off on one device (a per-device sysctl, not a
// host-wide one), so that it never gets a link-local address the guest
// could reach. A kernel without IPv6 has nothing to turn off.
func disableIPv6(dev string) error {
	path := filepath.Join(procSys, "ipv6/conf", dev, "disable_ipv6")
	if _, err := os.Stat(filepath.Join(procSys, "ipv6")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("network: disabling IPv6 on %s: %w", dev, err)
	}
	return nil
}

// writeSys writes a per-device sysctl under /proc/sys/net.
func writeSys(path, val string) error {
	if err := os.WriteFile(filepath.Join(procSys, path), []byte(val), 0o644); err != nil {
		return fmt.Errorf("network: setting net.%s=%s: %w", strings.ReplaceAll(path, "/", "."), val, err)
	}
	return nil
}

// fenceBridgePort turns learning and every kind of flooding off on a
// bridge port: frames go only where a static entry sends them.
func fenceBridgePort(l netlink.Link) error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_BRIDGE)
	msg.Index = int32(l.Attrs().Index)
	req.AddData(msg)
	br := nl.NewRtAttr(unix.IFLA_PROTINFO|unix.NLA_F_NESTED, nil)
	for _, attr := range []int{nl.IFLA_BRPORT_LEARNING, nl.IFLA_BRPORT_UNICAST_FLOOD, nl.IFLA_BRPORT_MCAST_FLOOD, nl.IFLA_BRPORT_BCAST_FLOOD} {
		br.AddRtAttr(attr, []byte{0})
	}
	req.AddData(br)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("network: turning learning and flooding off on bridge port %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// openTap creates the non-persistent tap name (IFF_TAP|IFF_NO_PI): it
// exists while a file of it is open, so a killed VMM leaves none.
func openTap(name string) (*os.File, error) {
	// Opened non-blocking and made an *os.File after TUNSETIFF: an
	// unattached tun fd cannot join the poller, an attached one can, so
	// the file supports deadlines (the VMM sets its own flags on its copy).
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("network: opening /dev/net/tun for tap %s: %w", name, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("network: tap name %s: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("network: creating tap %s (TUNSETIFF on /dev/net/tun): %w", name, err)
	}
	return os.NewFile(uintptr(fd), "tap "+name), nil
}

func hw(m [6]byte) net.HardwareAddr { return net.HardwareAddr(append([]byte(nil), m[:]...)) }

// setupStep makes Step mode's objects. On error the caller tears down
// by name; the returned attachment (possibly partial) is closed.
func setupStep(ctx context.Context, p *Plan) (*Attachment, error) {
	a := &Attachment{Names: p.Names, Network: &driver.Network{Guest: p.Guest}}
	n := p.Names
	mtu := p.MTU
	under, err := underlayMTU(p.Underlay)
	if err != nil {
		return a, err
	}
	if mtu == 0 {
		mtu = under - VXLANOverhead
	} else if mtu > under-VXLANOverhead {
		return a, fmt.Errorf("network: guest MTU %d ([network] mtu) exceeds the underlay's %d less VXLAN's %d bytes: set at most %d or 0", mtu, under, VXLANOverhead, under-VXLANOverhead)
	}
	if mtu < 576 {
		return a, fmt.Errorf("network: the underlay device of %v has MTU %d, which leaves the guest %d (< 576) after VXLAN's %d bytes", p.Underlay, under, mtu, VXLANOverhead)
	}
	a.Network.Guest.MTU = mtu
	gw, _ := addrAt(p.Guest.Addr.Masked(), 1)
	if len(p.Services) > 0 {
		if err := gatewayFree(gw, n); err != nil {
			return a, err
		}
	}
	if err := ctx.Err(); err != nil {
		return a, err
	}

	// Bridge: MAC 02:4d:<gateway>, no address unless services.
	// No multicast snooping: a guest's IGMP joins would make forwarding
	// entries; every frame follows the static entries only.
	snoop := false
	bridge := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: n.Bridge, MTU: mtu, HardwareAddr: hw(MACOf(gw))}, MulticastSnooping: &snoop}
	if err := netlink.LinkAdd(bridge); err != nil {
		return a, fmt.Errorf("network: creating bridge %s of step %q: %w", n.Bridge, n.Alias, err)
	}
	br, err := netlink.LinkByName(n.Bridge)
	if err != nil {
		return a, fmt.Errorf("network: bridge %s: %w", n.Bridge, err)
	}
	if err := prepare(br, n.Alias, mtu); err != nil {
		return a, err
	}

	// VXLAN: the step's VNI, no learning, no group, static FDB only.
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: n.VXLAN, MTU: mtu},
		VxlanId:   int(p.VNI),
		SrcAddr:   net.IP(p.Underlay.AsSlice()),
		Port:      int(p.VXLANPort),
		Learning:  false,
	}
	if err := netlink.LinkAdd(vx); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return a, vniCollision(p, err)
		}
		return a, fmt.Errorf("network: creating VXLAN device %s (VNI %d, port %d) of step %q: %w", n.VXLAN, p.VNI, p.VXLANPort, n.Alias, err)
	}
	vxl, err := netlink.LinkByName(n.VXLAN)
	if err != nil {
		return a, fmt.Errorf("network: VXLAN device %s: %w", n.VXLAN, err)
	}
	if err := prepare(vxl, n.Alias, mtu); err != nil {
		return a, err
	}

	tap, err := openTap(n.Tap)
	if err != nil {
		return a, err
	}
	a.Network.Tap = tap
	tl, err := netlink.LinkByName(n.Tap)
	if err != nil {
		return a, fmt.Errorf("network: tap %s: %w", n.Tap, err)
	}
	if err := prepare(tl, n.Alias, mtu); err != nil {
		return a, err
	}

	for _, l := range []netlink.Link{vxl, tl} {
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return a, fmt.Errorf("network: adding %s to bridge %s: %w", l.Attrs().Name, n.Bridge, err)
		}
		if err := fenceBridgePort(l); err != nil {
			return a, err
		}
	}
	// Static forwarding: the guest's MAC on the tap port; each peer's
	// MAC on the VXLAN port (bridge) and at the peer's underlay (VXLAN).
	if err := fdb(tl, p.Guest.MAC, netip.Addr{}); err != nil {
		return a, err
	}
	for _, pr := range p.Peers {
		if err := fdb(vxl, pr.MAC, pr.Underlay); err != nil {
			return a, fmt.Errorf("%w (peer %s)", err, pr.Node)
		}
	}
	// The host answers no ARP on the bridge (the guest has the gateway
	// as a permanent neighbour); a per-device sysctl, not a host-wide one.
	// The ports too: ARP to a link-local group MAC skips the bridge and
	// reaches the port's own ARP (replies, neighbour entries).
	for _, dev := range []string{n.Bridge, n.Tap, n.VXLAN} {
		if err := writeSys(filepath.Join("ipv4/conf", dev, "arp_ignore"), "8"); err != nil {
			return a, err
		}
	}
	// Strict reverse-path filtering on the ports drops IPv4 that reaches
	// their own stack that way (nothing routes via a port), whatever the
	// host's default (0 in a fresh namespace, often on multi-rail nodes).
	for _, dev := range []string{n.Tap, n.VXLAN} {
		if err := writeSys(filepath.Join("ipv4/conf", dev, "rp_filter"), "1"); err != nil {
			return a, err
		}
	}
	if len(p.Services) > 0 {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(gw.AsSlice()), Mask: net.CIDRMask(p.Guest.Addr.Bits(), 32)}}
		if err := netlink.AddrAdd(br, addr); err != nil {
			return a, fmt.Errorf("network: adding gateway %v to bridge %s: %w", gw, n.Bridge, err)
		}
		// Replies from the services reach the guest without ARP.
		ne := &netlink.Neigh{LinkIndex: br.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: net.IP(p.Guest.Addr.Addr().AsSlice()), HardwareAddr: hw(p.Guest.MAC)}
		if err := netlink.NeighSet(ne); err != nil {
			return a, fmt.Errorf("network: neighbour %v on bridge %s: %w", p.Guest.Addr.Addr(), n.Bridge, err)
		}
	}

	c, err := nftables.New()
	if err != nil {
		return a, fmt.Errorf("network: nftables: %w", err)
	}
	if err := bridgeFence(c, p); err != nil {
		return a, err
	}
	stepInetFence(c, p)
	if err := c.Flush(); err != nil {
		return a, fmt.Errorf("network: adding nftables tables bridge and inet %s: %w", n.Table, err)
	}

	for _, l := range []netlink.Link{br, vxl, tl} {
		if err := netlink.LinkSetUp(l); err != nil {
			return a, fmt.Errorf("network: setting %s up: %w", l.Attrs().Name, err)
		}
	}
	return a, waitOperUp(ctx, n.Bridge, 5*time.Second)
}

// waitOperUp waits until the kernel's link watcher has seen the carrier
// of dev (operstate up): until then the bridge's transmit queue is the
// no-op one and frames the host sends to the guest are dropped.
func waitOperUp(ctx context.Context, dev string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("network: %s: %w", dev, err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("network: %s is not operationally up after %v (operstate %s)", dev, limit, l.Attrs().OperState)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// prepare gives a new interface of the step its alias and MTU and turns
// its IPv6 off, before it is up.
func prepare(l netlink.Link, alias string, mtu int) error {
	name := l.Attrs().Name
	if err := netlink.LinkSetAlias(l, alias); err != nil {
		return fmt.Errorf("network: setting alias of %s: %w", name, err)
	}
	if err := netlink.LinkSetMTU(l, mtu); err != nil {
		return fmt.Errorf("network: setting MTU %d on %s: %w", mtu, name, err)
	}
	return disableIPv6(name)
}

// fdb adds a static bridge entry for mac on l and, when remote is
// valid, the VXLAN entry sending mac to remote.
func fdb(l netlink.Link, mac [6]byte, remote netip.Addr) error {
	idx := l.Attrs().Index
	master := &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_MASTER,
		State: netlink.NUD_NOARP, HardwareAddr: hw(mac)}
	if err := netlink.NeighSet(master); err != nil {
		return fmt.Errorf("network: bridge FDB entry %s on %s: %w", hw(mac), l.Attrs().Name, err)
	}
	if !remote.IsValid() {
		return nil
	}
	self := &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
		State: netlink.NUD_PERMANENT, HardwareAddr: hw(mac), IP: net.IP(remote.AsSlice())}
	if err := netlink.NeighAppend(self); err != nil {
		return fmt.Errorf("network: VXLAN FDB entry %s dst %v on %s: %w", hw(mac), remote, l.Attrs().Name, err)
	}
	return nil
}

// vniCollision explains an EEXIST from the kernel on the VXLAN device:
// another VXLAN device of this namespace has the VNI and port.
func vniCollision(p *Plan, err error) error {
	other := "another VXLAN device"
	if links, lerr := netlink.LinkList(); lerr == nil {
		for _, l := range links {
			if v, ok := l.(*netlink.Vxlan); ok && v.VxlanId == int(p.VNI) && v.Port == int(p.VXLANPort) && v.Name != p.Names.VXLAN {
				other = fmt.Sprintf("VXLAN device %s (%q)", v.Name, v.Alias)
			}
		}
	}
	return fmt.Errorf("network: step %q: VNI %d on UDP port %d is taken on this node by %s (a VNI collision: the step is refused rather than joined to another segment; requeue the job to get another step id): %w",
		p.Names.Alias, p.VNI, p.VXLANPort, other, err)
}

// gatewayFree refuses a gateway address another interface holds: two
// steps with services on one node would have one route for two bridges.
func gatewayFree(gw netip.Addr, n Names) error {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("network: listing addresses: %w", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == gw {
			holder := fmt.Sprintf("interface %d", a.LinkIndex)
			if l, err := netlink.LinkByIndex(a.LinkIndex); err == nil {
				holder = fmt.Sprintf("%s (%q)", l.Attrs().Name, l.Attrs().Alias)
			}
			return fmt.Errorf("network: step %q needs the services gateway %v, which %s holds on this node: one step with [network] services per node at a time (every step's gateway has that address): give such steps whole nodes (--exclusive), or list no services", n.Alias, gw, holder)
		}
	}
	return nil
}

// FamilyName is nft(8)'s name of a table family.
func FamilyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family-%d", f)
}

// listTables lists the nftables tables of this namespace in the two
// families the package uses.
func listTables() ([]*nftables.Table, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("network: nftables: %w", err)
	}
	var out []*nftables.Table
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyBridge, nftables.TableFamilyINet} {
		ts, err := c.ListTablesOfFamily(fam)
		if err != nil {
			return nil, fmt.Errorf("network: listing nftables tables of family %s: %w", FamilyName(fam), err)
		}
		out = append(out, ts...)
	}
	return out, nil
}

// deleteTables deletes the bridge and inet tables whose name matches.
func deleteTables(match func(name string) bool) ([]string, error) {
	tables, err := listTables()
	if err != nil {
		return nil, err
	}
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("network: nftables: %w", err)
	}
	var names []string
	for _, t := range tables {
		if match(t.Name) {
			c.DelTable(t)
			names = append(names, FamilyName(t.Family)+" "+t.Name)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("network: deleting nftables tables %s: %w", strings.Join(names, ", "), err)
	}
	return names, nil
}

// Teardown removes every host object of the step named by n from the
// caller's network namespace: the interfaces by name, the bridge and
// inet tables by name. Idempotent: what is missing is no error.
func Teardown(ctx context.Context, n Names) error {
	var errs []error
	for _, name := range []string{n.Tap, n.VXLAN, n.Bridge, n.Veth} {
		if name == "" {
			continue
		}
		if err := delLink(name); err != nil {
			errs = append(errs, err)
		}
	}
	if n.Table != "" {
		if _, err := deleteTables(func(t string) bool { return t == n.Table }); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func delLink(name string) error {
	l, err := netlink.LinkByName(name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("network: looking up %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !isNotFound(err) && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("network: deleting interface %s: %w", name, err)
	}
	return nil
}

// GC removes the host objects of every step of job on node that are left
// in the caller's network namespace (interfaces by alias, tables by
// name), and returns what it removed ("<interface> (<alias>)", "<family>
// <table>"). Objects of other nodes and jobs are never touched.
func GC(ctx context.Context, node string, job uint32) ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("network: listing interfaces: %w", err)
	}
	var done []string
	var errs []error
	for _, l := range links {
		o, ok := parseAlias(l.Attrs().Alias)
		if !ok || o.node != node || o.job != job {
			continue
		}
		if err := delLink(l.Attrs().Name); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, fmt.Sprintf("%s (%s)", l.Attrs().Name, l.Attrs().Alias))
	}
	tables, err := deleteTables(func(t string) bool {
		o, ok := parseTable(t)
		return ok && o.node == node && o.job == job
	})
	if err != nil {
		errs = append(errs, err)
	}
	return append(done, tables...), errors.Join(errs...)
}
