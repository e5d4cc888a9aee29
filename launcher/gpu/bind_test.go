package gpu_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu/gpunvml"
)

// rebindPlan plans GPUs 0 and 1 of the nvidia-bound HGX node with
// rebinding allowed, writing sysfs through the fake kernel.
func rebindPlan(t *testing.T) (*fakeHost, *gpu.Plan) {
	t.Helper()
	h := dgx(t, "nvidia")
	p, err := gpu.NewPlan(context.Background(), gpu.Request{StepGPUs: "0,1", Node: "n1", Roots: h.roots,
		GresConf: h.gresConf(gresNVIDIA), NVML: gpunvml.NewFrom(dgxNVML()), AllowRebind: true})
	if err != nil {
		t.Fatal(err)
	}
	gpu.SetSysfsWriter(p, h.kernel)
	return h, p
}

// reload is the plan as a fresh process reads it from the step directory.
func reload(t *testing.T, h *fakeHost, p *gpu.Plan) *gpu.Plan {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var q gpu.Plan
	if err := json.Unmarshal(b, &q); err != nil {
		t.Fatal(err)
	}
	gpu.SetSysfsWriter(&q, h.kernel)
	return &q
}

func TestBindRelease(t *testing.T) {
	h, p := rebindPlan(t)
	ctx := context.Background()
	if err := p.Bind(ctx); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	// /dev/nvidia0 is 3a:00.0 (group 32), /dev/nvidia1 is 5d:00.0 (group 33).
	wantOps := []string{
		"bus/pci/devices/0000:3a:00.0/driver_override=vfio-pci",
		"bus/pci/drivers/nvidia/unbind=0000:3a:00.0",
		"bus/pci/drivers_probe=0000:3a:00.0",
		"bus/pci/devices/0000:5d:00.0/driver_override=vfio-pci",
		"bus/pci/drivers/nvidia/unbind=0000:5d:00.0",
		"bus/pci/drivers_probe=0000:5d:00.0",
	}
	if strings.Join(h.ops, "\n") != strings.Join(wantOps, "\n") {
		t.Errorf("Bind wrote:\n  %s\nwant:\n  %s", strings.Join(h.ops, "\n  "), strings.Join(wantOps, "\n  "))
	}
	for _, b := range []string{"0000:3a:00.0", "0000:5d:00.0"} {
		if d := h.driverOf(b); d != gpu.VFIODriver {
			t.Errorf("%s on %q after Bind", b, d)
		}
	}
	for _, f := range []string{"dev/vfio/32", "dev/vfio/33"} {
		if _, err := os.Stat(h.path(f)); err != nil {
			t.Errorf("after Bind: %v", err)
		}
	}
	h.ops = nil
	if err := p.Bind(ctx); err != nil || len(h.ops) != 0 {
		t.Errorf("second Bind: %v, wrote %q; want a no-op", err, h.ops)
	}

	// The stop path runs in a fresh process with the plan from JSON.
	q := reload(t, h, p)
	if err := q.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for _, b := range []string{"0000:3a:00.0", "0000:5d:00.0"} {
		if d := h.driverOf(b); d != "nvidia" {
			t.Errorf("%s on %q after Release, want nvidia", b, d)
		}
		if ov, _ := os.ReadFile(h.path("sys/bus/pci/devices/" + b + "/driver_override")); strings.TrimSpace(string(ov)) != "(null)" {
			t.Errorf("%s driver_override %q after Release", b, ov)
		}
	}
	if _, err := os.Stat(h.path("dev/vfio/32")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/dev/vfio/32 still there after Release")
	}
	h.ops = nil
	if err := q.Release(ctx); err != nil || len(h.ops) != 0 {
		t.Errorf("second Release: %v, wrote %q; want a no-op", err, h.ops)
	}
}

func TestReleaseWaitsForHolders(t *testing.T) {
	h, p := rebindPlan(t)
	if err := p.Bind(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.holder(9001, "qemu-system-x86", "/dev/vfio/32")
	h.ops = nil
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := p.Release(ctx)
	if !errors.Is(err, gpu.ErrRelease) || !errors.Is(err, gpu.ErrBusy) {
		t.Fatalf("Release with the group held: %v, want ErrRelease and ErrBusy", err)
	}
	if want := "GPU 0 (/dev/nvidia0, 0000:3a:00.0): VFIO group /dev/vfio/32 is still held open by qemu-system-x86 (pid 9001)"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if len(h.ops) != 0 {
		t.Errorf("Release changed drivers while the group was held: %q", h.ops)
	}
	// The holder goes away within the wait: Release completes.
	go func() {
		time.Sleep(100 * time.Millisecond)
		os.RemoveAll(h.path("proc/9001"))
	}()
	if err := p.Release(context.Background()); err != nil {
		t.Fatalf("Release after the holder exited: %v", err)
	}
}

func TestReleaseMinorChanged(t *testing.T) {
	h, p := rebindPlan(t)
	if err := p.Bind(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The driver re-probes 3a:00.0 with another minor.
	h.nvidiaProc("0000:3a:00.0", 9, dgxUUID(2))
	err := p.Release(context.Background())
	if !errors.Is(err, gpu.ErrRelease) {
		t.Fatalf("Release: %v, want ErrRelease", err)
	}
	if want := "GPU 0 (/dev/nvidia0, 0000:3a:00.0): back on nvidia with device minor 9, not 0"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

func TestBindUndoesOnFailure(t *testing.T) {
	h, p := rebindPlan(t)
	gpu.SetSysfsWriter(p, func(path, value string) error {
		if strings.HasSuffix(path, "drivers_probe") && strings.TrimSpace(value) == "0000:5d:00.0" {
			h.kernel(path, value) // recorded, but the probe fails
			return syscall.EIO
		}
		return h.kernel(path, value)
	})
	err := p.Bind(context.Background())
	if !errors.Is(err, gpu.ErrRebind) {
		t.Fatalf("Bind: %v, want ErrRebind", err)
	}
	if !strings.Contains(err.Error(), "GPU 1 (/dev/nvidia1, 0000:5d:00.0): probe with driver_override=vfio-pci") {
		t.Errorf("error %q does not name 5d:00.0", err)
	}
	for _, b := range []string{"0000:3a:00.0", "0000:5d:00.0"} {
		if d := h.driverOf(b); d != "nvidia" {
			t.Errorf("%s on %q after a failed Bind, want nvidia back", b, d)
		}
	}
}

func TestBindRefusesBusyGPU(t *testing.T) {
	h, p := rebindPlan(t)
	h.holder(4242, "python3", "/dev/nvidia1")
	err := p.Bind(context.Background())
	if !errors.Is(err, gpu.ErrBusy) || !strings.Contains(err.Error(), "/dev/nvidia1 is held open by python3 (pid 4242)") {
		t.Fatalf("Bind: %v, want ErrBusy naming python3", err)
	}
	if len(h.ops) != 0 {
		t.Errorf("Bind changed drivers of a busy GPU: %q", h.ops)
	}
}

func TestBindReleaseAudioFunction(t *testing.T) {
	h := newFakeHost(t)
	for _, f := range l40s("0000:41:00.0", 50, gpu.VFIODriver, "snd_hda_intel") {
		h.addPCI(f)
	}
	os.Remove(h.path("dev/vfio/50")) // appears once the whole group is on vfio-pci
	p, err := gpu.NewPlan(context.Background(), gpu.Request{StepGPUs: "0", Node: "n1", Roots: h.roots,
		GresConf: h.gresConf("Name=gpu File=/dev/vfio/50\n"), AllowRebind: true})
	if err != nil {
		t.Fatal(err)
	}
	gpu.SetSysfsWriter(p, h.kernel)
	if err := p.Bind(context.Background()); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	if d := h.driverOf("0000:41:00.1"); d != gpu.VFIODriver {
		t.Fatalf("audio function on %q after Bind", d)
	}
	if err := p.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if d := h.driverOf("0000:41:00.1"); d != "snd_hda_intel" {
		t.Errorf("audio function on %q after Release", d)
	}
	if d := h.driverOf("0000:41:00.0"); d != gpu.VFIODriver {
		t.Errorf("GPU on %q after Release, want it left on vfio-pci", d)
	}
}

func TestReleaseVFIOGroupMissing(t *testing.T) {
	h := dgx(t, gpu.VFIODriver)
	p, err := gpu.NewPlan(context.Background(), gpu.Request{StepGPUs: "0", Node: "n1", Roots: h.roots, GresConf: h.gresConf(gresVFIO)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	os.Remove(h.path("dev/vfio/30"))
	err = p.Release(context.Background())
	if !errors.Is(err, gpu.ErrRelease) || !strings.Contains(err.Error(), "GPU 0 (/dev/vfio/30, 0000:18:00.0): VFIO group /dev/vfio/30 does not open") {
		t.Fatalf("Release: %v, want ErrRelease naming /dev/vfio/30", err)
	}
}
