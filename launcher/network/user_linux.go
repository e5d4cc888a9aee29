package network

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
)

// newNetNS makes an anonymous network namespace and returns a file of
// it. The unshare happens on a thread of its own that is never given
// back to the Go scheduler (its goroutine exits locked, so the runtime
// ends the thread): no other goroutine ever runs in the new namespace.
func newNetNS() (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("network: creating a network namespace (unshare CLONE_NEWNET): %w", err)}
			return
		}
		f, err := os.Open(fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid()))
		if err != nil {
			err = fmt.Errorf("network: opening the new network namespace: %w", err)
		}
		ch <- result{f, err}
	}()
	r := <-ch
	return r.f, r.err
}

// userSlot picks the step's /30 in p.UserSubnet: the slot the names'
// hash gives, or the next one no address of this namespace lies in.
func userSlot(p *Plan) (netip.Prefix, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("network: listing addresses: %w", err)
	}
	var used []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			used = append(used, ip.Unmap())
		}
	}
	count := uint32(1) << (30 - p.UserSubnet.Bits())
	h := sha256.Sum256([]byte(p.Names.Alias))
	start := binary.BigEndian.Uint32(h[:4]) % count
	for i := uint32(0); i < count; i++ {
		slot := (start + i) % count
		base, _ := addrAt(p.UserSubnet, slot*4)
		pfx := netip.PrefixFrom(base, 30)
		free := true
		for _, u := range used {
			if pfx.Contains(u) {
				free = false
				break
			}
		}
		if free {
			return pfx, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("network: every /30 of [network.user] subnet %v is in use on this node: give a larger [network.user] subnet", p.UserSubnet)
}

// setupUser makes User mode's objects: the namespace the VMM runs in,
// the veth pair into it (host end named and aliased after the step,
// the other end eth0 in the namespace), addresses, the namespace's
// default route and the host's fence.
func setupUser(ctx context.Context, p *Plan) (*Attachment, error) {
	a := &Attachment{Names: p.Names, Network: &driver.Network{User: true, Guest: p.Guest}}
	n := p.Names
	ns, err := newNetNS()
	if err != nil {
		return a, err
	}
	a.Network.NetNS = ns
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: n.Veth},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns.Fd())),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return a, fmt.Errorf("network: creating veth %s of step %q: %w", n.Veth, n.Alias, err)
	}
	hl, err := netlink.LinkByName(n.Veth)
	if err != nil {
		return a, fmt.Errorf("network: veth %s: %w", n.Veth, err)
	}
	if err := prepare(hl, n.Alias, 1500); err != nil {
		return a, err
	}
	slot, err := claimSlot(p, hl)
	if err != nil {
		return a, err
	}
	hostIP, _ := addrAt(slot, 1)
	nsIP, _ := addrAt(slot, 2)
	if err := netlink.LinkSetUp(hl); err != nil {
		return a, fmt.Errorf("network: setting %s up: %w", n.Veth, err)
	}

	h, err := netlink.NewHandleAt(netns.NsHandle(int(ns.Fd())))
	if err != nil {
		return a, fmt.Errorf("network: netlink in the step's namespace: %w", err)
	}
	defer h.Close()
	for _, name := range []string{"lo", "eth0"} {
		l, err := h.LinkByName(name)
		if err != nil {
			return a, fmt.Errorf("network: %s in the step's namespace: %w", name, err)
		}
		if name == "eth0" {
			if err := h.LinkSetAlias(l, n.Alias); err != nil {
				return a, fmt.Errorf("network: alias of eth0 in the step's namespace: %w", err)
			}
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(nsIP.AsSlice()), Mask: net.CIDRMask(30, 32)}}); err != nil {
				return a, fmt.Errorf("network: address %v/30 on eth0 in the step's namespace: %w", nsIP, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			return a, fmt.Errorf("network: setting %s up in the step's namespace: %w", name, err)
		}
		if name == "eth0" {
			if err := h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(hostIP.AsSlice())}); err != nil {
				return a, fmt.Errorf("network: default route via %v in the step's namespace: %w", hostIP, err)
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return a, err
	}
	c, err := nftables.New()
	if err != nil {
		return a, fmt.Errorf("network: nftables: %w", err)
	}
	userInetFence(c, p, slot)
	if err := c.Flush(); err != nil {
		return a, fmt.Errorf("network: adding nftables table inet %s: %w", n.Table, err)
	}
	return a, waitOperUp(ctx, n.Veth, 5*time.Second)
}

// claimSlot puts .1 of a free /30 on the veth l. Two steps set up at once
// may pick the same slot: after adding its address each looks again,
// and the one whose interface has the higher index moves on.
func claimSlot(p *Plan, l netlink.Link) (netip.Prefix, error) {
	for try := 0; try < 16; try++ {
		slot, err := userSlot(p)
		if err != nil {
			return netip.Prefix{}, err
		}
		hostIP, _ := addrAt(slot, 1)
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(hostIP.AsSlice()), Mask: net.CIDRMask(30, 32)}}
		if err := netlink.AddrAdd(l, addr); err != nil {
			return netip.Prefix{}, fmt.Errorf("network: address %v/30 on %s: %w", hostIP, l.Attrs().Name, err)
		}
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("network: listing addresses: %w", err)
		}
		lost := false
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if ok && slot.Contains(ip.Unmap()) && a.LinkIndex != l.Attrs().Index && a.LinkIndex < l.Attrs().Index {
				lost = true
			}
		}
		if !lost {
			return slot, nil
		}
		if err := netlink.AddrDel(l, addr); err != nil {
			return netip.Prefix{}, fmt.Errorf("network: moving off %v/30 on %s (taken at the same time): %w", hostIP, l.Attrs().Name, err)
		}
	}
	return netip.Prefix{}, fmt.Errorf("network: no free /30 of [network.user] subnet %v after 16 tries: give a larger [network.user] subnet", p.UserSubnet)
}
