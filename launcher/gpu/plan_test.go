package gpu_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu/gpunvml"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

const (
	gresVFIO   = "# HGX H200, GPUs bound to vfio-pci\nAutoDetect=off\nNodeName=n1 Name=gpu Type=h200 File=/dev/vfio/[30-37]\n"
	gresNVIDIA = "AutoDetect=off\nNodeName=n1 Name=gpu Type=h200 File=/dev/nvidia[0-7]\n"
)

// wantGPU is what a planned GPU must look like.
type wantGPU struct {
	index  int
	bdfs   []string // functions, GPU first
	group  int
	rebind []bool // per function; nil: none
	nvml   int    // NVML index; 0 means "don't check"
	uuid   string
}

func TestPlan(t *testing.T) {
	nvmlWith := func(edit func(s *server.Server)) func() gpu.NVML {
		return func() gpu.NVML {
			s := dgxNVML()
			if edit != nil {
				edit(s)
			}
			return gpunvml.NewFrom(s)
		}
	}
	noNVML := func() gpu.NVML {
		return gpunvml.NewFrom(&mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }})
	}
	l40sHost := func(gpuDrv, audioDrv string) func(t *testing.T) *fakeHost {
		return func(t *testing.T) *fakeHost {
			h := newFakeHost(t)
			for _, f := range l40s("0000:41:00.0", 50, gpuDrv, audioDrv) {
				h.addPCI(f)
			}
			if gpuDrv == "nvidia" {
				h.nvidiaProc("0000:41:00.0", 0, "GPU-l40s")
			}
			return h
		}
	}
	vfioDGX := func(t *testing.T) *fakeHost { return dgx(t, gpu.VFIODriver) }
	nvidiaDGX := func(t *testing.T) *fakeHost { return dgx(t, "nvidia") }
	// twoInGroup: GPUs 18:00.0 and 2a:00.0 share IOMMU group 30 (no ACS).
	twoInGroup := func(t *testing.T) *fakeHost {
		h := newFakeHost(t)
		for i, b := range dgxBDFs[:2] {
			for _, f := range h200(b, 30, "nvidia") {
				h.addPCI(f)
			}
			h.nvidiaProc(b, i, dgxUUID(i))
		}
		return h
	}

	tests := []struct {
		name    string
		host    func(t *testing.T) *fakeHost
		edit    func(h *fakeHost) // after building the host
		gres    string
		step    string
		nvml    func() gpu.NVML
		rebind  bool
		mem     uint64
		want    []wantGPU
		wantErr error
		wantMsg []string
	}{
		{name: "1 GPU, vfio-pci", host: vfioDGX, gres: gresVFIO, step: "0",
			want: []wantGPU{{index: 0, bdfs: []string{"0000:18:00.0"}, group: 30}}},
		{name: "2 GPUs, vfio-pci", host: vfioDGX, gres: gresVFIO, step: "0,1",
			want: []wantGPU{{index: 0, bdfs: []string{"0000:18:00.0"}, group: 30}, {index: 1, bdfs: []string{"0000:2a:00.0"}, group: 31}}},
		{name: "8 GPUs, vfio-pci", host: vfioDGX, gres: gresVFIO, step: "0,1,2,3,4,5,6,7",
			want: func() []wantGPU {
				var w []wantGPU
				for i, b := range dgxBDFs {
					w = append(w, wantGPU{index: i, bdfs: []string{b}, group: dgxGroup(i)})
				}
				return w
			}()},
		{name: "non-contiguous 0,1,4,5, vfio-pci", host: vfioDGX, gres: gresVFIO, step: "0,1,4,5",
			want: []wantGPU{{index: 0, bdfs: []string{dgxBDFs[0]}, group: 30}, {index: 1, bdfs: []string{dgxBDFs[1]}, group: 31},
				{index: 4, bdfs: []string{dgxBDFs[4]}, group: 34}, {index: 5, bdfs: []string{dgxBDFs[5]}, group: 35}}},
		{name: "non-contiguous 0,1,4,5, nvidia minors via procfs, rebind", host: nvidiaDGX, gres: gresNVIDIA, step: "0,1,4,5", rebind: true,
			nvml: nvmlWith(nil),
			// /dev/nvidia0 is minor 0 = NVML index 2 = 3a:00.0, and so on.
			want: []wantGPU{
				{index: 0, bdfs: []string{"0000:3a:00.0"}, group: 32, rebind: []bool{true}, nvml: 2, uuid: dgxUUID(2)},
				{index: 1, bdfs: []string{"0000:5d:00.0"}, group: 33, rebind: []bool{true}, nvml: 3, uuid: dgxUUID(3)},
				{index: 4, bdfs: []string{"0000:ba:00.0"}, group: 36, rebind: []bool{true}, nvml: 6, uuid: dgxUUID(6)},
				{index: 5, bdfs: []string{"0000:db:00.0"}, group: 37, rebind: []bool{true}, nvml: 7, uuid: dgxUUID(7)},
			}},
		{name: "minor != NVML index, minors from NVML only", host: nvidiaDGX, gres: gresNVIDIA, step: "2", rebind: true,
			edit: func(h *fakeHost) { os.RemoveAll(h.path("proc/driver")) },
			nvml: nvmlWith(nil),
			// /dev/nvidia2 is minor 2, which NVML reports for index 0.
			want: []wantGPU{{index: 2, bdfs: []string{"0000:18:00.0"}, group: 30, rebind: []bool{true}, nvml: 0, uuid: dgxUUID(0)}}},
		{name: "audio function in the group", host: l40sHost(gpu.VFIODriver, gpu.VFIODriver), gres: "Name=gpu File=/dev/vfio/50\n", step: "0",
			want: []wantGPU{{index: 0, bdfs: []string{"0000:41:00.0", "0000:41:00.1"}, group: 50}}},
		{name: "audio function on the wrong driver, refused", host: l40sHost(gpu.VFIODriver, "snd_hda_intel"), gres: "Name=gpu File=/dev/vfio/50\n", step: "0",
			wantErr: gpu.ErrWrongDriver, wantMsg: []string{"GPU 0 (/dev/vfio/50, 0000:41:00.1)", "audio device", "bound to snd_hda_intel, not vfio-pci", "driverctl set-override 0000:41:00.1 vfio-pci"}},
		{name: "audio function on the wrong driver, rebound", host: l40sHost(gpu.VFIODriver, "snd_hda_intel"), gres: "Name=gpu File=/dev/vfio/50\n", step: "0", rebind: true,
			want: []wantGPU{{index: 0, bdfs: []string{"0000:41:00.0", "0000:41:00.1"}, group: 50, rebind: []bool{false, true}}}},
		{name: "GPU on nvidia without rebinding, refused", host: nvidiaDGX, gres: gresNVIDIA, step: "0", nvml: nvmlWith(nil),
			wantErr: gpu.ErrWrongDriver, wantMsg: []string{"GPU 0 (/dev/nvidia0, 0000:3a:00.0)", "bound to nvidia, not vfio-pci"}},
		{name: "group shared with an unallocated NIC", host: vfioDGX, gres: gresVFIO, step: "0",
			edit: func(h *fakeHost) {
				h.addPCI(fn{bdf: "0000:19:00.0", class: 0x020700, vendor: 0x15b3, device: 0x1021, driver: "mlx5_core", group: 30})
			},
			wantErr: gpu.ErrSharedGroup, wantMsg: []string{"GPU 0 (/dev/vfio/30, 0000:18:00.0)", "IOMMU group 30 also holds 0000:19:00.0 (InfiniBand controller [15b3:1021], driver mlx5_core)"}},
		{name: "group shared with an unallocated GPU", host: twoInGroup, gres: "NodeName=n1 Name=gpu File=/dev/nvidia[0-1]\n", step: "0", rebind: true,
			wantErr: gpu.ErrSharedGroup, wantMsg: []string{"0000:2a:00.0 (3D controller [10de:2335], driver nvidia) = GPU 1, not allocated to this step"}},
		{name: "group shared by two allocated GPUs", host: twoInGroup, gres: "NodeName=n1 Name=gpu File=/dev/nvidia[0-1]\n", step: "0,1", rebind: true,
			want: []wantGPU{{index: 0, bdfs: []string{dgxBDFs[0]}, group: 30, rebind: []bool{true}}, {index: 1, bdfs: []string{dgxBDFs[1]}, group: 30, rebind: []bool{true}}}},
		{name: "a bridge in the group stays", host: vfioDGX, gres: gresVFIO, step: "0",
			edit: func(h *fakeHost) {
				h.addPCI(fn{bdf: "0000:17:00.0", class: 0x060400, vendor: 0x1000, device: 0xc030, driver: "pcieport", group: 30})
			},
			want: []wantGPU{{index: 0, bdfs: []string{"0000:18:00.0"}, group: 30}}},
		{name: "MIG enabled", host: nvidiaDGX, gres: gresNVIDIA, step: "0", rebind: true,
			nvml:    nvmlWith(func(s *server.Server) { s.Devices[2].(*server.Device).MigMode = nvml.DEVICE_MIG_ENABLE }),
			wantErr: gpu.ErrMIGEnabled, wantMsg: []string{"GPU 0 (/dev/nvidia0, 0000:3a:00.0): MIG mode is enabled", "nvidia-smi -i 2 -mig 0"}},
		{name: "index not in gres.conf", host: vfioDGX, gres: "NodeName=n1 Name=gpu File=/dev/vfio/[30-33]\n", step: "0,4",
			wantErr: gpu.ErrNotInGresConf, wantMsg: []string{`GPU 4: not in gres.conf:`, `lists 4 gpu device files (indices 0-3) for node "n1"`}},
		{name: "gres.conf lines of other nodes do not count", host: vfioDGX, gres: "NodeName=n2 Name=gpu File=/dev/vfio/[30-37]\n", step: "0",
			wantErr: gpu.ErrNotInGresConf, wantMsg: []string{`lists no gpu device files for node "n1"`}},
		{name: "NVML lists a process on a GPU to rebind", host: nvidiaDGX, gres: gresNVIDIA, step: "0", rebind: true,
			nvml: nvmlWith(func(s *server.Server) {
				s.Devices[2].(*server.Device).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
					return []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 3 << 30}}, nvml.SUCCESS
				}
			}),
			wantErr: gpu.ErrBusy, wantMsg: []string{"NVML lists processes running on it: pid 4242 (3072 MiB)"}},
		{name: "nvidia-persistenced holds the GPU to rebind", host: nvidiaDGX, gres: gresNVIDIA, step: "0", rebind: true, nvml: nvmlWith(nil),
			edit:    func(h *fakeHost) { h.holder(77, "nvidia-persistenced", "/dev/nvidia0") },
			wantErr: gpu.ErrBusy, wantMsg: []string{"/dev/nvidia0 is held open by nvidia-persistenced (pid 77)", "nvidia-smi drain -p 0000:3a:00.0 -m 1"}},
		{name: "VFIO-style entry whose GPU nvidia still has, held open", host: nvidiaDGX, gres: gresVFIO, step: "0", rebind: true,
			edit:    func(h *fakeHost) { h.holder(78, "python3", "/dev/nvidia2") },
			wantErr: gpu.ErrBusy, wantMsg: []string{"GPU 0 (/dev/vfio/30, 0000:18:00.0): /dev/nvidia2 is held open by python3 (pid 78)"}},
		{name: "VFIO group held by a VM of another step", host: vfioDGX, gres: gresVFIO, step: "1",
			edit:    func(h *fakeHost) { h.holder(9001, "qemu-system-x86", "/dev/vfio/31") },
			wantErr: gpu.ErrBusy, wantMsg: []string{"VFIO group /dev/vfio/31 is held open by qemu-system-x86 (pid 9001)"}},
		{name: "IOMMU off", host: func(t *testing.T) *fakeHost {
			h := newFakeHost(t)
			for _, f := range h200(dgxBDFs[0], -1, "nvidia") {
				h.addPCI(f)
			}
			h.nvidiaProc(dgxBDFs[0], 0, dgxUUID(0))
			return h
		}, gres: "Name=gpu File=/dev/nvidia0\n", step: "0", rebind: true,
			wantErr: gpu.ErrNoIOMMU, wantMsg: []string{"GPU 0 (/dev/nvidia0, 0000:18:00.0): no IOMMU group", "intel_iommu=on iommu=pt"}},
		{name: "GPU-less host, VFIO groups", host: newFakeHost, gres: "Name=gpu File=/dev/vfio/[12-13]\n", step: "0,1", nvml: noNVML,
			wantErr: gpu.ErrNoDevice, wantMsg: []string{"GPU 0 (/dev/vfio/12): IOMMU group 12 does not exist on this host", "GPU 1 (/dev/vfio/13): IOMMU group 13 does not exist"}},
		{name: "VFIO group file missing", host: vfioDGX, gres: gresVFIO, step: "0",
			edit:    func(h *fakeHost) { os.Remove(h.path("dev/vfio/30")) },
			wantErr: gpu.ErrNoDevice, wantMsg: []string{"VFIO group device /dev/vfio/30 does not exist although the group's devices are on vfio-pci"}},
		{name: "vfio-pci not loaded", host: nvidiaDGX, gres: gresNVIDIA, step: "0", rebind: true, nvml: nvmlWith(nil),
			edit:    func(h *fakeHost) { os.RemoveAll(h.path("sys/bus/pci/drivers/vfio-pci")) },
			wantErr: gpu.ErrVFIO, wantMsg: []string{"the vfio-pci driver is not loaded", "modprobe vfio-pci"}},
		{name: "PCI hole beyond the CPU's address width", host: vfioDGX, gres: gresVFIO, step: "0,1,2,3,4,5,6,7", mem: 1 << 20,
			edit:    func(h *fakeHost) { h.write("proc/cpuinfo", "address sizes\t: 42 bits physical, 48 bits virtual\n") },
			wantErr: gpu.ErrAddressSpace, wantMsg: []string{"1048576 MiB of guest memory and a 4097 GiB PCI hole need 43 physical address bits; this CPU has 42"}},
		{name: "NoDevFiles", host: vfioDGX, gres: gresVFIO, step: "NoDevFiles",
			wantErr: gpu.ErrStepGPUs, wantMsg: []string{"gres.conf lists no File="}},
		{name: "duplicate index", host: vfioDGX, gres: gresVFIO, step: "1,1",
			wantErr: gpu.ErrStepGPUs, wantMsg: []string{"GPU 1 listed twice"}},
		{name: "NVML not available", host: vfioDGX, gres: gresVFIO, step: "3", nvml: noNVML,
			want: []wantGPU{{index: 3, bdfs: []string{dgxBDFs[3]}, group: 33}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.host(t)
			if tc.edit != nil {
				tc.edit(h)
			}
			req := gpu.Request{StepGPUs: tc.step, GresConf: h.gresConf(tc.gres), Node: "n1", Roots: h.roots,
				AllowRebind: tc.rebind, GuestMemoryMiB: tc.mem}
			if tc.nvml != nil {
				req.NVML = tc.nvml()
			}
			p, err := gpu.NewPlan(context.Background(), req)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("NewPlan: got error %v, want one wrapping %v", err, tc.wantErr)
				}
				if p != nil {
					t.Errorf("NewPlan returned a plan with its error")
				}
				msg := err.Error()
				t.Logf("error: %s", msg)
				if strings.Contains(msg, "\n") {
					t.Errorf("error is not one line: %q", msg)
				}
				for _, w := range tc.wantMsg {
					if !strings.Contains(msg, w) {
						t.Errorf("error %q\n  does not say %q", msg, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("NewPlan: %v", err)
			}
			t.Logf("%s; notes: %q", p.Mapping(), p.Notes)
			if len(p.GPUs) != len(tc.want) {
				t.Fatalf("planned %d GPUs, want %d: %s", len(p.GPUs), len(tc.want), p.Mapping())
			}
			for i, w := range tc.want {
				g := p.GPUs[i]
				if g.Index != w.index || g.Guest != i || g.IOMMUGroup != w.group || g.BDF != w.bdfs[0] {
					t.Errorf("GPU %d: index %d guest %d group %d bdf %s; want index %d guest %d group %d bdf %s",
						i, g.Index, g.Guest, g.IOMMUGroup, g.BDF, w.index, i, w.group, w.bdfs[0])
				}
				var bdfs []string
				var rebind []bool
				anyRebind := false
				for _, f := range g.Functions {
					bdfs = append(bdfs, f.BDF)
					rebind = append(rebind, f.Rebind)
					anyRebind = anyRebind || f.Rebind
				}
				if strings.Join(bdfs, " ") != strings.Join(w.bdfs, " ") {
					t.Errorf("GPU %d functions %v, want %v", i, bdfs, w.bdfs)
				}
				if w.rebind == nil && anyRebind || w.rebind != nil && !equalBools(rebind, w.rebind) {
					t.Errorf("GPU %d rebind %v, want %v", i, rebind, w.rebind)
				}
				if w.nvml != 0 || w.uuid != "" {
					if g.NVMLIndex != w.nvml || g.UUID != w.uuid {
						t.Errorf("GPU %d: NVML index %d uuid %s, want %d %s", i, g.NVMLIndex, g.UUID, w.nvml, w.uuid)
					}
				}
			}
			if tc.nvml != nil && p.NVML != "available" {
				found := false
				for _, n := range p.Notes {
					found = found || strings.Contains(n, "NVML not available: ERROR_LIBRARY_NOT_FOUND")
				}
				if !found {
					t.Errorf("plan notes %q do not report NVML as not available", p.Notes)
				}
			}
		})
	}
}

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestPlanFakeGPUDevices is the end-to-end setup on this GPU-less host:
// gres.conf names character devices 195:N (mknod) that no GPU backs. The
// plan fails before any VM boots, on one line naming each device.
func TestPlanFakeGPUDevices(t *testing.T) {
	h := newFakeHost(t)
	for i := 0; i < 2; i++ {
		p := h.path("dev/fakegpu" + string(rune('0'+i)))
		if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, int(195<<8|i)); err != nil {
			prereq.Missing(t, "mknod %s: %v (needs root)", p, err)
		}
	}
	_, err := gpu.NewPlan(context.Background(), gpu.Request{
		StepGPUs: "0,1", GresConf: h.gresConf("AutoDetect=off\nName=gpu Type=fake File=/dev/fakegpu[0-1]\n"), Node: "n1", Roots: h.roots,
		NVML: gpunvml.NewFrom(&mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}),
	})
	if !errors.Is(err, gpu.ErrNoDevice) {
		t.Fatalf("NewPlan: %v, want ErrNoDevice", err)
	}
	want := "SLURM_STEP_GPUS=0,1: GPU 0 (/dev/fakegpu0): no PCI device has NVIDIA device minor 0: " + h.path("proc/driver/nvidia/gpus") +
		" does not exist (NVIDIA driver not loaded); NVML not available: ERROR_LIBRARY_NOT_FOUND; GPU 1 (/dev/fakegpu1): no PCI device has NVIDIA device minor 1"
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error:\n  %s\nwant prefix:\n  %s", err, want)
	}
	if len(deviceErrors(err)) != 2 {
		t.Errorf("want one DeviceError per GPU, got %d", len(deviceErrors(err)))
	}
}

func TestPlanNoGPUs(t *testing.T) {
	p, err := gpu.NewPlan(context.Background(), gpu.Request{StepGPUs: "", GresConf: "/nonexistent"})
	if err != nil || len(p.GPUs) != 0 {
		t.Fatalf("NewPlan with no GPUs: %v, %d GPUs", err, len(p.GPUs))
	}
	if devs := p.Devices(); devs != nil {
		t.Errorf("Devices with no GPUs: %+v; want nil", devs)
	}
	if err := p.Bind(context.Background()); err != nil {
		t.Errorf("Bind with no GPUs: %v", err)
	}
	if err := p.Release(context.Background()); err != nil {
		t.Errorf("Release with no GPUs: %v", err)
	}
}

func TestPlanMissingGresConf(t *testing.T) {
	_, err := gpu.NewPlan(context.Background(), gpu.Request{StepGPUs: "0", GresConf: "/nonexistent/gres.conf"})
	if !errors.Is(err, gpu.ErrGresConf) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want ErrGresConf wrapping ErrNotExist", err)
	}
}

func TestParseStepGPUs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{"", nil, false}, {"0", []int{0}, false}, {"0,1,4,5", []int{0, 1, 4, 5}, false}, {"5,4", []int{4, 5}, false},
		{"0-3,7", []int{0, 1, 2, 3, 7}, false}, {"a", nil, true}, {"1,,2", nil, true}, {"-1", nil, true}, {"3-1", nil, true},
		{"NoDevFiles", nil, true},
	} {
		got, err := gpu.ParseStepGPUs(tc.in)
		if (err != nil) != tc.bad || !equalInts(got, tc.want) {
			t.Errorf("ParseStepGPUs(%q) = %v, %v; want %v (error: %v)", tc.in, got, err, tc.want, tc.bad)
		}
		if err != nil && !errors.Is(err, gpu.ErrStepGPUs) {
			t.Errorf("ParseStepGPUs(%q): error %v does not wrap ErrStepGPUs", tc.in, err)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestPlanNVSwitch: on an HGX node (GPUs plus NVSwitch functions, class
// 0x0680), a multi-GPU step is refused unless the site accepts GPUs
// without NVLink; a one-GPU step needs no NVLink and passes.
func TestPlanNVSwitch(t *testing.T) {
	for _, tc := range []struct {
		name, step, policy string
		switches           int
		wantErr            bool
		wantNote           bool
	}{
		{"2 GPUs, switches, refuse", "0,1", "refuse", 4, true, false},
		{"2 GPUs, switches, default", "0,1", "", 4, true, false},
		{"2 GPUs, switches, without-nvlink", "0,1", "without-nvlink", 4, false, true},
		{"1 GPU, switches", "0", "refuse", 4, false, false},
		{"2 GPUs, no switches", "0,1", "refuse", 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := dgx(t, gpu.VFIODriver)
			for i := 0; i < tc.switches; i++ {
				h.addPCI(fn{bdf: fmt.Sprintf("0000:%02x:00.0", 0x05+i), class: 0x068000, vendor: 0x10de, device: 0x22a3, group: 60 + i})
			}
			p, err := gpu.NewPlan(context.Background(), gpu.Request{
				StepGPUs: tc.step, GresConf: h.gresConf(gresVFIO), Node: "n1", Roots: h.roots,
				NVML:     gpunvml.NewFrom(&mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}),
				NVSwitch: tc.policy,
			})
			if tc.wantErr {
				if !errors.Is(err, gpu.ErrNVSwitch) || !strings.Contains(err.Error(), "0000:05:00.0") || !strings.Contains(err.Error(), "without NVLink") {
					t.Fatalf("NewPlan: %v, want ErrNVSwitch naming the switches", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			note := strings.Contains(strings.Join(p.Notes, "\n"), "without NVLink")
			if note != tc.wantNote {
				t.Errorf("notes %q: NVLink note %v, want %v", p.Notes, note, tc.wantNote)
			}
		})
	}
}
