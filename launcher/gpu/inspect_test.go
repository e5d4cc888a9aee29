package gpu_test

import (
	"context"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu/gpunvml"
)

func TestInspect(t *testing.T) {
	h := dgx(t, "nvidia")
	// GPU 3 (/dev/nvidia3 = 2a:00.0, group 31) shares its group with a NIC.
	h.addPCI(fn{bdf: "0000:2b:00.0", class: 0x020700, vendor: 0x15b3, device: 0x1021, driver: "mlx5_core", group: 31})
	h.holder(77, "nvidia-persistenced", "/dev/nvidia5")
	// gres.conf lists 6 of the 8 GPUs.
	conf := h.gresConf("AutoDetect=off\nNodeName=n1 Name=gpu Type=h200 File=/dev/nvidia[0-5]\n")
	rep := gpu.Inspect(context.Background(), gpu.InspectRequest{GresConf: conf, Node: "n1", Roots: h.roots,
		NVML: gpunvml.NewFrom(dgxNVML()), AllowRebind: true})
	if rep.NoGPUs != "" || len(rep.GPUs) != 6 {
		t.Fatalf("report: %d GPUs, no_gpus %q", len(rep.GPUs), rep.NoGPUs)
	}
	if rep.Passable() {
		t.Error("report passable although GPUs 3 and 5 are not")
	}
	for _, tc := range []struct {
		index    int
		bdf      string
		passable bool
		rule     string
		why      string
	}{
		{0, "0000:3a:00.0", true, "", ""},
		{2, "0000:18:00.0", true, "", ""},
		{3, "0000:2a:00.0", false, "shared-iommu-group", "IOMMU group 31 also holds 0000:2b:00.0 (InfiniBand controller"},
		{5, "0000:db:00.0", false, "busy", "/dev/nvidia5 is held open by nvidia-persistenced (pid 77)"},
	} {
		g := rep.GPUs[tc.index]
		if g.BDF != tc.bdf || g.Passable != tc.passable || !strings.Contains(g.Why, tc.why) ||
			tc.rule != "" && (len(g.Rules) != 1 || g.Rules[0] != tc.rule) {
			t.Errorf("GPU %d: bdf %s passable %v rules %v why %q; want %s %v %s %q", tc.index, g.BDF, g.Passable, g.Rules, g.Why, tc.bdf, tc.passable, tc.rule, tc.why)
		}
	}
	g0 := rep.GPUs[0]
	if g0.Driver != "nvidia" || g0.Minor != 0 || g0.NVMLIndex != 2 || g0.UUID != dgxUUID(2) || g0.MIG != "disabled" ||
		len(g0.Rebind) != 1 || g0.IOMMUGroup != 32 || !strings.HasSuffix(g0.GresWhere, "gres.conf:2") {
		t.Errorf("GPU 0 = %+v", g0)
	}
	if len(rep.Unlisted) != 2 || rep.Unlisted[0].BDF != "0000:9a:00.0" || rep.Unlisted[1].BDF != "0000:ab:00.0" {
		t.Errorf("unlisted %+v, want 9a:00.0 and ab:00.0 (minors 6 and 7)", rep.Unlisted)
	}
	checks := map[string]bool{}
	for _, c := range rep.Host {
		checks[c.Name] = c.OK
	}
	if !checks["iommu"] || !checks["vfio-pci"] || !checks["nvml"] || checks["/dev/vfio"] {
		t.Errorf("host checks %+v (the fake /dev/vfio/vfio is no character device)", rep.Host)
	}
}

func TestInspectNoGresConf(t *testing.T) {
	h := newFakeHost(t)
	rep := gpu.Inspect(context.Background(), gpu.InspectRequest{GresConf: h.path("etc/gres.conf"), Node: "n1", Roots: h.roots})
	if !rep.Passable() || len(rep.GPUs) != 0 || rep.Err() != nil || !rep.GresConfAbsent {
		t.Errorf("no GPUs must be passable (err %v): %+v", rep.Err(), rep)
	}
	if want := "no gres.conf at " + h.path("etc/gres.conf") + ": Slurm has no GPUs configured on this node; no NVIDIA GPU in"; !strings.HasPrefix(rep.NoGPUs, want) {
		t.Errorf("no_gpus %q, want prefix %q", rep.NoGPUs, want)
	}
}

// TestReportErr: a gres.conf that cannot be used, or a configured GPU that
// cannot be passed through, makes the report's Err non-nil; no GPU
// configured for the node does not.
func TestReportErr(t *testing.T) {
	h := dgx(t, "nvidia")
	tests := []struct {
		name, conf, want string
	}{
		{"unparsable", "NodeName=n1 Name=gpu File=/dev/nvidia0 Bogus\n", "gres.conf cannot be used"},
		{"unknown file", "NodeName=n1 Name=gpu File=/dev/nosuchgpu0\n", "cannot be passed through"},
		{"other node only", "NodeName=other Name=gpu File=/dev/nvidia0\n", ""},
		{"passable", "AutoDetect=off\nNodeName=n1 Name=gpu File=/dev/nvidia0\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := gpu.Inspect(context.Background(), gpu.InspectRequest{GresConf: h.gresConf(tt.conf), Node: "n1", Roots: h.roots,
				NVML: gpunvml.NewFrom(dgxNVML()), AllowRebind: true})
			err := rep.Err()
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Err() = %v, want %q (report %+v)", err, tt.want, rep)
			}
		})
	}
}
