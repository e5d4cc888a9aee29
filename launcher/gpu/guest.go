package gpu

import (
	"fmt"
	"strconv"
	"strings"
)

// GuestVisibleDevices is CUDA_VISIBLE_DEVICES for a guest with n GPUs:
// "0,1,...,n-1" ("" for none). The guest enumerates the GPUs in the plan's
// order (one root port each, in ascending guest PCI order).
func GuestVisibleDevices(n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return strings.Join(s, ",")
}

// GuestCUDAVisibleDevices rewrites the task's host CUDA_VISIBLE_DEVICES
// for a guest with n GPUs. Host indices mean nothing in the guest (and
// Slurm renumbers them under ConstrainDevices), so numeric values become
// GuestVisibleDevices(n). UUIDs ("GPU-...", "MIG-...", as Slurm 25.11
// writes) name the same GPUs inside the VM and are kept.
func GuestCUDAVisibleDevices(host string, n int) string {
	if strings.Contains(host, "GPU-") || strings.Contains(host, "MIG-") {
		return host
	}
	return GuestVisibleDevices(n)
}

// Mapping is the allocation on one line for the step's debug log:
//
//	gpus: slurm 0 /dev/nvidia2 0000:18:00.0+0000:18:00.1 group 12 (nvidia) GPU-xxxx -> guest 0; ...
func (p *Plan) Mapping() string {
	if len(p.GPUs) == 0 {
		return "gpus: none"
	}
	parts := make([]string, len(p.GPUs))
	for i, g := range p.GPUs {
		var fs, drv []string
		for _, f := range g.Functions {
			fs = append(fs, f.BDF)
			d := or(f.Driver, "none")
			if f.Rebind {
				d += "->" + VFIODriver
			}
			drv = append(drv, d)
		}
		s := fmt.Sprintf("slurm %d %s %s group %d (%s)", g.Index, g.File, strings.Join(fs, "+"), g.IOMMUGroup, strings.Join(drv, ","))
		if g.UUID != "" {
			s += " " + g.UUID
		}
		parts[i] = s + fmt.Sprintf(" -> guest %d", g.Guest)
	}
	return "gpus: " + strings.Join(parts, "; ")
}
