package residue

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/slurm-microvm/slurm-microvm/launcher/network"
)

// ownNetNS names the caller's own network namespace (the host's, for a
// test run on the host): it is always searched, besides Scope.NetNS.
const ownNetNS = "/proc/self/ns/net"

// netObject is an interface or an nftables table in one namespace.
type netObject struct {
	// key identifies it across snapshots (a recreated interface has a
	// new index, so it is new).
	key  string
	line string
}

// netObjects lists the interfaces and nftables tables of the caller's
// namespace and of each of namespaces that belong to a step (leftover
// reports true for an interface's name and ifalias, or a table's name
// and ""). A namespace that cannot be opened (gone with its cluster) has
// nothing; one whose links or tables cannot be listed is reported, since
// then nothing proves it clean.
func netObjects(namespaces []string, leftover func(name, alias string) bool) []netObject {
	if leftover == nil {
		leftover = network.Leftover
	}
	var out []netObject
	for _, path := range append([]string{ownNetNS}, namespaces...) {
		label := path
		if path == ownNetNS {
			label = "the host's"
		}
		ns, err := netns.GetFromPath(path)
		if err != nil {
			continue
		}
		out = append(out, nsObjects(ns, path, label, leftover)...)
		ns.Close()
	}
	return out
}

func nsObjects(ns netns.NsHandle, path, label string, leftover func(name, alias string) bool) []netObject {
	var out []netObject
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return []netObject{{key: "error " + path, line: fmt.Sprintf("network namespace %s: cannot open netlink in it: %v", label, err)}}
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		out = append(out, netObject{key: "error links " + path, line: fmt.Sprintf("network namespace %s: list interfaces: %v", label, err)})
	}
	for _, l := range links {
		a := l.Attrs()
		if leftover(a.Name, a.Alias) {
			out = append(out, netObject{
				key:  fmt.Sprintf("link %s %d %s %s", path, a.Index, a.Name, a.Alias),
				line: fmt.Sprintf("interface %s (%s, alias %q) in network namespace %s", a.Name, l.Type(), a.Alias, label),
			})
		}
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return append(out, netObject{key: "error nft " + path, line: fmt.Sprintf("network namespace %s: nftables: %v", label, err)})
	}
	tables, err := conn.ListTables()
	if err != nil {
		return append(out, netObject{key: "error nft " + path, line: fmt.Sprintf("network namespace %s: list nftables tables: %v", label, err)})
	}
	for _, t := range tables {
		if leftover(t.Name, "") {
			out = append(out, netObject{
				key:  fmt.Sprintf("table %s %d %s", path, t.Family, t.Name),
				line: fmt.Sprintf("nftables table %s %s in network namespace %s", network.FamilyName(t.Family), t.Name, label),
			})
		}
	}
	return out
}
