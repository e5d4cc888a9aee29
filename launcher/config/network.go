package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/network/sriov"
)

// Network is [network]: the guest's network (package launcher/network).
type Network struct {
	// Mode is the mode of a step that asks for none (--microvm-network):
	// "step" (default), "none" or "user".
	Mode string `toml:"mode"`
	// Allow lists the modes a user may pick with --microvm-network; the
	// default mode is always allowed. Default: ["none", "step"] ("user"
	// only where the site lists it).
	Allow []string `toml:"allow"`
	// Subnet holds the step guests' addresses: base+2+i for the step's
	// i-th node, base+1 for the gateway when Services are listed.
	// Default 10.224.0.0/16 (each step is its own segment: steps reuse it).
	Subnet string `toml:"subnet"`
	// VXLANPort is the UDP port of the VXLAN packets between nodes
	// (IANA's 4789 by default).
	VXLANPort int `toml:"vxlan_port"`
	// MTU of the guests' interface; 0: the underlay device's MTU less the
	// 50 bytes of VXLAN headers.
	MTU int `toml:"mtu"`
	// Services are destinations outside the step that step guests may
	// reach (masqueraded to the node's address); none by default.
	Services []NetworkService `toml:"services"`
	// User configures mode "user".
	User NetworkUser `toml:"user"`
	// Scontrol is the scontrol(1) the launcher asks for the step's node
	// addresses (NodeAddr).
	Scontrol string `toml:"scontrol"`
	// SRIOV lists the fabric NICs whose virtual functions steps may get
	// by VFIO ([network.sriov]; package launcher/network/sriov, checked
	// against fake sysfs trees only). None by default.
	SRIOV sriov.Config `toml:"sriov"`
}

// NetworkService is one [[network.services]] entry.
type NetworkService struct {
	// Prefix is an address or CIDR prefix, e.g. "10.0.0.53/32".
	Prefix string `toml:"prefix"`
	// Proto is "tcp" or "udp".
	Proto string `toml:"proto"`
	// Port is the destination port; 0: every port.
	Port int `toml:"port"`
}

// NetworkUser is [network.user].
type NetworkUser struct {
	// Subnet holds the per-step links between the node and the network
	// namespace the VMM of a user-mode step runs in. Default 100.64.0.0/16.
	Subnet string `toml:"subnet"`
	// Allow lists private destinations a user-mode guest may reach anyway
	// (by default private, shared, link-local and loopback ranges and the
	// node addresses are refused; public addresses are reachable).
	Allow []string `toml:"allow"`
}

// NetworkModes are the values of [network] mode and --microvm-network.
var NetworkModes = []string{"none", "step", "user"}

func defaultNetwork() Network {
	return Network{
		Mode:      "step",
		Allow:     []string{"none", "step"},
		Subnet:    "10.224.0.0/16",
		VXLANPort: 4789,
		User:      NetworkUser{Subnet: "100.64.0.0/16"},
		Scontrol:  "scontrol",
	}
}

// NetworkMode picks a step's mode: requested ("" : the site's default)
// must be a known mode the site allows. The error names the option and
// the rule.
func (n *Network) NetworkMode(requested string) (string, error) {
	if requested == "" {
		return n.Mode, nil
	}
	if !slices.Contains(NetworkModes, requested) {
		return "", fmt.Errorf("--microvm-network: %q is not a mode (one of %s)", requested, strings.Join(NetworkModes, ", "))
	}
	if requested != n.Mode && !slices.Contains(n.Allow, requested) {
		return "", fmt.Errorf("--microvm-network: %q is not allowed on this cluster (allowed: %s; the site sets [network] allow in microvm.toml)", requested, strings.Join(n.allowed(), ", "))
	}
	return requested, nil
}

func (n *Network) allowed() []string {
	out := []string{n.Mode}
	for _, m := range n.Allow {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// ParsedServices returns Services parsed (validate has checked them).
func (n *Network) ParsedServices() []ParsedService {
	var out []ParsedService
	for _, s := range n.Services {
		p, err := parsePrefix(s.Prefix)
		if err != nil {
			continue
		}
		out = append(out, ParsedService{Prefix: p, Proto: s.Proto, Port: uint16(s.Port)})
	}
	return out
}

// ParsedService is a NetworkService after validation.
type ParsedService struct {
	Prefix netip.Prefix
	Proto  string
	Port   uint16
}

// parsePrefix takes "a.b.c.d/n" or a bare IPv4 address (/32).
func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return netip.Prefix{}, fmt.Errorf("%q is not an IPv4 address or prefix", s)
		}
		return netip.PrefixFrom(a, 32), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("%q is not an IPv4 prefix (e.g. 10.0.0.0/24)", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set (the prefix is %s)", s, p.Masked())
	}
	return p, nil
}

// ParsedSubnet is Subnet parsed (validate has checked it).
func (n *Network) ParsedSubnet() netip.Prefix { p, _ := parsePrefix(n.Subnet); return p }

// ParsedUserSubnet is User.Subnet parsed (validate has checked it).
func (n *Network) ParsedUserSubnet() netip.Prefix { p, _ := parsePrefix(n.User.Subnet); return p }

// ParsedUserAllow is User.Allow parsed (validate has checked it).
func (n *Network) ParsedUserAllow() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range n.User.Allow {
		if p, err := parsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func checkNetwork(n *Network, bad func(key, format string, a ...any)) {
	if !slices.Contains(NetworkModes, n.Mode) {
		bad("network.mode", "%q must be one of %s", n.Mode, strings.Join(NetworkModes, ", "))
	}
	for i, m := range n.Allow {
		if !slices.Contains(NetworkModes, m) {
			bad("network.allow", "entry %d: %q must be one of %s", i+1, m, strings.Join(NetworkModes, ", "))
		}
	}
	if p, err := parsePrefix(n.Subnet); err != nil {
		bad("network.subnet", "%v", err)
	} else if p.Bits() > 29 {
		bad("network.subnet", "%s holds too few addresses: want /29 or larger (a /16 takes 65532 nodes per step)", p)
	}
	if p, err := parsePrefix(n.User.Subnet); err != nil {
		bad("network.user.subnet", "%v", err)
	} else if p.Bits() > 28 {
		bad("network.user.subnet", "%s holds too few per-step links: want /28 or larger", p)
	}
	for i, s := range n.User.Allow {
		if _, err := parsePrefix(s); err != nil {
			bad("network.user.allow", "entry %d: %v", i+1, err)
		}
	}
	if n.VXLANPort < 1 || n.VXLANPort > 65535 {
		bad("network.vxlan_port", "%d must be a UDP port (1-65535)", n.VXLANPort)
	}
	if n.MTU != 0 && (n.MTU < 576 || n.MTU > 65535) {
		bad("network.mtu", "%d must be 0 (from the underlay) or 576-65535", n.MTU)
	}
	subnet, subnetErr := parsePrefix(n.Subnet)
	userSubnet, userErr := parsePrefix(n.User.Subnet)
	if subnetErr == nil && userErr == nil && subnet.Overlaps(userSubnet) {
		bad("network.user.subnet", "%s overlaps [network] subnet %s: the two must be disjoint", userSubnet, subnet)
	}
	// The per-step links get host routes on the node: a user subnet
	// outside private and shared address space would take over routes to
	// real destinations.
	if userErr == nil && !privateSpace(userSubnet) {
		bad("network.user.subnet", "%s is not inside private (RFC 1918: 10/8, 172.16/12, 192.168/16) or shared (RFC 6598: 100.64/10) address space: its per-step routes would shadow real destinations", userSubnet)
	}
	for i, s := range n.Services {
		p, err := parsePrefix(s.Prefix)
		if err != nil {
			bad("network.services", "entry %d: prefix: %v", i+1, err)
		} else if subnetErr == nil && p.Overlaps(subnet) {
			bad("network.services", "entry %d: prefix %s lies in [network] subnet %s, the guests' own addresses: a service must be outside it", i+1, p, subnet)
		}
		if s.Proto != "tcp" && s.Proto != "udp" {
			bad("network.services", "entry %d: proto %q must be tcp or udp", i+1, s.Proto)
		}
		if s.Port < 0 || s.Port > 65535 {
			bad("network.services", "entry %d: port %d must be 0 (every port) or 1-65535", i+1, s.Port)
		}
	}
	if n.Scontrol == "" {
		bad("network.scontrol", "must not be empty")
	}
	if err := n.SRIOV.Validate(); err != nil {
		bad("network.sriov.pfs", "%v", err)
	}
}

// privateSpace tells whether p lies inside RFC 1918 or RFC 6598 space.
func privateSpace(p netip.Prefix) bool {
	for _, r := range []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"} {
		q := netip.MustParsePrefix(r)
		if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
			return true
		}
	}
	return false
}
