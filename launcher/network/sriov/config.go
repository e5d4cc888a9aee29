package sriov

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// Config is [network.sriov] of microvm.toml.
//
//	[network.sriov]
//	pfs = ["0000:3b:00.0"]   # or ["ib0"], ["mlx5_0"]: PCI address, netdev or RDMA device
//	allow_rebind = false     # VFs must already be on vfio-pci
//
// No PFs (the default) means no VF passthrough on this node.
type Config struct {
	// PFs are the physical functions whose virtual functions steps may
	// get, by PCI address ("0000:3b:00.0", "3b:00.0"), network interface
	// ("ib0", "ens1f0np0") or RDMA device ("mlx5_0"). VFs are taken in
	// this order, then by VF number.
	PFs []string `toml:"pfs" json:"pfs"`
	// AllowRebind lets a step move its VF from the host's driver
	// (mlx5_core) to vfio-pci, and back at stop. Without it every VF a
	// step may get must be on vfio-pci already (ErrWrongDriver).
	AllowRebind bool `toml:"allow_rebind" json:"allow_rebind"`
}

// Enabled tells whether the node offers VFs at all.
func (c Config) Enabled() bool { return len(c.PFs) > 0 }

// Validate checks the keys and normalises PCI addresses in place. Errors
// wrap ErrConfig and name the key (network.sriov.pfs), the value and the
// rule.
func (c *Config) Validate() error {
	seen := map[string]bool{}
	for i, s := range c.PFs {
		t := strings.TrimSpace(s)
		if bdf, err := pci.NormalizeBDF(t); err == nil {
			t = bdf
		} else if !validIfName(t) {
			return fmt.Errorf("%w: network.sriov.pfs[%d] = %q is neither a PCI address (0000:3b:00.0) nor an interface or RDMA device name (1-15 characters, no '/', ':' or white space)", ErrConfig, i, s)
		}
		if seen[t] {
			return fmt.Errorf("%w: network.sriov.pfs lists %q twice", ErrConfig, t)
		}
		seen[t] = true
		c.PFs[i] = t
	}
	return nil
}

// validIfName follows the kernel's dev_valid_name (IFNAMSIZ 16 with the
// NUL); RDMA device names (IB_DEVICE_NAME_MAX 64) are held to the same,
// shorter rule, which mlx5_<n> names meet.
func validIfName(s string) bool {
	if s == "" || len(s) > 15 || s == "." || s == ".." {
		return false
	}
	return !strings.ContainsAny(s, "/: \t\n\x00")
}

// DefaultClaimDir is the node's claim directory under the runtime
// directory: <runtime_dir>/sriov-claims/<node>, one per Slurm node name
// so that several slurmd on one host (multiple-slurmd) keep separate
// pools. The name cannot be taken for a step's state directory
// (<job>.<step>.<restart>).
func DefaultClaimDir(runtimeDir, node string) string {
	return filepath.Join(runtimeDir, "sriov-claims", node)
}
