package sriov_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/network/sriov"
	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

func vfPlan(t *testing.T) *sriov.Plan {
	t.Helper()
	h, _ := fourVFs(t, pci.VFIODriver)
	p, err := sriov.NewPlan(context.Background(), request(h, "n1/42.0.0", "ib0"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestQEMUArgsVF(t *testing.T) {
	p := vfPlan(t)
	got, err := p.QEMUArgs(pci.Memory{MiB: 4096, PreallocThreads: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"-M", "q35,memory-backend=gpu-ram,vmport=off,smm=off,sata=off",
		"-object", "memory-backend-ram,id=gpu-ram,size=4096M,prealloc=on,prealloc-threads=2",
		"-global", "q35-pcihost.pci-hole64-size=32G",
		"-device", "pcie-root-port,id=nic0-port,bus=pcie.0,chassis=1,io-reserve=0",
		"-device", "vfio-pci,id=nic0,host=0000:3b:00.2,bus=nic0-port,addr=00.0,rombar=0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("QEMUArgs:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	// Beside 2 GPUs (gpu.Plan.QEMUArgs numbers its ports 1 and 2).
	dev, err := p.DeviceArgs(3)
	if err != nil || strings.Join(dev, " ") != "-device pcie-root-port,id=nic0-port,bus=pcie.0,chassis=3,io-reserve=0 -device vfio-pci,id=nic0,host=0000:3b:00.2,bus=nic0-port,addr=00.0,rombar=0" {
		t.Errorf("DeviceArgs(3) = %q, %v", dev, err)
	}
	for _, c := range []int{0, 256} {
		if _, err := p.DeviceArgs(c); err == nil {
			t.Errorf("DeviceArgs(%d) succeeded", c)
		}
	}
	if m := p.Mapping(); m != "nic: VF 0000:3b:00.2 (vf 0 of ib0 0000:3b:00.0) group 41 (vfio-pci) -> guest nic0" {
		t.Errorf("Mapping = %q", m)
	}
}

// TestQEMUAcceptsVFArgs runs QEMU with the VF arguments exactly as
// planned (TCG, -S), as gpu's TestQEMUAcceptsArgs does: every option must
// parse and the root port realize; QEMU must then fail on opening the
// missing host device, not on syntax.
func TestQEMUAcceptsVFArgs(t *testing.T) {
	q, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		prereq.Missing(t, "qemu-system-x86_64 not installed")
	}
	p := vfPlan(t)
	if _, err := os.Stat("/sys/bus/pci/devices/" + p.VF.BDF); err == nil {
		prereq.Hardware(t, "%s exists on this host: not handing a real device to QEMU", p.VF.BDF)
	}
	args, err := p.QEMUArgs(pci.Memory{MiB: 512, PreallocThreads: 2})
	if err != nil {
		t.Fatal(err)
	}
	args = append(args, "-accel", "tcg", "-cpu", "max", "-m", "512M",
		"-nodefaults", "-no-user-config", "-display", "none", "-S")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, q, args...).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("QEMU did not stop at the missing VFIO device within 30 s: %s", out)
	}
	if err == nil {
		t.Fatalf("QEMU started although host device %s does not exist: %s", p.VF.BDF, out)
	}
	msg := strings.TrimSpace(string(out))
	t.Logf("QEMU: %s", msg)
	want := fmt.Sprintf("-device vfio-pci,id=nic0,host=%s,bus=nic0-port,addr=00.0,rombar=0: vfio %s: no such host device", p.VF.BDF, p.VF.BDF)
	if !strings.Contains(msg, want) && !strings.Contains(msg, "vfio /sys/bus/pci/devices/"+p.VF.BDF+": no such host device") {
		t.Errorf("QEMU failed for another reason than the missing VFIO device:\n%s", msg)
	}
}
