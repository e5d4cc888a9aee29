package sriov_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/network/sriov"
	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
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

// qemuArgs renders devs (the VF, alone or after GPUs) as the QEMU driver
// does.
func qemuArgs(t *testing.T, p *sriov.Plan, m qemu.Memory, before ...driver.PCIDevice) ([]string, error) {
	t.Helper()
	d, err := p.Device()
	if err != nil {
		return nil, err
	}
	return qemu.PCIArgs(append(before, d), m, p.Hole64())
}

func TestQEMUArgsVF(t *testing.T) {
	p := vfPlan(t)
	got, err := qemuArgs(t, p, qemu.Memory{MiB: 4096, PreallocThreads: 2})
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
	// Beside 2 GPUs (ports 1 and 2): the VF's port is the third.
	gpus := []driver.PCIDevice{{ID: "gpu0", Functions: []string{"0000:18:00.0"}}, {ID: "gpu1", Functions: []string{"0000:41:00.0"}}}
	dev, err := qemuArgs(t, p, qemu.Memory{MiB: 4096}, gpus...)
	if err != nil || !strings.HasSuffix(strings.Join(dev, " "), "-device pcie-root-port,id=nic0-port,bus=pcie.0,chassis=3,io-reserve=0 -device vfio-pci,id=nic0,host=0000:3b:00.2,bus=nic0-port,addr=00.0,rombar=0") {
		t.Errorf("VF beside 2 GPUs = %q, %v", dev, err)
	}
	bad := *p
	bad.VF.BDF = "3b:00.2"
	if _, err := bad.Device(); err == nil || !strings.Contains(err.Error(), `"3b:00.2" is not a PCI address`) {
		t.Errorf("Device of a bad VF address: %v", err)
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
	args, err := qemuArgs(t, p, qemu.Memory{MiB: 512, PreallocThreads: 2})
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

// TestGuestModulesResolve: the modules a ConnectX VF's guest needs exist
// in the guest kernel (the node's newest kernel, as package assets picks
// it) and resolve with their dependencies through its depmod files.
func TestGuestModulesResolve(t *testing.T) {
	rel, err := assets.GuestKernelRelease("")
	if err != nil {
		prereq.Missing(t, "no guest kernel: %v", err)
	}
	ix, err := assets.LoadModuleIndex(filepath.Join(assets.DefaultModulesRoot, rel))
	if err != nil {
		prereq.Missing(t, "no module index for %s: %v", rel, err)
	}
	g := vfPlan(t).Guest()
	if strings.Join(g.Modules, " ") != "mlx5_core mlx5_ib ib_uverbs" || g.Driver != "mlx5_core" {
		t.Fatalf("Guest = %+v", g)
	}
	order, err := ix.Resolve(g.Modules, g.Modules, nil)
	if err != nil {
		t.Fatalf("resolve %v in %s: %v", g.Modules, rel, err)
	}
	var names []string
	for _, e := range order {
		names = append(names, e.Name())
	}
	t.Logf("%s: %s", rel, strings.Join(names, " "))
	pos := map[string]int{}
	for i, n := range names {
		pos[n] = i
	}
	for _, m := range []string{"ib_core", "mlx5_core", "mlx5_ib", "ib_uverbs"} {
		if _, ok := pos[m]; !ok {
			t.Errorf("load order lacks %s", m)
		}
	}
	if pos["mlx5_core"] > pos["mlx5_ib"] || pos["ib_core"] > pos["mlx5_ib"] {
		t.Errorf("load order %v puts mlx5_ib before its dependencies", names)
	}
}

// TestQEMUVFBesideGPU runs QEMU with the VF after a GPU (qemu.PCIArgs of
// both), every vfio-pci device replaced by a pci-testdev stand-in: the VF
// must sit at 00.0 of its own port (HMP info qtree). With the GPU's
// chassis number QEMU itself refuses the second port, which is why
// PCIArgs numbers the ports by position.
func TestQEMUVFBesideGPU(t *testing.T) {
	q, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		prereq.Missing(t, "qemu-system-x86_64 not installed")
	}
	p := vfPlan(t)
	gpu := driver.PCIDevice{ID: "gpu0", Functions: []string{"0000:18:00.0"}}
	run := func(chassis int) string {
		dev, err := qemuArgs(t, p, qemu.Memory{MiB: 256}, gpu)
		if err != nil {
			t.Fatal(err)
		}
		// Chassis 1 for the VF's port too: the GPU's.
		for i := range dev {
			dev[i] = strings.Replace(dev[i], "id=nic0-port,bus=pcie.0,chassis=2,", fmt.Sprintf("id=nic0-port,bus=pcie.0,chassis=%d,", chassis), 1)
		}
		for i, a := range dev {
			if rest, ok := strings.CutPrefix(a, "vfio-pci,"); ok {
				var keep []string
				for _, kv := range strings.Split(rest, ",") {
					if !strings.HasPrefix(kv, "host=") {
						keep = append(keep, kv)
					}
				}
				dev[i] = "pci-testdev," + strings.Join(keep, ",")
			}
		}
		args := append([]string{}, dev...)
		args = append(args, "-accel", "tcg", "-m", "256M", "-nodefaults", "-no-user-config", "-display", "none", "-S", "-monitor", "stdio")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, q, args...)
		cmd.Stdin = strings.NewReader("info qtree\nquit\n")
		out, _ := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("QEMU did not quit within 30 s: %s", out)
		}
		return string(out)
	}
	out := run(2)
	i := strings.Index(out, "bus: nic0-port")
	if i < 0 || !strings.Contains(out[i:], `dev: pci-testdev, id "nic0"`) {
		t.Fatalf("no nic0 on nic0-port in info qtree:\n%s", out)
	}
	rest := out[strings.Index(out[i:], `id "nic0"`)+i:]
	if j := strings.Index(rest, "addr = "); j < 0 || !strings.HasPrefix(rest[j:], "addr = 00.0") {
		t.Errorf("nic0 not at 00.0 of its port:\n%s", rest)
	}
	if out := run(1); !strings.Contains(out, "nic0-port,bus=pcie.0,chassis=1,io-reserve=0: Can't add chassis slot") {
		t.Errorf("QEMU took two root ports with chassis 1:\n%s", out)
	}
}
