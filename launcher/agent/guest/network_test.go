package guest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
)

func validNetwork() *api.Network {
	return &api.Network{
		Mac: []byte{0x52, 0x54, 0, 0x12, 0x34, 0x56}, Address: "10.99.0.2/24", Mtu: 1400, Gateway: "10.99.0.1",
		Routes:    []*api.Route{{Destination: "10.98.0.0/16", Via: "10.99.0.1"}},
		Neighbors: []*api.Neighbor{{Address: "10.99.0.3", Mac: []byte{0x52, 0x54, 0, 0, 0, 3}}},
		Hosts:     []*api.HostEntry{{Address: "10.99.0.3", Names: []string{"node2", "node2.cluster"}}},
		Dns:       []string{"10.99.0.1"},
	}
}

func TestParseNetwork(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*api.Network)
		wantErr string // "" : valid
	}{
		{name: "valid"},
		{name: "minimal", mod: func(n *api.Network) {
			n.Mtu, n.Gateway, n.Routes, n.Neighbors, n.Hosts, n.Dns = 0, "", nil, nil, nil, nil
		}},
		{name: "IPv6", mod: func(n *api.Network) {
			n.Address, n.Gateway, n.Routes, n.Neighbors, n.Dns = "fd00:99::2/64", "fd00:99::1", nil, nil, nil
		}},
		{name: "short MAC", mod: func(n *api.Network) { n.Mac = n.Mac[:5] }, wantErr: "network.mac: 5 bytes"},
		{name: "multicast MAC", mod: func(n *api.Network) { n.Mac[0] = 0x01 }, wantErr: "network.mac 01:54:00:12:34:56: not a unicast"},
		{name: "zero MAC", mod: func(n *api.Network) { n.Mac = make([]byte, 6) }, wantErr: "not a unicast"},
		{name: "no prefix length", mod: func(n *api.Network) { n.Address = "10.99.0.2" }, wantErr: "give an address with its prefix length"},
		{name: "loopback address", mod: func(n *api.Network) { n.Address = "127.0.0.2/8"; n.Gateway, n.Routes, n.Neighbors = "", nil, nil }, wantErr: "not a unicast host address"},
		{name: "network address", mod: func(n *api.Network) { n.Address = "10.99.0.0/24" }, wantErr: "network or broadcast"},
		{name: "broadcast address", mod: func(n *api.Network) { n.Address = "10.99.0.255/24" }, wantErr: "network or broadcast"},
		{name: "mapped address", mod: func(n *api.Network) { n.Address = "::ffff:10.99.0.2/120" }, wantErr: "IPv4-mapped"},
		{name: "MTU too small", mod: func(n *api.Network) { n.Mtu = 60 }, wantErr: "network.mtu 60: out of range 68-65535"},
		{name: "IPv6 MTU too small", mod: func(n *api.Network) {
			n.Address, n.Gateway, n.Routes, n.Neighbors, n.Mtu = "fd00:99::2/64", "", nil, nil, 1200
		}, wantErr: "out of range 1280"},
		{name: "gateway off link", mod: func(n *api.Network) { n.Gateway = "10.98.0.1" }, wantErr: `network.gateway "10.98.0.1": not on the link`},
		{name: "gateway is self", mod: func(n *api.Network) { n.Gateway = "10.99.0.2" }, wantErr: "own address"},
		{name: "gateway other family", mod: func(n *api.Network) { n.Gateway = "fd00::1" }, wantErr: "family"},
		{name: "route host bits", mod: func(n *api.Network) { n.Routes[0].Destination = "10.98.1.1/16" }, wantErr: "host bits set; give 10.98.0.0/16"},
		{name: "route via off link", mod: func(n *api.Network) { n.Routes[0].Via = "192.168.0.1" }, wantErr: "network.routes[0].via"},
		{name: "neighbor off link", mod: func(n *api.Network) { n.Neighbors[0].Address = "10.100.0.3" }, wantErr: "network.neighbors[0].address"},
		{name: "neighbor MAC", mod: func(n *api.Network) { n.Neighbors[0].Mac = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} }, wantErr: "network.neighbors[0].mac"},
		{name: "host name with a space", mod: func(n *api.Network) { n.Hosts[0].Names = []string{"a b"} }, wantErr: "network.hosts[0]: host name \"a b\""},
		{name: "host name with a comment", mod: func(n *api.Network) { n.Hosts[0].Names = []string{"x#y"} }, wantErr: "RFC 1123"},
		{name: "host without names", mod: func(n *api.Network) { n.Hosts[0].Names = nil }, wantErr: "with no name"},
		{name: "host bad address", mod: func(n *api.Network) { n.Hosts[0].Address = "node1" }, wantErr: "network.hosts[0].address"},
		{name: "too many name servers", mod: func(n *api.Network) { n.Dns = []string{"1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"} }, wantErr: "at most 3"},
		{name: "bad name server", mod: func(n *api.Network) { n.Dns = []string{"0.0.0.0"} }, wantErr: "network.dns[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := validNetwork()
			if tt.mod != nil {
				tt.mod(n)
			}
			c, err := parseNetwork(n)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.addr.String() != n.Address || c.mac.String() != "52:54:00:12:34:56" {
					t.Errorf("parsed %+v", c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestHostsFile(t *testing.T) {
	c, err := parseNetwork(validNetwork())
	if err != nil {
		t.Fatal(err)
	}
	got := string(hostsFile(c, "node1"))
	for _, want := range []string{"127.0.0.1\tlocalhost\n", "::1\tlocalhost", "10.99.0.3\tnode2 node2.cluster\n", "10.99.0.2\tnode1\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("hosts lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "127.0.1.1") {
		t.Errorf("the host name must map to the interface's address, not a loopback one:\n%s", got)
	}
	// Named by an entry: not added again.
	if got := string(hostsFile(c, "node2")); strings.Count(got, "node2") != 2 {
		t.Errorf("node2 named twice or not at all:\n%s", got)
	}
	if resolvConf(c) == nil || !strings.Contains(string(resolvConf(c)), "nameserver 10.99.0.1\n") {
		t.Errorf("resolv.conf %q", resolvConf(c))
	}
	c.dns = nil
	if resolvConf(c) != nil {
		t.Error("resolv.conf written without name servers")
	}
}

// TestWriteEtc: /etc/hosts and /etc/resolv.conf replace an image symlink
// instead of following it, and stay inside the root when /etc itself is an
// absolute symlink; a missing /etc is created.
func TestWriteEtc(t *testing.T) {
	outside := t.TempDir()
	target := filepath.Join(outside, "victim")
	if err := os.WriteFile(target, []byte("keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("symlinked file", func(t *testing.T) {
		root := t.TempDir()
		os.Mkdir(filepath.Join(root, "etc"), 0o755)
		if err := os.Symlink(target, filepath.Join(root, "etc/resolv.conf")); err != nil {
			t.Fatal(err)
		}
		if err := writeEtc(root, "resolv.conf", []byte("nameserver 10.0.2.3\n")); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(filepath.Join(root, "etc/resolv.conf"))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
			t.Fatalf("resolv.conf: %v %v, want a 0644 file", fi, err)
		}
		if b, _ := os.ReadFile(target); string(b) != "keep\n" {
			t.Errorf("the symlink's target was written: %q", b)
		}
	})
	t.Run("symlinked etc", func(t *testing.T) {
		root := t.TempDir()
		os.MkdirAll(filepath.Join(root, "usr/etc"), 0o755)
		if err := os.Symlink(outside, filepath.Join(root, "etc")); err != nil {
			t.Fatal(err)
		}
		// An absolute link resolves inside the root: outside's path
		// below root does not exist and is created there.
		if err := writeEtc(root, "victim", []byte("x\n")); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(target); string(b) != "keep\n" {
			t.Errorf("a file outside the root was written: %q", b)
		}
		if b, err := os.ReadFile(filepath.Join(root, outside, "victim")); err != nil || string(b) != "x\n" {
			t.Errorf("in-root target: %q %v", b, err)
		}
	})
	t.Run("no etc", func(t *testing.T) {
		root := t.TempDir()
		if err := writeEtc(root, "hosts", []byte("127.0.0.1\tlocalhost\n")); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(root, "etc/hosts")); err != nil || !strings.Contains(string(b), "localhost") {
			t.Errorf("hosts %q %v", b, err)
		}
	})
}

func TestAllowPingSockets(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ping_group_range")
	if err := os.WriteFile(p, []byte("1\t0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := allowPingSockets(p); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "0 2147483647\n" {
		t.Errorf("ping_group_range %q, want every gid", b)
	}
	if err := allowPingSockets(filepath.Join(t.TempDir(), "missing", "x")); err == nil || !strings.Contains(err.Error(), "allow ping sockets") {
		t.Errorf("missing file: %v", err)
	}
}
