package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/fs/guestpath"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
)

// Limits of a network set-up. maxDNS is glibc's MAXNS (resolv.h): more
// name servers in /etc/resolv.conf are ignored.
const (
	maxDNS       = 3
	maxRoutes    = 256
	maxNeighbors = 4096
	maxHosts     = 4096
	// minMTU is IPv4's minimum (RFC 791: 68); IPv6 needs 1280 (RFC 8200).
	minMTU, minMTU6, maxMTU = 68, 1280, 65535
)

// linkWait bounds the wait for the interface to appear after virtio_net
// loaded (its probe is normally done when finit_module returns).
const linkWait = 5 * time.Second

// netConfig is an api.Network checked field by field.
type netConfig struct {
	mac       net.HardwareAddr
	addr      netip.Prefix
	mtu       int
	gateway   netip.Addr // invalid: no default route
	routes    []netRoute
	neighbors []netNeighbor
	hosts     []hostLine
	dns       []netip.Addr
}

type netRoute struct {
	dst netip.Prefix
	via netip.Addr
}

type netNeighbor struct {
	addr netip.Addr
	mac  net.HardwareAddr
}

type hostLine struct {
	addr  netip.Addr
	names []string
}

// parseNetwork checks every field of n (the host sent it, but the agent
// configures nothing it has not checked) and returns the first problem,
// naming the field, the value and the rule.
func parseNetwork(n *api.Network) (*netConfig, error) {
	c := &netConfig{}
	var err error
	if c.mac, err = unicastMAC("network.mac", n.Mac); err != nil {
		return nil, err
	}
	c.addr, err = netip.ParsePrefix(n.Address)
	if err != nil {
		return nil, fmt.Errorf("network.address %q: %v; give an address with its prefix length, e.g. 10.99.0.2/24", n.Address, err)
	}
	a := c.addr.Addr()
	switch {
	case a.Is4In6():
		return nil, fmt.Errorf("network.address %q: an IPv4-mapped IPv6 address; give the IPv4 form", n.Address)
	case a.IsUnspecified(), a.IsLoopback(), a.IsMulticast():
		return nil, fmt.Errorf("network.address %q: not a unicast host address (unspecified, loopback or multicast)", n.Address)
	case c.addr.Bits() == 0:
		return nil, fmt.Errorf("network.address %q: prefix length 0 puts every address on the link; give the on-link prefix", n.Address)
	case a.Is4() && c.addr.Bits() <= 30 && (a == c.addr.Masked().Addr() || a == lastAddr(c.addr)):
		return nil, fmt.Errorf("network.address %q: the network or broadcast address of its prefix, not a host address", n.Address)
	}
	c.mtu = int(n.Mtu)
	low := minMTU
	if a.Is6() {
		low = minMTU6
	}
	if c.mtu != 0 && (c.mtu < low || c.mtu > maxMTU) {
		return nil, fmt.Errorf("network.mtu %d: out of range %d-%d (0 keeps the device's)", c.mtu, low, maxMTU)
	}
	onLink := func(field, s string) (netip.Addr, error) {
		x, err := netip.ParseAddr(s)
		if err != nil {
			return x, fmt.Errorf("%s %q: %v", field, s, err)
		}
		if x.Is4() != a.Is4() || x.Is4In6() {
			return x, fmt.Errorf("%s %q: not of the interface address's family (%s)", field, s, c.addr)
		}
		if !c.addr.Contains(x) {
			return x, fmt.Errorf("%s %q: not on the link (outside %s): the guest could not reach it", field, s, c.addr.Masked())
		}
		if x == a {
			return x, fmt.Errorf("%s %q: the guest's own address", field, s)
		}
		return x, nil
	}
	if n.Gateway != "" {
		if c.gateway, err = onLink("network.gateway", n.Gateway); err != nil {
			return nil, err
		}
	}
	if len(n.Routes) > maxRoutes {
		return nil, fmt.Errorf("network.routes: %d routes, at most %d", len(n.Routes), maxRoutes)
	}
	for i, r := range n.Routes {
		field := fmt.Sprintf("network.routes[%d]", i)
		dst, err := netip.ParsePrefix(r.Destination)
		if err != nil {
			return nil, fmt.Errorf("%s.destination %q: %v", field, r.Destination, err)
		}
		if dst.Addr().Is4() != a.Is4() || dst.Addr().Is4In6() {
			return nil, fmt.Errorf("%s.destination %q: not of the interface address's family (%s)", field, r.Destination, c.addr)
		}
		if dst != dst.Masked() {
			return nil, fmt.Errorf("%s.destination %q: has host bits set; give %s", field, r.Destination, dst.Masked())
		}
		via, err := onLink(field+".via", r.Via)
		if err != nil {
			return nil, err
		}
		c.routes = append(c.routes, netRoute{dst: dst, via: via})
	}
	if len(n.Neighbors) > maxNeighbors {
		return nil, fmt.Errorf("network.neighbors: %d entries, at most %d", len(n.Neighbors), maxNeighbors)
	}
	for i, nb := range n.Neighbors {
		field := fmt.Sprintf("network.neighbors[%d]", i)
		addr, err := onLink(field+".address", nb.Address)
		if err != nil {
			return nil, err
		}
		mac, err := unicastMAC(field+".mac", nb.Mac)
		if err != nil {
			return nil, err
		}
		c.neighbors = append(c.neighbors, netNeighbor{addr: addr, mac: mac})
	}
	if len(n.Hosts) > maxHosts {
		return nil, fmt.Errorf("network.hosts: %d entries, at most %d", len(n.Hosts), maxHosts)
	}
	for i, h := range n.Hosts {
		field := fmt.Sprintf("network.hosts[%d]", i)
		addr, err := netip.ParseAddr(h.Address)
		if err != nil {
			return nil, fmt.Errorf("%s.address %q: %v", field, h.Address, err)
		}
		if len(h.Names) == 0 {
			return nil, fmt.Errorf("%s: address %s with no name", field, addr)
		}
		for _, name := range h.Names {
			if err := checkHostName(name); err != nil {
				return nil, fmt.Errorf("%s: %w", field, err)
			}
		}
		c.hosts = append(c.hosts, hostLine{addr: addr, names: h.Names})
	}
	if len(n.Dns) > maxDNS {
		return nil, fmt.Errorf("network.dns: %d name servers; the resolver uses at most %d (glibc MAXNS)", len(n.Dns), maxDNS)
	}
	for i, d := range n.Dns {
		addr, err := netip.ParseAddr(d)
		if err != nil || addr.IsUnspecified() || addr.IsMulticast() {
			return nil, fmt.Errorf("network.dns[%d] %q: not a unicast address", i, d)
		}
		c.dns = append(c.dns, addr)
	}
	return c, nil
}

// unicastMAC checks a 6-byte unicast MAC (IEEE 802: bit 0 of the first
// byte clear), not all zero.
func unicastMAC(field string, b []byte) (net.HardwareAddr, error) {
	if len(b) != 6 {
		return nil, fmt.Errorf("%s: %d bytes, want a 6-byte Ethernet address", field, len(b))
	}
	mac := net.HardwareAddr(bytes.Clone(b))
	if b[0]&1 != 0 || bytes.Equal(b, make([]byte, 6)) {
		return nil, fmt.Errorf("%s %s: not a unicast address (the lowest bit of the first byte must be 0, and not all zero)", field, mac)
	}
	return mac, nil
}

// lastAddr is the highest address of p (IPv4's broadcast address).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// checkHostName applies RFC 1123's host name syntax (labels of letters,
// digits and '-', 1-63 bytes, not starting or ending with '-'; 253 bytes in
// all), with '_' allowed too: Slurm node names may hold it and the
// resolver's files backend takes it. Anything else (whitespace, '#')
// would change the meaning of an /etc/hosts line.
func checkHostName(name string) error {
	if name == "" || len(name) > 253 {
		return fmt.Errorf("host name %q: want 1-253 bytes", name)
	}
	for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("host name %q: label %q must be 1-63 bytes and not begin or end with '-' (RFC 1123)", name, l)
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return fmt.Errorf("host name %q: %q is not a letter, digit, '-' or '_' (RFC 1123)", name, r)
			}
		}
	}
	return nil
}

// configureNetwork loads the network device's modules and configures the
// interface whose MAC is c.mac: MTU, address, up; then the default route,
// the routes and the permanent neighbors. It checks that lo is up (the
// agent set it up at boot).
func configureNetwork(ctx context.Context, c *netConfig) error {
	if _, err := guestmod.Load(ctx, guestmod.Config{NetOnly: true}); err != nil {
		return fmt.Errorf("load modules for the network device: %w", err)
	}
	return configureLink(ctx, c, linkWait)
}

// configureLink is configureNetwork once the device's driver is loaded;
// wait bounds the waits for the interface and its carrier.
func configureLink(ctx context.Context, c *netConfig, wait time.Duration) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if lo.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("set lo up: %w", err)
		}
	}
	link, err := linkByMAC(ctx, c.mac, wait)
	if err != nil {
		return err
	}
	name := link.Attrs().Name
	if c.mtu != 0 {
		if err := netlink.LinkSetMTU(link, c.mtu); err != nil {
			return fmt.Errorf("set MTU %d on %s (%s): %w", c.mtu, name, c.mac, err)
		}
	}
	ipnet := &net.IPNet{IP: c.addr.Addr().AsSlice(), Mask: net.CIDRMask(c.addr.Bits(), c.addr.Addr().BitLen())}
	// IFA_F_NODAD: the address is the launcher's, unique by
	// construction; waiting for IPv6 duplicate detection only delays it.
	if err := netlink.AddrReplace(link, &netlink.Addr{IPNet: ipnet, Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("add address %s to %s (%s): %w", c.addr, name, c.mac, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s (%s) up: %w", name, c.mac, err)
	}
	idx := link.Attrs().Index
	if c.gateway.IsValid() {
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: idx, Gw: c.gateway.AsSlice()}); err != nil {
			return fmt.Errorf("add default route via %s on %s: %w", c.gateway, name, err)
		}
	}
	for _, r := range c.routes {
		dst := &net.IPNet{IP: r.dst.Addr().AsSlice(), Mask: net.CIDRMask(r.dst.Bits(), r.dst.Addr().BitLen())}
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: idx, Dst: dst, Gw: r.via.AsSlice()}); err != nil {
			return fmt.Errorf("add route %s via %s on %s: %w", r.dst, r.via, name, err)
		}
	}
	for _, nb := range c.neighbors {
		fam := netlink.FAMILY_V4
		if nb.addr.Is6() {
			fam = netlink.FAMILY_V6
		}
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: fam, State: netlink.NUD_PERMANENT, IP: nb.addr.AsSlice(), HardwareAddr: nb.mac}); err != nil {
			return fmt.Errorf("add permanent neighbor %s at %s on %s: %w", nb.addr, nb.mac, name, err)
		}
	}
	return waitCarrier(ctx, idx, name, c.mac, wait)
}

// waitCarrier waits until the interface has a carrier (IFF_LOWER_UP, the
// device's own link state). Without one its queue is not attached and a
// workload's first packets are dropped. Not operstate "up": the kernel's
// link watch sets that up to a second later (rate-limited to one run a
// second) while the queue already sends; waiting for it cost about 1 s of
// boot under TCG (measured with BenchmarkBootNetwork), the carrier wait
// nothing measurable.
func waitCarrier(ctx context.Context, idx int, name string, mac net.HardwareAddr, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		l, err := netlink.LinkByIndex(idx)
		if err != nil {
			return fmt.Errorf("look at %s (%s): %w", name, mac, err)
		}
		if l.Attrs().RawFlags&unix.IFF_LOWER_UP != 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (%s) has no carrier after %s (operstate %s): the VMM's network device has no link", name, mac, timeout, l.Attrs().OperState)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s (%s) to come up: %w", name, mac, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// linkByMAC waits up to timeout for the interface whose MAC is mac.
func linkByMAC(ctx context.Context, mac net.HardwareAddr, timeout time.Duration) (netlink.Link, error) {
	deadline := time.Now().Add(timeout)
	for {
		links, err := netlink.LinkList()
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, fmt.Errorf("list network interfaces: %w", err)
		}
		var seen []string
		for _, l := range links {
			a := l.Attrs()
			if bytes.Equal(a.HardwareAddr, mac) {
				return l, nil
			}
			if a.Name != "lo" {
				seen = append(seen, fmt.Sprintf("%s (%s)", a.Name, a.HardwareAddr))
			}
		}
		if err == nil && time.Now().After(deadline) {
			if len(seen) == 0 {
				seen = []string{"none besides lo"}
			}
			return nil, fmt.Errorf("no network interface has MAC %s (the VMM's network device) within %s; interfaces: %s", mac, timeout, strings.Join(seen, ", "))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the interface with MAC %s: %w", mac, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// hostsFile is the guest's /etc/hosts for c: localhost, the launcher's
// entries, and hostname on the interface's address unless an entry names
// it (MPI libraries look their own host name up and must get the address
// the other nodes reach, not a loopback one).
func hostsFile(c *netConfig, hostname string) []byte {
	var b bytes.Buffer
	b.WriteString("# written by slurm-microvm-agent from the step's network\n")
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	named := false
	for _, h := range c.hosts {
		fmt.Fprintf(&b, "%s\t%s\n", h.addr, strings.Join(h.names, " "))
		for _, n := range h.names {
			named = named || n == hostname
		}
	}
	if hostname != "" && !named {
		fmt.Fprintf(&b, "%s\t%s\n", c.addr.Addr(), hostname)
	}
	return b.Bytes()
}

// resolvConf is the guest's /etc/resolv.conf for c; nil: keep the image's.
func resolvConf(c *netConfig) []byte {
	if len(c.dns) == 0 {
		return nil
	}
	var b bytes.Buffer
	b.WriteString("# written by slurm-microvm-agent from the step's network\n")
	for _, d := range c.dns {
		fmt.Fprintf(&b, "nameserver %s\n", d)
	}
	return b.Bytes()
}

// etcRefused are the in-root paths the image's /etc may not resolve to.
var etcRefused = append(append([]string(nil), shareRefused...), "/proc", "/sys", "/dev", "/run")

// writeEtc replaces the file name in the root's /etc with data, mode 0644,
// in the overlay's upper layer. /etc is resolved inside the root (an image
// symlink /etc -> elsewhere stays in the root; a missing /etc is created),
// and a symlink at name (Debian's /etc/resolv.conf ->
// ../run/systemd/resolve/stub-resolv.conf) is replaced by the file, never
// followed.
func writeEtc(root, name string, data []byte) error {
	dir, in, err := guestpath.Resolve(root, "/etc", guestpath.Options{Create: true, Refuse: etcRefused})
	if err != nil {
		return fmt.Errorf("write /etc/%s: %w", name, err)
	}
	defer dir.Close()
	dfd := int(dir.Fd())
	tmp := "." + name + ".slurm-microvm"
	_ = unix.Unlinkat(dfd, tmp, 0)
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("write %s/%s: %w", in, name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Chmod(0o644)
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		// rename(2) replaces a symlink at name itself, not its target.
		werr = unix.Renameat(dfd, tmp, dfd, name)
	}
	if werr != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("write %s/%s: %w", in, name, werr)
	}
	return nil
}

// setupNetwork configures the guest's interface and writes /etc/hosts
// (and /etc/resolv.conf when c has name servers) into root.
func setupNetwork(ctx context.Context, root, hostname string, c *netConfig) error {
	if err := configureNetwork(ctx, c); err != nil {
		return err
	}
	if err := writeEtc(root, "hosts", hostsFile(c, hostname)); err != nil {
		return err
	}
	if rc := resolvConf(c); rc != nil {
		if err := writeEtc(root, "resolv.conf", rc); err != nil {
			return err
		}
	}
	return nil
}

// pingGroupRange is the guest kernel's net.ipv4.ping_group_range file.
const pingGroupRange = "/proc/sys/net/ipv4/ping_group_range"

// allowPingSockets lets every gid open ICMP datagram sockets in the guest
// (ping as the job's user, without a raw socket), as systemd's default
// sysctl.d does on current distributions. The guest's own kernel setting:
// it widens nothing on the host, and ICMP from the guest stays under the
// host's fence like any other packet.
func allowPingSockets(path string) error {
	if err := os.WriteFile(path, []byte("0 2147483647\n"), 0o644); err != nil {
		return fmt.Errorf("allow ping sockets for every group (%s): %w", path, err)
	}
	return nil
}
