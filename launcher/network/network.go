// Package network is the step network of slurm-microvm: one virtual L2
// segment per step across the step's nodes, joined by the step's microVMs
// and nothing else, fenced on every node's host.
//
// CONTRACT (lead): the types and signatures below are shared by the
// lifecycle (package launcher), the agent (guest side, through
// driver.GuestNetwork), the QEMU driver and the test residue checks. The
// helper that owns this package fills in the bodies and the doc.go
// (address scheme, names, fencing, design decisions).
package network

import (
	"context"
	"errors"
	"log/slog"
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
	// UserSubnet holds the per-step links of user mode (100.64.0.0/16 by
	// default); UserAllow are private destinations user mode may reach.
	UserSubnet netip.Prefix
	UserAllow  []netip.Prefix
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
}

// Peer is the guest of another node of the step.
type Peer struct {
	Node     string
	Underlay netip.Addr
	Guest    netip.Addr
	MAC      [6]byte
}

// ErrNotImplemented marks the contract's placeholder bodies.
var ErrNotImplemented = errors.New("network: not implemented")

// NewPlan computes one node's plan. Errors name the field and the rule.
func NewPlan(r Request) (*Plan, error) { return nil, ErrNotImplemented }

// NamesFor derives the host-side names of a step on a node.
func NamesFor(node string, job, step, restart uint32) Names { return Names{} }

// Attachment is what Setup made: the VMM's end and how to undo it.
type Attachment struct {
	// Network is handed to the driver (SandboxConfig.Network).
	Network *driver.Network
}

// Close releases the files the attachment holds (not the host objects:
// Teardown removes those).
func (a *Attachment) Close() error { return nil }

// Setup creates this node's host side of the plan (bridge, VXLAN device,
// tap, forwarding entries, nftables fence) in the caller's network
// namespace, as root. On error nothing of it is left.
func Setup(ctx context.Context, p *Plan, log *slog.Logger) (*Attachment, error) {
	return nil, ErrNotImplemented
}

// Teardown removes every host object of the step named by n from the
// caller's network namespace. Idempotent: what is missing is no error.
func Teardown(ctx context.Context, n Names) error { return ErrNotImplemented }

// GC removes the host objects of every step of job on node that are left
// in the caller's network namespace, and returns their aliases/table names.
func GC(ctx context.Context, node string, job uint32) ([]string, error) {
	return nil, ErrNotImplemented
}

// Leftover tells whether an interface (by name and ifalias) or an
// nftables table (by name, alias "") belongs to some step of
// slurm-microvm: the test residue checks use it.
func Leftover(name, alias string) bool { return false }
