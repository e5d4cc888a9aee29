// The types of this file are the package's seam: the lifecycle (package
// launcher) builds a Request, the QEMU driver and the agent get the
// result through driver.Network, and the test residue checks use Leftover.
// The package documentation is in doc.go.

package network

import (
	"net/netip"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
)

// Mode is how a step's guest is networked ([network] mode in microvm.toml,
// --microvm-network).
type Mode string

const (
	// None: the guest has a loopback interface only.
	None Mode = "none"
	// Step: the guest reaches the guests of its own step on the other
	// nodes (one VXLAN segment per step) and the services the site lists.
	Step Mode = "step"
	// User: outbound only, through the VMM's user-mode NAT (QEMU
	// -netdev user), in a network namespace of the step's own; for
	// single-node steps.
	User Mode = "user"
)

// Node is one node of a step: its Slurm name and its address on the
// network between nodes (Slurm's NodeAddr), which carries the VXLAN
// packets (the underlay).
type Node struct {
	Name string
	Addr netip.Addr
}

// Service is a destination outside the step that the site lets step
// guests reach ([network] services): through the bridge's gateway address,
// masqueraded to the node's own address.
type Service struct {
	// Prefix is the destination (a /32 for one host).
	Prefix netip.Prefix
	// Proto is "tcp" or "udp".
	Proto string
	// Port is the destination port; 0 is every port.
	Port uint16
}

// Request is what a step's plan is computed from; every node of the step
// computes the same plan for the same request but Node.
type Request struct {
	Mode Mode
	// Node is this node's Slurm name (SLURMD_NODENAME).
	Node               string
	Job, Step, Restart uint32
	// Nodes are the step's nodes in SLURM_STEP_NODELIST order, this node
	// among them; their index is the guest address's host part.
	Nodes []Node
	// Subnet holds the guests' addresses ([network] subnet).
	Subnet netip.Prefix
	// Services the guests may reach (Step mode only).
	Services []Service
	// VXLANPort is the UDP port of the underlay (4789 by default).
	VXLANPort uint16
	// MTU of the guest interface; 0: the underlay device's MTU less the
	// VXLAN overhead (50 bytes), found at Setup.
	MTU int
	// UserSubnet (User mode) is carved into one /30 per step for the
	// veth pair between the node and the step's namespace; invalid:
	// DefaultUserSubnet.
	UserSubnet netip.Prefix
	// UserAllow (User mode) are private or site destinations the guest
	// may reach anyway (a site proxy or resolver); see UserBlocked.
	UserAllow []netip.Prefix
}

// Names are the host-side objects of one step on one node, all derived
// from the node and the step, so teardown and gc need nothing else.
type Names struct {
	// Bridge, VXLAN and Tap are interface names (at most 15 bytes).
	Bridge, VXLAN, Tap string
	// Table is the nftables table (one in family bridge, one in inet).
	Table string
	// Alias is the interfaces' ifalias: names the step and node in full.
	Alias string
	// Veth is the host end of the veth pair of User mode.
	Veth string
}

// Plan is one node's part of a step network.
type Plan struct {
	Mode      Mode
	Names     Names
	VNI       uint32
	Underlay  netip.Addr
	VXLANPort uint16
	// Peers are the other nodes' guests.
	Peers    []Peer
	Services []Service
	// Guest is what the agent configures in this node's guest.
	Guest driver.GuestNetwork
	// MTU is Request.MTU (0: found at Setup from the underlay device).
	MTU int
	// UserSubnet, UserAllow and UserBlocked are User mode's: the veth's
	// /30 is taken from UserSubnet; forwarding from the veth is dropped
	// toward UserBlocked (the private ranges and the step's node
	// addresses) unless the destination is in UserAllow.
	UserSubnet  netip.Prefix
	UserAllow   []netip.Prefix
	UserBlocked []netip.Prefix
}

// Peer is the guest of another node of the step.
type Peer struct {
	Node     string
	Underlay netip.Addr
	Guest    netip.Addr
	MAC      [6]byte
}

// Attachment is what Setup made: the VMM's end and how to undo it.
type Attachment struct {
	// Network is handed to the driver (SandboxConfig.Network); nil in
	// None mode.
	Network *driver.Network
	// Names are the host objects made (Teardown's argument).
	Names Names
}
