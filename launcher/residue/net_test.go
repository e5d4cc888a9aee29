package residue

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// newNamedNetNS creates the network namespace /run/netns/name (as `ip
// netns add` does) and returns its path; t's cleanup deletes it.
func newNamedNetNS(t *testing.T, name string) string {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name) // and moves this thread into it
	if err != nil {
		t.Fatalf("create network namespace %s: %v", name, err)
	}
	ns.Close()
	if err := netns.Set(orig); err != nil {
		// The thread stays in the new namespace: let it die with the
		// goroutine rather than run others there.
		runtime.LockOSThread()
		t.Fatalf("back to the test's network namespace: %v", err)
	}
	t.Cleanup(func() { _ = netns.DeleteNamed(name) })
	return "/run/netns/" + name
}

// plant adds an interface (a bridge: the test VM's kernel has no dummy
// driver) with alias and an inet nftables table in the namespace at path
// ("" for the test's own).
func plant(t *testing.T, path, link, alias, table string) {
	t.Helper()
	h, fd := netlink.Handle{}, netns.None()
	var err error
	if path != "" {
		if fd, err = netns.GetFromPath(path); err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		hp, err := netlink.NewHandleAt(fd)
		if err != nil {
			t.Fatal(err)
		}
		defer hp.Close()
		h = *hp
	}
	if link != "" {
		d := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: link}}
		if err := h.LinkAdd(d); err != nil {
			t.Fatalf("add bridge %s in %q: %v", link, path, err)
		}
		t.Cleanup(func() { _ = h.LinkDel(d) })
		if alias != "" {
			if err := h.LinkSetAlias(d, alias); err != nil {
				t.Fatal(err)
			}
		}
	}
	if table != "" {
		var opts []nftables.ConnOption
		if path != "" {
			opts = append(opts, nftables.WithNetNSFd(int(fd)))
		}
		c, err := nftables.New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		tb := c.AddTable(&nftables.Table{Name: table, Family: nftables.TableFamilyINet})
		if err := c.Flush(); err != nil {
			t.Fatalf("add nftables table %s in %q: %v", table, path, err)
		}
		t.Cleanup(func() {
			if c, err := nftables.New(opts...); err == nil {
				c.DelTable(tb)
				_ = c.Flush()
			}
		})
	}
}

// TestLeftNet plants step-like network objects (per the predicate: names
// starting rsdt<pid>, which no step uses, so that a residue check of a
// test running meanwhile is not disturbed) in the test's own namespace
// and in a namespace of the scope, one of them before the snapshot, and
// checks that Left names exactly the new ones in each namespace, finds
// nothing once they are gone, and ignores a scope namespace that no
// longer exists.
func TestLeftNet(t *testing.T) {
	prereq.Root(t, "network namespaces, interfaces and nftables tables")
	tag := fmt.Sprintf("rsdt%d", os.Getpid()%100000)
	ns := newNamedNetNS(t, tag+"-res")
	mine := func(name, alias string) bool {
		return strings.HasPrefix(name, tag) || strings.HasPrefix(alias, "residue-test "+tag)
	}
	plant(t, ns, tag+"old", "", tag+"old") // before the snapshot: not blamed
	scope := Scope{TmpDirs: []string{t.TempDir()}, NetNS: []string{ns}, NetLeftover: mine}
	before := Take(scope)
	if left := before.Left(); len(left) != 0 {
		t.Fatalf("left before anything new was planted: %v", left)
	}

	plant(t, ns, "vx0", "residue-test "+tag+" step", tag+"tbl")
	plant(t, "", tag+"h", "", "")
	left := before.Left()
	want := []string{
		`interface vx0 (bridge, alias "residue-test ` + tag + ` step") in network namespace ` + ns,
		"nftables table inet " + tag + "tbl in network namespace " + ns,
		"interface " + tag + `h (bridge, alias "") in network namespace the host's`,
	}
	for _, w := range want {
		found := false
		for _, l := range left {
			found = found || l == w
		}
		if !found {
			t.Errorf("Left does not report %q:\n  %s", w, strings.Join(left, "\n  "))
		}
	}
	if len(left) != len(want) {
		t.Errorf("Left reports %d objects, want %d:\n  %s", len(left), len(want), strings.Join(left, "\n  "))
	}

	// Remove the new ones (the cleanups run last-in first-out; do it
	// now by deleting them by name).
	h, err := netlink.LinkByName(tag + "h")
	if err == nil {
		_ = netlink.LinkDel(h)
	}
	fd, err := netns.GetFromPath(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	hn, err := netlink.NewHandleAt(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer hn.Close()
	if l, err := hn.LinkByName("vx0"); err == nil {
		_ = hn.LinkDel(l)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(fd)))
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(&nftables.Table{Name: tag + "tbl", Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if left := before.WaitClean(context.Background(), 5*time.Second); len(left) > 0 {
		t.Errorf("left:\n  %s", strings.Join(left, "\n  "))
	}

	// The namespace gone (its cluster stopped): nothing to report.
	if err := netns.DeleteNamed(tag + "-res"); err != nil {
		t.Fatal(err)
	}
	if left := before.Left(); len(left) != 0 {
		t.Errorf("Left with the scope's namespace gone: %v", left)
	}
}
