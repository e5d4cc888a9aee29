// Package network is the step network of slurm-microvm: one virtual L2
// segment per step across the step's nodes, joined by the step's microVMs
// and nothing else, fenced on every node's host.
//
// NewPlan computes one node's part from the step (job, step, restart),
// the node's name and the step's node list; every node computes the same
// VNI, addresses and MACs. Setup makes the host side in the caller's
// network namespace (as root, on one OS thread), Teardown removes it by
// name, GC by the job, and Leftover recognises any of it for the residue
// checks. Only netlink (vishvananda/netlink) and nftables
// (google/nftables) are used: no ip, bridge or nft commands.
//
// # Modes
//
//   - none: the guest has a loopback interface only. Nothing on the host.
//   - step: the guest has one interface on the step's segment; it reaches
//     the guests of the same step on the other nodes and, when the site
//     lists [network] services, those destinations through a gateway on
//     its node, masqueraded to the node's address.
//   - user: outbound only, through QEMU's user-mode NAT (-netdev user),
//     with the VMM started in a network namespace of the step's own.
//
// # Address scheme (what a packet capture shows)
//
// With step id "<job>.<step>.<restart>" (the restart count is Slurm's
// SLURM_RESTART_COUNT) and the step's nodes in SLURM_STEP_NODELIST order:
//
//   - VNI = the first 3 bytes of SHA-256("<job>.<step>.<restart>"),
//     big-endian, 0 taken as 1: `printf %s 1234.0.0 | sha256sum | cut -c1-6`
//     is the VNI in hex (f2a0fd = 15900925). UDP port [network]
//     vxlan_port (default 4789), outer source = the node's NodeAddr.
//   - Guest address of the i-th node (from 0) = Subnet base + 2 + i, with
//     Subnet's prefix length ([network] subnet, e.g. 10.224.0.0/16:
//     10.224.0.2 for the first node). Base + 1 is the services gateway,
//     on the bridge only when services are listed. The broadcast address
//     is never used; a step with more nodes than the subnet holds is
//     refused.
//   - MAC = 02:4d:<the 4 bytes of the IPv4 address> (locally
//     administered): 10.224.0.2 is 02:4d:0a:e0:00:02, the bridge
//     (gateway) 02:4d:0a:e0:00:01. The guest gets permanent ARP entries
//     for every peer (and the gateway): no ARP crosses the segment.
//   - Guest MTU = [network] mtu, or the MTU of the node's underlay device
//     (the one holding its NodeAddr) less 50 (VXLAN over IPv4).
//   - Hostname = the node's name; /etc/hosts holds "<address> <node>" for
//     every node of the step.
//   - Host-side names: "smv" + the first 8 hex digits of
//     SHA-256("<node> <job>.<step>.<restart>") + a role letter: b bridge,
//     x VXLAN device, t tap, v veth (user mode). 12 bytes (IFNAMSIZ 16).
//     Shell: `printf %s 'node1 1234.0.0' | sha256sum | cut -c1-8`. Every
//     interface's ifalias reads "slurm-microvm <node> <job>.<step>.<restart>",
//     so `ip -d link` names the step in full. The nftables tables (one in
//     family bridge, one in inet) are "slurm-microvm_<job>.<step>.<restart>_<node>"
//     (node names: [A-Za-z0-9._-], last so that it parses).
//   - User mode: the guest sees QEMU slirp's 10.0.2.15/24, gateway
//     10.0.2.2, DNS 10.0.2.3, MAC 02:4d:0a:00:02:0f. On the host, a /30
//     of [network.user] subnet (default 100.64.0.0/16): slot
//     SHA-256(alias) mod (number of /30s), the next free one on a
//     collision; the node end is .1 (smv...v), the namespace end .2
//     (eth0, default route via .1).
//
// # What the fence allows and drops
//
// Bridge table, chain guest (prerouting, before br_netfilter): from the
// tap, a frame passes only with the guest's source MAC and either IPv4
// with the guest's source address or ARP (Ethernet/IPv4) whose sender MAC
// and address are the guest's; everything else from the tap drops
// (spoofed MACs and addresses, IPv6, VLAN tags, other EtherTypes). From
// the VXLAN device only frames from the peers' MACs pass. Bridge ports
// do not learn and do not flood (unknown unicast, multicast, broadcast):
// a frame goes where a static FDB entry sends it (the guest's MAC on the
// tap, each peer's MAC on the VXLAN device, with the peer's NodeAddr as
// VXLAN destination), or nowhere.
//
// The bridge answers no ARP (arp_ignore=8 on the device) and, with
// services, holds the guest as a permanent neighbour, so no ARP is
// needed in either direction. It does no multicast snooping (a guest's
// IGMP joins would make forwarding entries).
//
// Frames to an IEEE 802.1D link-local group MAC (01:80:c2:00:00:0X) skip
// the bridge's hooks (0x0e reaches none at all) and are handed to the
// port's own stack. The ports therefore have strict reverse-path
// filtering (rp_filter=1: nothing routes via a port) and arp_ignore=8,
// and the inet table drops input and forwarding from the tap and the
// VXLAN device as well as from the bridge, whatever the node's defaults.
//
// Inet table: input from the bridge (and its ports) drops (the node's own
// addresses and services: slurmd, munge, sshd). Forward from the bridge
// to elsewhere passes only toward the services (prefix, tcp/udp, port;
// 0 = any), at most MaxServiceConns connections at a time (connlimit: the
// node's conntrack table is shared with slurmd), and drops otherwise,
// which covers other nodes' host addresses and other steps' guests;
// forward toward the bridge passes only ct state established,related.
// Postrouting masquerades the guests' traffic to the services. In user
// mode the same for the veth: input drops; forward from it drops UDP to
// the VXLAN port (a masqueraded packet carries the node's address, which
// the other nodes' underlay fences trust), and drops toward 10/8,
// 172.16/12, 192.168/16, 100.64/10, 169.254/16, 127/8, the user subnet
// and the step's node addresses unless the destination is in
// [network.user] allow, passes other IPv4, drops IPv6; masquerade out.
//
// The underlay: VXLAN has no keys, and the kernel checks neither a
// packet's outer source address nor its port, while a step's VNI and MACs
// follow from its job id. The inet table's input accepts VXLAN packets
// of the step's VNI only from the step's other nodes' NodeAddr, and its
// output drops UDP to the VXLAN port from every non-root socket while the
// step runs (the kernel's VXLAN socket is root's), so neither another
// host nor a user on a peer node can put frames on the segment. Root on
// the nodes, and a fabric on which a host can send with a node's address,
// stay trusted; site firewalls confining UDP 4789 to the nodes, or an
// encrypted underlay, close the rest.
//
// # Design decisions
//
//   - One VXLAN segment per step with static FDB entries, not routed /32s
//     per guest nor one shared bridge. Routed /32s put every guest in the
//     node's routing table and need per-tenant policy routing to keep
//     jobs apart; a shared bridge puts all jobs in one broadcast domain
//     and fences them only by rules. A per-step segment separates jobs by
//     construction (another step's frames arrive on another VNI's
//     device) and the static FDB means no flooding, no learning and no
//     multicast group on the underlay. VNI collisions: on one node the
//     kernel refuses a second VXLAN device with the same VNI and port
//     (EEXIST); Setup turns that into an error naming the step and the
//     device that holds it and fails closed (the step is not joined to
//     another). Across nodes a collision is harmless: a node's FDB
//     entries point only at its own step's nodes and the bridge only
//     admits peers' MACs from the VXLAN device, so two steps sharing a
//     VNI on disjoint nodes never exchange frames. The 24-bit hash gives
//     a collision among N concurrent steps on one node with probability
//     about N²/2²⁵ (N=10: 3·10⁻⁶).
//   - One pair of nftables tables per step, not one shared table with a
//     chain per step. Teardown and GC are then "delete tables by name"
//     (no rule handles to find), a crashed supervisor's rules are found
//     by name, and two steps' setups never edit the same object. The cost
//     is a few base chains per step on the hooks; a drop in any table is
//     final, which is what a fence wants.
//   - Non-persistent tap (no TUNSETPERSIST): the kernel removes it when
//     the last fd closes (launcher and VMM), so a killed VMM leaves no
//     tap. Setup holds an fd until the VMM has its own copy.
//   - No host-wide sysctl changes. IPv6 is turned off per device (the
//     step's bridge, VXLAN and tap: /proc/sys/net/ipv6/conf/<dev>) so the
//     host has no link-local address on the segment. Services and user
//     mode need net.ipv4.ip_forward=1; Setup refuses, naming the sysctl,
//     rather than turning on forwarding for the whole node.
//   - br_netfilter: when loaded it passes bridged IPv4 through the inet
//     hooks with the bridge as both input and output device. The inet
//     chains therefore match only the bridge device (never the tap or
//     VXLAN port names), and accept bridge-to-bridge first, so the step's
//     own traffic is unaffected.
//   - Services: one gateway address per subnet on a node. Every step
//     uses the same subnet (addresses are per segment), so two steps with
//     services on one node would give the host two routes to one subnet
//     and replies could reach the wrong step; Setup refuses the second
//     (naming the step holding the gateway) rather than misroute. The
//     alternative (a VRF per step plus conntrack zones) is more host
//     state to clean; it is the way to lift the limit.
//   - User mode in a namespace of its own, not slirp in the node's
//     namespace. Slirp maps 10.0.2.2 to the host's loopback, which in the
//     node's namespace would hand the guest slurmd, munge and every
//     service bound to 127.0.0.1; in an empty namespace the loopback has
//     nothing. Leaving the namespace goes through a veth that the host
//     fences and masquerades like any other tenant. A resolver on the
//     node's loopback is then out of reach; list the site's resolver in
//     [network.user] allow if it is on a private address. The namespace is made by
//     unshare on a thread that is never reused (the runtime ends it), held
//     by an fd (Attachment.Network.NetNS) until the VMM is in it; it and
//     its veth vanish with the VMM.
//   - The tap is IFF_TAP|IFF_NO_PI without IFF_VNET_HDR: the VMM opens
//     it as given (QEMU: -netdev tap,fd=N,vnet_hdr=off) and gives the
//     guest NIC the plan's MAC (Guest.MAC).
//   - The guest needs no DHCP: address, routes, neighbours, hosts and
//     DNS come from the plan (driver.GuestNetwork) and the agent applies
//     them before any task starts.
package network
