package launcher

import (
	"log/slog"
	"os"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/placement"
)

// placeStep reads where step s runs on the host (launcher/placement: the
// supervisor's affinity within its cpuset, once it sits in the step's
// cgroups) and returns the host CPUs and NUMA nodes the driver pins the
// sandbox to. None (nil) where the CPUs are not the step's own allocation,
// where the driver places nothing (caps.Placement) or where the placement
// cannot be read: each is logged, and the sandbox runs unpinned within the
// step's cpuset, which is what bounds it.
func placeStep(s *Spec, caps driver.Capabilities, r placement.Roots, log *slog.Logger) (cpus, nodes []int) {
	p, err := placement.Of(os.Getpid(), r, s.ID.Job, s.ID.Step)
	if err != nil {
		log.Warn("placement not read: vCPUs not pinned", "err", err)
		return nil, nil
	}
	switch {
	case !p.Known:
		log.Info("placement", "placement", p.String(), "cpuset", p.Cpuset)
		return nil, nil
	case caps.Placement != "":
		log.Info("placement not applied", "placement", p.String(), "reason", caps.Placement)
		return nil, nil
	}
	log.Info("placement", "placement", p.String(), "cpuset", p.Cpuset)
	if p.HasNode {
		nodes = []int{p.Node}
	}
	return p.CPUs, nodes
}
