//go:build smv_gpu_standin

package launcher

import (
	"os"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
)

// standinGPUs, in the end-to-end tests' build only (tag smv_gpu_standin,
// test/harness), stands in for the hardware this project's test machines
// lack: when every GPU of the step is a gres.conf entry of Type=standin,
// it reports their number and the step boots without VFIO passthrough
// (there is no device to pass), so that everything else a GPU step does
// (the devices cgroup check, the node's driver set, its loading in the
// guest) runs for real. Production builds do not contain this file.
func standinGPUs(stepGPUs, gresConf string) (int, bool) {
	idx, err := gpu.ParseStepGPUs(stepGPUs)
	if err != nil || len(idx) == 0 {
		return 0, false
	}
	host, _ := os.Hostname()
	host, _, _ = strings.Cut(host, ".")
	gc, err := gpu.LoadGresConf(gresConf, host)
	if err != nil {
		return 0, false
	}
	types := map[int]string{}
	for _, d := range gc.Devices {
		types[d.Index] = d.Type
	}
	for _, i := range idx {
		if types[i] != "standin" {
			return 0, false
		}
	}
	return len(idx), true
}
