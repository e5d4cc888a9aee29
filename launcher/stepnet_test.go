package launcher

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

func TestParseNodeAddrs(t *testing.T) {
	// As Slurm 22.05's `scontrol --oneliner show node n[1-2]` prints it
	// (OS= holds spaces).
	out := "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=10.250.0.11 NodeHostName=vm Version=22.05.8 OS=Linux 6.1.0-57-amd64 #1 SMP RealMemory=2000\n" +
		"NodeName=n2 Arch=x86_64 NodeAddr=node2.example NodeHostName=vm\n"
	m, err := parseNodeAddrs([]byte(out))
	if err != nil || m["n1"] != "10.250.0.11" || m["n2"] != "node2.example" || len(m) != 2 {
		t.Fatalf("parseNodeAddrs = %v, %v", m, err)
	}
	if _, err := parseNodeAddrs([]byte("No nodes in the system\n")); err == nil || !strings.Contains(err.Error(), "no NodeName=/NodeAddr= line") {
		t.Errorf("empty output: %v", err)
	}
}

// The network plan's refusals and the cases that need no network device,
// before anything is made on the host.
func TestPlanNetworkModes(t *testing.T) {
	tests := []struct {
		name, mode, nodes, node string
		siteMode                string
		nnodes, index           int
		allow                   []string
		wantErr                 string
		wantNone                bool
	}{
		{name: "none", mode: "none", nodes: "n[1-2]", node: "n1", wantNone: true},
		{name: "one-node step", mode: "", nodes: "n1", node: "n1", wantNone: true},
		{name: "user not allowed", mode: "user", nodes: "n1", node: "n1", wantErr: `"user" is not allowed on this cluster`},
		{name: "user multi-node", mode: "user", nodes: "n[1-2]", node: "n1", allow: []string{"user"}, wantErr: "user mode is outbound NAT for one-node steps, and this step has 2 nodes"},
		{name: "user by the site, multi-node", siteMode: "user", nodes: "n[1-2]", node: "n1", wantErr: "network mode user (the site's [network] mode): user mode is outbound NAT"},
		{name: "node list longer than the step", mode: "step", nodes: "n[1-3]", node: "n1", nnodes: 2, wantErr: "does not match slurmstepd's step (2 nodes"},
		{name: "node list without this node at its index", mode: "step", nodes: "n[1-2]", node: "n1", nnodes: 2, index: 1, wantErr: "this node n1 at index 1"},
		{name: "bad mode", mode: "host", nodes: "n1", node: "n1", wantErr: `"host" is not a mode`},
		{name: "bad nodelist", mode: "step", nodes: "n[2-1]", node: "n1", wantErr: "SLURM_STEP_NODELIST"},
		{name: "no node name", mode: "step", nodes: "n[1-2]", node: "", wantErr: "no Slurm node name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Defaults()
			cfg.RuntimeDir = t.TempDir()
			if tt.allow != nil {
				cfg.Network.Allow = tt.allow
			}
			if tt.siteMode != "" {
				cfg.Network.Mode = tt.siteMode
			}
			l := &Launcher{Config: &cfg}
			s := &Spec{ID: state.StepID{Job: 3, Node: tt.node}, Nodes: tt.nodes, Network: tt.mode, NNodes: tt.nnodes, NodeIndex: tt.index}
			d := state.Dir{Root: cfg.RuntimeDir, ID: s.ID}
			n, done, err := l.planNetwork(context.Background(), s, d, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			done()
			if tt.wantNone && n != nil {
				t.Errorf("got a network %+v, want none", n)
			}
		})
	}
}
