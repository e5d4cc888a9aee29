package gpu_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/bits"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// twoGPUPlan is a 2-GPU step: an H200 (one function, BAR1 256 GiB) and an
// L40S with its audio function (BAR1 64 GiB), both on vfio-pci.
func twoGPUPlan(t *testing.T) *gpu.Plan {
	t.Helper()
	h := newFakeHost(t)
	for _, f := range append(h200("0000:18:00.0", 30, gpu.VFIODriver), l40s("0000:41:00.0", 50, gpu.VFIODriver, gpu.VFIODriver)...) {
		h.addPCI(f)
	}
	p, err := gpu.NewPlan(context.Background(), gpu.Request{
		StepGPUs: "0,1", Node: "n1", Roots: h.roots,
		GresConf: h.gresConf("AutoDetect=off\nName=gpu Type=h200 File=/dev/vfio/30\nName=gpu Type=l40s File=/dev/vfio/50\n"),
	})
	if err != nil {
		t.Fatalf("NewPlan: %v", err)
	}
	return p
}

// qemuArgs renders the plan's devices as the QEMU driver does.
func qemuArgs(p *gpu.Plan, m qemu.Memory) ([]string, error) {
	return qemu.PCIArgs(p.Devices(), m, p.Hole64())
}

func TestQEMUArgsTwoGPUs(t *testing.T) {
	p := twoGPUPlan(t)
	got, err := qemuArgs(p, qemu.Memory{MiB: 16384, PreallocThreads: 4})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"-M", "q35,memory-backend=gpu-ram,vmport=off,smm=off,sata=off",
		"-object", "memory-backend-ram,id=gpu-ram,size=16384M,prealloc=on,prealloc-threads=4",
		// H200: 256G+32M BARs + 256G alignment; L40S: 64G+32M + 64G; rounded up.
		"-global", "q35-pcihost.pci-hole64-size=641G",
		"-device", "pcie-root-port,id=gpu0-port,bus=pcie.0,chassis=1,io-reserve=0",
		"-device", "vfio-pci,id=gpu0,host=0000:18:00.0,bus=gpu0-port,addr=00.0,rombar=0",
		"-device", "pcie-root-port,id=gpu1-port,bus=pcie.0,chassis=2,io-reserve=0",
		"-device", "vfio-pci,id=gpu1,host=0000:41:00.0,bus=gpu1-port,addr=00.0,multifunction=on,rombar=0",
		"-device", "vfio-pci,id=gpu1-fn1,host=0000:41:00.1,bus=gpu1-port,addr=00.1,rombar=0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("QEMUArgs:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if b := p.PhysBits(16384); b != 40 {
		t.Errorf("PhysBits(16 GiB) = %d, want 40 (hole ends at 18 GiB + 641 GiB)", b)
	}
	if got := p.Hole64(); got != 641<<30 {
		t.Errorf("Hole64 = %d GiB, want 641", got>>30)
	}
	if got := p.VFIOGroupFiles(); strings.Join(got, " ") != "/dev/vfio/30 /dev/vfio/50" {
		t.Errorf("VFIOGroupFiles = %v", got)
	}
	want1 := "gpus: slurm 0 /dev/vfio/30 0000:18:00.0 group 30 (vfio-pci) -> guest 0; slurm 1 /dev/vfio/50 0000:41:00.0+0000:41:00.1 group 50 (vfio-pci,vfio-pci) -> guest 1"
	if m := p.Mapping(); m != want1 {
		t.Errorf("Mapping:\n  %s\nwant\n  %s", m, want1)
	}
}

func TestQEMUArgsVariants(t *testing.T) {
	h := newFakeHost(t)
	// An older GPU with an I/O BAR: its root port keeps the I/O window.
	old := h200("0000:18:00.0", 30, gpu.VFIODriver)
	old[0].bars = append(old[0].bars, bar{5, 128, ioPort})
	for _, f := range old {
		h.addPCI(f)
	}
	p, err := gpu.NewPlan(context.Background(), gpu.Request{StepGPUs: "0", Node: "n1", Roots: h.roots,
		GresConf: h.gresConf("Name=gpu File=/dev/vfio/30\n")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := qemuArgs(p, qemu.Memory{MiB: 2048, HugePageMiB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Join(got, " ")
	for _, w := range []string{
		"memory-backend-memfd,id=gpu-ram,size=2048M,hugetlb=on,hugetlbsize=1024M,prealloc=on,prealloc-threads=1",
		"pci-hole64-size=513G",
		"pcie-root-port,id=gpu0-port,bus=pcie.0,chassis=1 ",
	} {
		if !strings.Contains(s+" ", w) {
			t.Errorf("QEMUArgs %q lacks %q", s, w)
		}
	}
	if _, err := qemuArgs(p, qemu.Memory{}); err == nil {
		t.Error("QEMUArgs without a memory size succeeded")
	}
}

// qemuBinary returns qemu-system-x86_64 or skips.
func qemuBinary(t *testing.T) string {
	t.Helper()
	q, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		prereq.Missing(t, "qemu-system-x86_64 not installed")
	}
	return q
}

// TestQEMUAcceptsArgs runs QEMU 7.2 with the 2-GPU arguments exactly as
// planned (TCG, -S): every option must parse and every device before the
// first vfio-pci realize; QEMU must then fail on opening the missing host
// device, not on syntax.
func TestQEMUAcceptsArgs(t *testing.T) {
	q := qemuBinary(t)
	p := twoGPUPlan(t)
	for _, g := range p.GPUs {
		if _, err := os.Stat("/sys/bus/pci/devices/" + g.BDF); err == nil {
			prereq.Hardware(t, "%s exists on this host: not handing a real device to QEMU", g.BDF)
		}
	}
	args, err := qemuArgs(p, qemu.Memory{MiB: 512, PreallocThreads: 2})
	if err != nil {
		t.Fatal(err)
	}
	args = append(args, "-accel", "tcg", "-cpu", fmt.Sprintf("max,phys-bits=%d", p.PhysBits(512)), "-m", "512M",
		"-nodefaults", "-no-user-config", "-display", "none", "-S")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, q, args...).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("QEMU did not stop at the missing VFIO device within 30 s: %s", out)
	}
	if err == nil {
		t.Fatalf("QEMU started although host device 0000:18:00.0 does not exist: %s", out)
	}
	msg := strings.TrimSpace(string(out))
	t.Logf("QEMU: %s", msg)
	want := "-device vfio-pci,id=gpu0,host=0000:18:00.0,bus=gpu0-port,addr=00.0,rombar=0: vfio 0000:18:00.0: no such host device"
	if !strings.Contains(msg, want) && !strings.Contains(msg, "vfio /sys/bus/pci/devices/0000:18:00.0: no such host device") {
		t.Errorf("QEMU failed for another reason than the missing VFIO device:\n%s", msg)
	}
}

// TestQEMUTopology runs the same arguments with every vfio-pci replaced
// by a stand-in (pci-testdev with the function's largest 64-bit BAR) and
// lets SeaBIOS assign the BARs: the devices must sit on their root ports
// at the planned functions, and the firmware must place every BAR, below
// the planned hole's end and the planned address width.
func TestQEMUTopology(t *testing.T) {
	if testing.Short() {
		prereq.OptIn(t, "-short: boots SeaBIOS under TCG")
	}
	q := qemuBinary(t)
	p := twoGPUPlan(t)
	const mem = 512
	args, err := qemuArgs(p, qemu.Memory{MiB: mem, PreallocThreads: 2})
	if err != nil {
		t.Fatal(err)
	}
	membar := map[string]uint64{} // qdev id -> stand-in BAR size
	for i, a := range args {
		if !strings.HasPrefix(a, "vfio-pci,") {
			continue
		}
		var keep []string
		var id, host string
		for _, kv := range strings.Split(a, ",")[1:] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "host":
				host = v
				continue
			case "id":
				id = v
			}
			keep = append(keep, kv)
		}
		var largest uint64
		for _, g := range p.GPUs {
			for _, f := range g.Functions {
				if f.BDF == host {
					for _, b := range f.BARs {
						if b.Is64() && b.Size > largest {
							largest = b.Size
						}
					}
				}
			}
		}
		dev := "pci-testdev," + strings.Join(keep, ",")
		if largest > 0 {
			largest = 1 << (bits.Len64(largest - 1))
			dev += fmt.Sprintf(",membar=%d", largest)
			membar[id] = largest
		}
		args[i] = dev
	}
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	args = append(args, "-accel", "tcg", "-cpu", fmt.Sprintf("max,phys-bits=%d", p.PhysBits(mem)), "-m", fmt.Sprintf("%dM", mem),
		"-nodefaults", "-no-user-config", "-display", "none", "-qmp", "unix:"+sock+",server=on,wait=off")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, q, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	m := dialQMP(t, ctx, sock, &stderr)

	for i, g := range p.GPUs {
		for fi := range g.Functions {
			id := fmt.Sprintf("gpu%d", i)
			if fi > 0 {
				id = fmt.Sprintf("gpu%d-fn%d", i, fi)
			}
			var bus string
			var addr int
			m.get(fmt.Sprintf("/machine/peripheral/%s", id), "parent_bus", &bus)
			m.get(fmt.Sprintf("/machine/peripheral/%s", id), "addr", &addr)
			if wantBus := fmt.Sprintf("/machine/peripheral/gpu%d-port/gpu%d-port", i, i); bus != wantBus || addr != fi {
				t.Errorf("%s on %s at function %d, want %s at %d", id, bus, addr, wantBus, fi)
			}
		}
	}

	// SeaBIOS has assigned the BARs once every stand-in has an address.
	var holeStart uint64
	m.get("/machine/q35", "pci-hole64-start", &holeStart)
	deadline := time.Now().Add(30 * time.Second)
	for {
		placed, missing := m.bars()
		if len(missing) == 0 {
			for id, size := range membar {
				addr, ok := placed[id]
				if !ok {
					t.Errorf("%s: no 64-bit BAR of %d GiB placed", id, size>>30)
					continue
				}
				end := addr + size
				t.Logf("%s: BAR %d GiB at %#x (hole %#x + %d GiB)", id, size>>30, addr, holeStart, p.Hole64()>>30)
				if end > holeStart+p.Hole64() {
					t.Errorf("%s: firmware placed its BAR up to %#x, beyond the planned hole (%#x + %d GiB)", id, end, holeStart, p.Hole64()>>30)
				}
				if bits.Len64(end-1) > p.PhysBits(mem) {
					t.Errorf("%s: BAR ends at %#x, beyond %d address bits", id, end, p.PhysBits(mem))
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("firmware did not place the BARs of %v within 30 s", missing)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type qmp struct {
	t  *testing.T
	c  net.Conn
	rd *bufio.Reader
}

func dialQMP(t *testing.T, ctx context.Context, sock string, stderr *bytes.Buffer) *qmp {
	t.Helper()
	var c net.Conn
	for {
		var err error
		if c, err = net.Dial("unix", sock); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("QMP socket never came up: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { c.Close() })
	m := &qmp{t: t, c: c, rd: bufio.NewReader(c)}
	if _, err := m.rd.ReadBytes('\n'); err != nil { // greeting
		t.Fatalf("QMP greeting: %v (%s)", err, stderr.String())
	}
	m.do("qmp_capabilities", nil, nil)
	return m
}

func (m *qmp) do(cmd string, args any, out any) {
	m.t.Helper()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := m.c.Write(append(b, '\n')); err != nil {
		m.t.Fatalf("QMP %s: %v", cmd, err)
	}
	for {
		line, err := m.rd.ReadBytes('\n')
		if err != nil {
			m.t.Fatalf("QMP %s: %v", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Desc string `json:"desc"`
			} `json:"error"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			m.t.Fatalf("QMP %s: %v", cmd, err)
		}
		if resp.Error != nil {
			m.t.Fatalf("QMP %s: %s", cmd, resp.Error.Desc)
		}
		if resp.Return == nil {
			continue // an event
		}
		if out != nil {
			if err := json.Unmarshal(resp.Return, out); err != nil {
				m.t.Fatalf("QMP %s: %v", cmd, err)
			}
		}
		return
	}
}

func (m *qmp) get(path, prop string, out any) {
	m.t.Helper()
	m.do("qom-get", map[string]string{"path": path, "property": prop}, out)
}

type pciDev struct {
	QdevID  string `json:"qdev_id"`
	Regions []struct {
		Address  int64  `json:"address"`
		Size     uint64 `json:"size"`
		MemType6 bool   `json:"mem_type_64"`
	} `json:"regions"`
	PCIBridge *struct {
		Devices []pciDev `json:"devices"`
	} `json:"pci_bridge"`
}

// bars returns the address of each stand-in's 64-bit BAR that the
// firmware has placed, and the stand-ins not yet reachable or placed.
func (m *qmp) bars() (map[string]uint64, []string) {
	var buses []struct {
		Devices []pciDev `json:"devices"`
	}
	m.do("query-pci", nil, &buses)
	placed := map[string]uint64{}
	var walk func([]pciDev)
	walk = func(ds []pciDev) {
		for _, d := range ds {
			for _, r := range d.Regions {
				if r.MemType6 && r.Address > 0 {
					placed[d.QdevID] = uint64(r.Address)
				}
			}
			if d.PCIBridge != nil {
				walk(d.PCIBridge.Devices)
			}
		}
	}
	for _, b := range buses {
		walk(b.Devices)
	}
	var missing []string
	for _, id := range []string{"gpu0", "gpu1"} {
		if _, ok := placed[id]; !ok {
			missing = append(missing, id)
		}
	}
	return placed, missing
}
