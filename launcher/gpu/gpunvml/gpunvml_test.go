package gpunvml_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu/gpunvml"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// hgx is go-nvml's DGX H200 mock with bus ids as NVML writes them
// (8-digit domain, upper case) and minors that differ from the index.
func hgx() *server.Server {
	s := dgxh200.New()
	minors := []int{2, 3, 0, 1, 6, 7, 4, 5}
	buses := []string{"18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"}
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		dev.Minor = minors[i]
		dev.PciBusID = fmt.Sprintf("00000000:%s:00.0", buses[i])
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range []byte(dev.PciBusID) {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
		none := func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
		dev.GetComputeRunningProcessesFunc = none
		dev.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
		dev.GetMPSComputeRunningProcessesFunc = none
	}
	return s
}

func TestDevices(t *testing.T) {
	s := hgx()
	d2 := s.Devices[2].(*server.Device)
	d2.MigMode = nvml.DEVICE_MIG_ENABLE
	d5 := s.Devices[5].(*server.Device)
	d5.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 1 << 30}}, nvml.SUCCESS
	}
	d5.GetMPSComputeRunningProcessesFunc = d5.GetComputeRunningProcessesFunc // same pid listed twice
	d7 := s.Devices[7].(*server.Device)
	d7.GetMinorNumberFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }

	devs, err := gpunvml.NewFrom(s).Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 7 {
		t.Fatalf("%d devices, want 7 (the lost GPU skipped)", len(devs))
	}
	d := devs[0]
	if d.Index != 0 || d.Minor != 2 || d.BDF != "0000:18:00.0" || d.UUID != d2UUID(s, 0) || !strings.Contains(d.Name, "H200") {
		t.Errorf("device 0 = %+v", d)
	}
	if m := devs[2].MIG; !m.Supported || !m.Current || devs[2].MIG.String() != "enabled" {
		t.Errorf("device 2 MIG %+v (%s), want enabled", m, m)
	}
	if m := devs[0].MIG.String(); m != "disabled" {
		t.Errorf("device 0 MIG %s, want disabled", m)
	}
	if p := devs[5].Processes; len(p) != 1 || p[0].PID != 4242 || p[0].UsedMemory != 1<<30 {
		t.Errorf("device 5 processes %+v, want pid 4242 once", p)
	}
	if devs[5].BDF != "0000:ab:00.0" {
		t.Errorf("device 5 BDF %s", devs[5].BDF)
	}
}

func d2UUID(s *server.Server, i int) string { return s.Devices[i].(*server.Device).UUID }

func TestDevicesInitFails(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}
	_, err := gpunvml.NewFrom(lib).Devices(context.Background())
	if !errors.Is(err, gpu.ErrNVMLUnavailable) || err.Error() != "NVML not available: ERROR_DRIVER_NOT_LOADED" {
		t.Fatalf("got %v", err)
	}
}

// TestSystemLibrary runs the real go-nvml on this host. Without the NVIDIA
// driver it must say why dlopen failed.
func TestSystemLibrary(t *testing.T) {
	devs, err := gpunvml.New().Devices(context.Background())
	if err == nil {
		prereq.Hardware(t, "libnvidia-ml is installed here: %d GPU(s)", len(devs))
	}
	t.Logf("%v", err)
	if !errors.Is(err, gpu.ErrNVMLUnavailable) {
		t.Fatalf("error %v does not wrap ErrNVMLUnavailable", err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "NVML not available: ") || !strings.Contains(msg, "libnvidia-ml.so.1") {
		t.Errorf("error %q does not name the library", msg)
	}
}
