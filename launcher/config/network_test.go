package config

import (
	"slices"
	"strings"
	"testing"
)

func TestNetworkConfig(t *testing.T) {
	tests := []struct {
		name, toml, wantErr string
	}{
		{name: "defaults"},
		{name: "all keys", toml: `[network]
mode = "none"
allow = ["step", "user"]
subnet = "10.9.0.0/20"
vxlan_port = 8472
mtu = 1400
scontrol = "/usr/bin/scontrol"
[[network.services]]
prefix = "10.0.0.53"
proto = "udp"
port = 53
[network.user]
subnet = "100.65.0.0/16"
allow = ["10.1.2.0/24"]
`},
		{name: "bad mode", toml: "[network]\nmode = \"bridge\"", wantErr: `network.mode: "bridge" must be one of none, step, user`},
		{name: "bad allow", toml: "[network]\nallow = [\"step\", \"host\"]", wantErr: `network.allow: entry 2: "host"`},
		{name: "subnet host bits", toml: "[network]\nsubnet = \"10.224.0.1/16\"", wantErr: "has host bits set"},
		{name: "subnet too small", toml: "[network]\nsubnet = \"10.224.0.0/30\"", wantErr: "want /29 or larger"},
		{name: "subnet v6", toml: "[network]\nsubnet = \"fd00::/64\"", wantErr: "is not an IPv4 prefix"},
		{name: "port", toml: "[network]\nvxlan_port = 0", wantErr: "network.vxlan_port: 0 must be a UDP port"},
		{name: "mtu", toml: "[network]\nmtu = 100", wantErr: "network.mtu: 100"},
		{name: "service proto", toml: "[[network.services]]\nprefix = \"10.0.0.1\"\nproto = \"icmp\"", wantErr: `entry 1: proto "icmp" must be tcp or udp`},
		{name: "service prefix", toml: "[[network.services]]\nprefix = \"dns\"\nproto = \"udp\"", wantErr: `entry 1: prefix: "dns" is not an IPv4 address`},
		{name: "user allow", toml: "[network.user]\nallow = [\"x\"]", wantErr: "network.user.allow: entry 1"},
		{name: "unknown key", toml: "[network]\nmodes = \"step\"", wantErr: "network.modes: unknown key"},
		{name: "service in the guest subnet", toml: "[[network.services]]\nprefix = \"10.224.0.53\"\nproto = \"udp\"", wantErr: "entry 1: prefix 10.224.0.53/32 lies in [network] subnet 10.224.0.0/16"},
		{name: "user subnet overlaps", toml: "[network]\nsubnet = \"100.64.0.0/16\"", wantErr: "network.user.subnet: 100.64.0.0/16 overlaps [network] subnet"},
		{name: "user subnet public", toml: "[network.user]\nsubnet = \"0.0.0.0/0\"", wantErr: "is not inside private (RFC 1918"},
		{name: "sriov pfs", toml: "[network.sriov]\npfs = [\"ib0\", \"ib0\"]", wantErr: `network.sriov.pfs: `},
		{name: "sriov ok", toml: "[network.sriov]\npfs = [\"0000:3b:00.0\", \"mlx5_0\"]\nallow_rebind = true"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("microvm.toml", []byte(tt.toml))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.name == "all keys" {
				if c.Network.Mode != "none" || !slices.Equal(c.Network.Allow, []string{"step", "user"}) || c.Network.VXLANPort != 8472 ||
					len(c.Network.ParsedServices()) != 1 || c.Network.ParsedServices()[0].Prefix.String() != "10.0.0.53/32" ||
					c.Network.ParsedUserSubnet().String() != "100.65.0.0/16" || len(c.Network.ParsedUserAllow()) != 1 {
					t.Errorf("decoded %+v", c.Network)
				}
			}
			if tt.name == "defaults" && (c.Network.Mode != "step" || c.Network.ParsedSubnet().String() != "10.224.0.0/16") {
				t.Errorf("defaults %+v", c.Network)
			}
		})
	}
}

func TestNetworkMode(t *testing.T) {
	n := defaultNetwork()
	tests := []struct{ in, want, wantErr string }{
		{"", "step", ""},
		{"none", "none", ""},
		{"step", "step", ""},
		{"user", "", `"user" is not allowed on this cluster (allowed: step, none`},
		{"bridge", "", `"bridge" is not a mode`},
	}
	for _, tt := range tests {
		got, err := n.NetworkMode(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("NetworkMode(%q) = %q, %v; want error %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("NetworkMode(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}
