package gpu_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu/gpunvml"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestRealNode reads this host's real sysfs, procfs and NVML (read-only)
// on a node with the NVIDIA driver: for a gres.conf listing every GPU by
// its /dev/nvidia<minor>, the mapping through /proc/driver/nvidia must give
// the PCI address and UUID NVML gives for that minor. Skipped without NVML.
func TestRealNode(t *testing.T) {
	lib := gpunvml.New()
	devs, err := lib.Devices(context.Background())
	if err != nil {
		prereq.Hardware(t, "no NVIDIA GPUs here: %v", err)
	}
	if len(devs) == 0 {
		prereq.Hardware(t, "NVML lists no GPUs")
	}
	var files []string
	for _, d := range devs {
		files = append(files, fmt.Sprintf("/dev/nvidia%d", d.Minor))
		t.Logf("NVML %d: minor %d %s %s %s MIG %s, %d process(es)", d.Index, d.Minor, d.BDF, d.UUID, d.Name, d.MIG, len(d.Processes))
	}
	conf := t.TempDir() + "/gres.conf"
	writeFile(t, conf, "AutoDetect=off\nName=gpu File="+strings.Join(files, ",")+"\n")
	rep := gpu.Inspect(context.Background(), gpu.InspectRequest{GresConf: conf, Node: "any", NVML: lib})
	for _, c := range rep.Host {
		t.Logf("host %s: ok=%v %s", c.Name, c.OK, c.Detail)
	}
	if len(rep.GPUs) != len(devs) {
		t.Fatalf("report has %d GPUs, NVML %d", len(rep.GPUs), len(devs))
	}
	for i, g := range rep.GPUs {
		d := devs[i]
		t.Logf("GPU %d %s: %s group %d driver %s passable=%v %s", g.Index, g.File, g.BDF, g.IOMMUGroup, g.Driver, g.Passable, g.Why)
		if g.BDF != d.BDF || g.UUID != d.UUID || g.Minor != d.Minor || g.NVMLIndex != d.Index {
			t.Errorf("%s: mapped to %s %s minor %d nvml %d; NVML says %s %s minor %d nvml %d",
				g.File, g.BDF, g.UUID, g.Minor, g.NVMLIndex, d.BDF, d.UUID, d.Minor, d.Index)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
