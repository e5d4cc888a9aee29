package harness

import (
	"context"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestSetupTwoNodes: SetupWith(t, TwoNodes) installs the plugin on the
// two-node cluster: a plain step (no --microvm) runs a task on each node
// with the plugin loaded, and the residue scope searches both nodes'
// network namespaces.
func TestSetupTwoNodes(t *testing.T) {
	if testing.Short() {
		prereq.OptIn(t, "-short: builds and installs the launcher")
	}
	e := SetupWith(t, TwoNodes)
	if got := e.Nodes(); !slices.Equal(got, []string{"n1", "n2"}) {
		t.Fatalf("Nodes() = %q, want [n1 n2]", got)
	}
	want := []string{e.C.NodeNetNS("n1"), e.C.NodeNetNS("n2")}
	if got := e.Scope().NetNS; !slices.Equal(got, want) || want[0] == "" || want[1] == "" {
		t.Errorf("Scope().NetNS = %q, want the nodes' namespaces %q", got, want)
	}
	e.Run(t, "plain step on both nodes", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stdout, stderr, code, err := e.C.Srun(ctx, "", "-N2", "-n2", "-l", "printenv", "SLURMD_NODENAME")
		if err != nil || code != 0 {
			t.Fatalf("srun: exit %d, %v: %s", code, err, stderr)
		}
		got := strings.Split(strings.TrimSpace(stdout), "\n")
		sort.Strings(got)
		if want := []string{"0: n1", "1: n2"}; !slices.Equal(got, want) {
			t.Errorf("srun -N2 -n2 -l printenv SLURMD_NODENAME: %q, want %q", got, want)
		}
	})
}
