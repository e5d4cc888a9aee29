package sriov_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/network/sriov"
	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

const pfBDF = "0000:3b:00.0"

// fourVFs is a ConnectX-7 PF (ib0) with 4 VFs at 3b:00.2-5, each in
// its own IOMMU group (41-44, ACS on the root port), on vfDriver.
func fourVFs(t *testing.T, vfDriver string) (*fakeHost, []string) {
	h := newFakeHost(t)
	return h, h.pfWithVFs(pfBDF, 40, "ib0", []int{41, 42, 43, 44}, vfDriver)
}

func request(h *fakeHost, owner string, pfs ...string) sriov.Request {
	return sriov.Request{
		Config:   sriov.Config{PFs: pfs},
		Roots:    h.roots,
		ClaimDir: h.claimDir(),
		Owner:    owner,
		StateDir: h.path("run/slurm-microvm/n1/" + strings.TrimPrefix(owner, "n1/")),
	}
}

// reload is the plan as a fresh process reads it from the step directory.
func reload(t *testing.T, h *fakeHost, p *sriov.Plan) *sriov.Plan {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var q sriov.Plan
	if err := json.Unmarshal(b, &q); err != nil {
		t.Fatal(err)
	}
	sriov.SetSysfsWriter(&q, h.kernel)
	return &q
}

func TestReadPFFourVFs(t *testing.T) {
	h, vfs := fourVFs(t, pci.VFIODriver)
	pf, err := sriov.ReadPF(h.roots, pfBDF)
	if err != nil {
		t.Fatal(err)
	}
	if pf.BDF != pfBDF || pf.NumVFs != 4 || pf.TotalVFs != 8 || pf.Driver != "mlx5_core" ||
		strings.Join(pf.Netdevs, ",") != "ib0" || strings.Join(pf.RDMA, ",") != "mlx5_0" {
		t.Errorf("PF = %+v", pf)
	}
	if len(pf.VFs) != 4 {
		t.Fatalf("%d VFs, want 4", len(pf.VFs))
	}
	for i, vf := range pf.VFs {
		if vf.BDF != vfs[i] || vf.Index != i || vf.Vendor != 0x15b3 || vf.Device != 0x101e || vf.Driver != pci.VFIODriver ||
			vf.IOMMUGroup != 41+i || len(vf.Members) != 1 || vf.Members[0].Role != sriov.RoleVF {
			t.Errorf("VF %d = %+v", i, vf)
		}
	}
	// On mlx5_core the host names the VFs' interfaces and RDMA devices.
	h2, _ := fourVFs(t, "mlx5_core")
	pf2, err := sriov.ReadPF(h2.roots, pfBDF)
	if err != nil {
		t.Fatal(err)
	}
	if v := pf2.VFs[1]; strings.Join(v.Netdevs, ",") != "ib0v3" || strings.Join(v.RDMA, ",") != "mlx5_3" || strings.Join(v.Verbs, ",") != "/dev/infiniband/uverbs3" {
		t.Errorf("VF 1 on mlx5_core: netdevs %v rdma %v verbs %v", v.Netdevs, v.RDMA, v.Verbs)
	}
}

func TestPlanByName(t *testing.T) {
	for _, name := range []string{"ib0", "mlx5_0", pfBDF, "3b:00.0"} {
		t.Run(name, func(t *testing.T) {
			h, vfs := fourVFs(t, pci.VFIODriver)
			p, err := sriov.NewPlan(context.Background(), request(h, "n1/42.0.0", name))
			if err != nil {
				t.Fatal(err)
			}
			if p.VF.BDF != vfs[0] || p.PFBDF != pfBDF || p.Rebind || p.VF.VFIOGroupFile != "/dev/vfio/41" {
				t.Errorf("plan = %+v", p)
			}
			if got := strings.Join(p.VFIOGroupFiles(), " "); got != "/dev/vfio/41" {
				t.Errorf("VFIOGroupFiles = %s", got)
			}
			if g := p.Guest(); g.Driver != "mlx5_core" || !strings.Contains(g.Note, "mlx5_core") {
				t.Errorf("Guest = %+v", g)
			}
		})
	}
}

func TestPlanRefusesUnknownPF(t *testing.T) {
	h, vfs := fourVFs(t, pci.VFIODriver)
	h.addPCI(fn{bdf: "0000:5e:00.0", class: 0x010802, vendor: 0x144d, device: 0xa80a, driver: "nvme", group: 60})
	for _, c := range []struct {
		pf   string
		rule error
		want string
	}{
		{"ib7", sriov.ErrNoPF, "no network interface"},
		{"0000:5e:00.0", sriov.ErrNotSRIOV, "has no SR-IOV capability"},
		{vfs[0], sriov.ErrNotSRIOV, "is a virtual function of 0000:3b:00.0"},
		{"0000:99:00.0", sriov.ErrNoPF, "no PCI device 0000:99:00.0"},
	} {
		_, err := sriov.NewPlan(context.Background(), request(h, "n1/1.0.0", c.pf))
		if !errors.Is(err, c.rule) || !errors.Is(err, sriov.ErrNoFreeVF) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("pfs=[%s]: %v; want %v saying %q", c.pf, err, c.rule, c.want)
		}
	}
}

// TestSharedGroupRefused: without ACS above the adapter the PF and its
// VFs share one IOMMU group; no VF may be passed, and the error names the
// rule and the PF the VM would reach.
func TestSharedGroupRefused(t *testing.T) {
	h := newFakeHost(t)
	h.pfWithVFs(pfBDF, 40, "ib0", []int{40, 40}, pci.VFIODriver)
	_, err := sriov.NewPlan(context.Background(), request(h, "n1/42.0.0", "ib0"))
	if !errors.Is(err, sriov.ErrSharedGroup) || !errors.Is(err, sriov.ErrNoFreeVF) {
		t.Fatalf("NewPlan: %v, want ErrSharedGroup and ErrNoFreeVF", err)
	}
	for _, want := range []string{
		"VF 0000:3b:00.2 (PF ib0): IOMMU group shared with another device (shared-iommu-group): IOMMU group 40 also holds 0000:3b:00.0 (InfiniBand controller [15b3:1021], driver mlx5_core), 0000:3b:00.3",
		"ACS",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if claims, _ := sriov.ReadClaims(h.claimDir()); len(claims) != 0 {
		t.Errorf("a refused plan left claims %v", claims)
	}
	// A bridge in the group is tolerated, as for GPUs.
	h2 := newFakeHost(t)
	h2.addPCI(fn{bdf: "0000:3a:00.0", class: 0x060400, vendor: 0x8086, device: 0x347a, driver: "pcieport", group: 41})
	h2.pfWithVFs(pfBDF, 40, "ib0", []int{41}, pci.VFIODriver)
	if _, err := sriov.NewPlan(context.Background(), request(h2, "n1/42.0.0", "ib0")); err != nil {
		t.Errorf("VF with a bridge in its group: %v", err)
	}
}

func TestNoFreeVF(t *testing.T) {
	h, vfs := fourVFs(t, pci.VFIODriver)
	ctx := context.Background()
	var got []string
	for i := range vfs {
		p, err := sriov.NewPlan(ctx, request(h, "n1/"+string(rune('a'+i))+".0.0", "ib0"))
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		got = append(got, p.VF.BDF)
	}
	if strings.Join(got, " ") != strings.Join(vfs, " ") {
		t.Errorf("claimed %v, want %v in order", got, vfs)
	}
	_, err := sriov.NewPlan(ctx, request(h, "n1/e.0.0", "ib0"))
	if !errors.Is(err, sriov.ErrNoFreeVF) || !errors.Is(err, sriov.ErrClaimed) {
		t.Fatalf("fifth claim: %v, want ErrNoFreeVF and ErrClaimed", err)
	}
	if want := "VF 0000:3b:00.5 (PF ib0): VF claimed by another step (claimed): claimed by step n1/d.0.0"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

// TestClaimReleasedAtStop: Release, from the plan as JSON, removes the
// claim (a later step gets the VF again); it is idempotent and leaves
// another step's claim alone.
func TestClaimReleasedAtStop(t *testing.T) {
	h, vfs := fourVFs(t, pci.VFIODriver)
	ctx := context.Background()
	p, err := sriov.NewPlan(ctx, request(h, "n1/42.0.0", "ib0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Bind(ctx); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	if len(h.ops) != 0 {
		t.Errorf("Bind of a VF already on vfio-pci wrote %v", h.ops)
	}
	if _, err := os.Stat(filepath.Join(h.claimDir(), vfs[0]+".json")); err != nil {
		t.Fatalf("no claim file: %v", err)
	}
	q := reload(t, h, p)
	if err := q.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.claimDir(), vfs[0]+".json")); !os.IsNotExist(err) {
		t.Errorf("claim still there after Release (%v)", err)
	}
	if err := q.Release(ctx); err != nil {
		t.Errorf("second Release: %v", err)
	}
	p2, err := sriov.NewPlan(ctx, request(h, "n1/43.0.0", "ib0"))
	if err != nil || p2.VF.BDF != vfs[0] {
		t.Fatalf("next step: %v, %+v; want %s again", err, p2, vfs[0])
	}
	// The old step's Release does not take the new step's claim.
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if c, _ := sriov.ReadClaims(h.claimDir()); c[vfs[0]].Owner != "n1/43.0.0" {
		t.Errorf("claims after a stale Release: %v", c)
	}
}

// TestReleaseWaitsForVMM: a VMM still holding the VFIO group keeps the
// claim (ErrRelease, ErrBusy naming it).
func TestReleaseWaitsForVMM(t *testing.T) {
	h, vfs := fourVFs(t, pci.VFIODriver)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	p, err := sriov.NewPlan(ctx, request(h, "n1/42.0.0", "ib0"))
	if err != nil {
		t.Fatal(err)
	}
	h.holder(9001, "qemu-system-x86", "/dev/vfio/41")
	err = p.Release(ctx)
	if !errors.Is(err, sriov.ErrRelease) || !errors.Is(err, sriov.ErrBusy) || !strings.Contains(err.Error(), "held open by qemu-system-x86 (pid 9001)") {
		t.Fatalf("Release: %v", err)
	}
	if c, _ := sriov.ReadClaims(h.claimDir()); c[vfs[0]].Owner != "n1/42.0.0" {
		t.Errorf("claim gone although the VF is still in use: %v", c)
	}
}

// TestConcurrentClaims: steps starting together on one node get
// different VFs; the one too many gets ErrNoFreeVF.
func TestConcurrentClaims(t *testing.T) {
	for round := 0; round < 5; round++ {
		concurrentClaims(t)
	}
}

func concurrentClaims(t *testing.T) {
	h, vfs := fourVFs(t, pci.VFIODriver)
	const n = 6
	var wg sync.WaitGroup
	got := make([]string, n)
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			p, err := sriov.NewPlan(context.Background(), request(h, "n1/"+string(rune('a'+i))+".0.0", "ib0"))
			errs[i] = err
			if err == nil {
				got[i] = p.VF.BDF
			}
		}(i)
	}
	wg.Wait()
	var claimed []string
	refused := 0
	for i := range got {
		if errs[i] != nil {
			if !errors.Is(errs[i], sriov.ErrNoFreeVF) {
				t.Errorf("step %d: %v", i, errs[i])
			}
			refused++
			continue
		}
		claimed = append(claimed, got[i])
	}
	sort.Strings(claimed)
	if strings.Join(claimed, " ") != strings.Join(vfs, " ") || refused != n-len(vfs) {
		t.Errorf("claimed %v (%d refused), want each of %v once", claimed, refused, vfs)
	}
}

// TestBindReleaseRebind: with allow_rebind a VF on mlx5_core is moved to
// vfio-pci as driverctl does, and back at Release.
func TestBindReleaseRebind(t *testing.T) {
	h, vfs := fourVFs(t, "mlx5_core")
	ctx := context.Background()
	req := request(h, "n1/42.0.0", "ib0")
	if _, err := sriov.NewPlan(ctx, req); !errors.Is(err, sriov.ErrWrongDriver) ||
		!strings.Contains(err.Error(), "is bound to mlx5_core, not vfio-pci") || !strings.Contains(err.Error(), "network.sriov.allow_rebind") {
		t.Fatalf("without allow_rebind: %v, want ErrWrongDriver", err)
	}
	req.Config.AllowRebind = true
	p, err := sriov.NewPlan(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Rebind || p.VF.Driver != "mlx5_core" {
		t.Fatalf("plan = %+v, want a rebind from mlx5_core", p)
	}
	sriov.SetSysfsWriter(p, h.kernel)
	if err := p.Bind(ctx); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	want := []string{
		"bus/pci/devices/0000:3b:00.2/driver_override=vfio-pci",
		"bus/pci/drivers/mlx5_core/unbind=0000:3b:00.2",
		"bus/pci/drivers_probe=0000:3b:00.2",
	}
	if strings.Join(h.ops, "\n") != strings.Join(want, "\n") {
		t.Errorf("Bind wrote:\n  %s\nwant:\n  %s", strings.Join(h.ops, "\n  "), strings.Join(want, "\n  "))
	}
	if d := h.driverOf(vfs[0]); d != pci.VFIODriver {
		t.Errorf("VF on %q after Bind", d)
	}
	h.ops = nil
	if err := reload(t, h, p).Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if d := h.driverOf(vfs[0]); d != "mlx5_core" {
		t.Errorf("VF on %q after Release, want mlx5_core", d)
	}
	if ov, _ := os.ReadFile(h.path("sys/bus/pci/devices/" + vfs[0] + "/driver_override")); strings.TrimSpace(string(ov)) != "(null)" {
		t.Errorf("driver_override %q after Release", ov)
	}
	if c, _ := sriov.ReadClaims(h.claimDir()); len(c) != 0 {
		t.Errorf("claims after Release: %v", c)
	}
}

// TestBusyVFSkipped: a VF whose interface the host brought up, or whose
// verbs device a host program holds, is not taken; the next one is.
func TestBusyVFSkipped(t *testing.T) {
	h, vfs := fourVFs(t, "mlx5_core")
	h.netdev(vfs[0], "ib0v2", true)
	h.holder(4242, "ib_write_bw", "/dev/infiniband/uverbs3")
	req := request(h, "n1/42.0.0", "ib0")
	req.Config.AllowRebind = true
	p, err := sriov.NewPlan(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if p.VF.BDF != vfs[2] {
		t.Errorf("got %s, want %s (the first two are busy)", p.VF.BDF, vfs[2])
	}
	notes := strings.Join(p.Notes, "\n")
	for _, want := range []string{"its interface ib0v2 is up on the host", "/dev/infiniband/uverbs3 is held open by ib_write_bw (pid 4242)"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes %q lack %q", notes, want)
		}
	}
}

// TestGCReleasesLeftClaims: gc gives back the VF of a step whose state
// directory is gone (driver restored, claim removed) and keeps the
// claims of live steps.
func TestGCReleasesLeftClaims(t *testing.T) {
	h, vfs := fourVFs(t, "mlx5_core")
	ctx := context.Background()
	live := request(h, "n1/1.0.0", "ib0")
	live.Config.AllowRebind = true
	if err := os.MkdirAll(live.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	gone := request(h, "n1/2.0.0", "ib0")
	gone.Config.AllowRebind = true
	for _, req := range []sriov.Request{live, gone} {
		p, err := sriov.NewPlan(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		sriov.SetSysfsWriter(p, h.kernel)
		if err := p.Bind(ctx); err != nil {
			t.Fatal(err)
		}
	}
	freed, err := sriov.GCWithWriter(ctx, h.claimDir(), h.roots, nil, h.kernel)
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if strings.Join(freed, " ") != vfs[1] {
		t.Errorf("GC freed %v, want [%s]", freed, vfs[1])
	}
	if d := h.driverOf(vfs[1]); d != "mlx5_core" {
		t.Errorf("left VF on %q after GC", d)
	}
	if d := h.driverOf(vfs[0]); d != pci.VFIODriver {
		t.Errorf("live step's VF on %q after GC", d)
	}
	c, _ := sriov.ReadClaims(h.claimDir())
	if _, ok := c[vfs[0]]; !ok || len(c) != 1 {
		t.Errorf("claims after GC: %v", c)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		pfs  []string
		want []string
		err  string
	}{
		{[]string{"3B:00.0", "ib0", "mlx5_1"}, []string{"0000:3b:00.0", "ib0", "mlx5_1"}, ""},
		{nil, nil, ""},
		{[]string{"ib0", " ib0"}, nil, `lists "ib0" twice`},
		{[]string{"../x"}, nil, `network.sriov.pfs[0] = "../x" is neither a PCI address`},
		{[]string{"averyveryverylongname"}, nil, "1-15 characters"},
		{[]string{""}, nil, "is neither"},
	} {
		cfg := sriov.Config{PFs: append([]string(nil), c.pfs...)}
		err := cfg.Validate()
		if c.err == "" {
			if err != nil || strings.Join(cfg.PFs, ",") != strings.Join(c.want, ",") {
				t.Errorf("Validate(%q) = %v, %q; want %q", c.pfs, err, cfg.PFs, c.want)
			}
			continue
		}
		if !errors.Is(err, sriov.ErrConfig) || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Validate(%q) = %v, want ErrConfig saying %q", c.pfs, err, c.err)
		}
	}
}

// TestHostRulesPerVF: a VF without IOMMU group (IOMMU off), one on
// vfio-pci whose /dev/vfio/<group> is missing, and one whose group a
// foreign VM holds are each passed over with their rule; with all VFs so,
// the step is refused naming each.
func TestHostRulesPerVF(t *testing.T) {
	h, vfs := fourVFs(t, pci.VFIODriver)
	os.Remove(h.path("sys/bus/pci/devices/" + vfs[0] + "/iommu_group"))
	os.Remove(h.path("dev/vfio/42"))
	h.holder(777, "qemu-system-x86", "/dev/vfio/43")
	p, err := sriov.NewPlan(context.Background(), request(h, "n1/42.0.0", "ib0"))
	if err != nil {
		t.Fatal(err)
	}
	if p.VF.BDF != vfs[3] {
		t.Errorf("got %s, want %s", p.VF.BDF, vfs[3])
	}
	_, err = sriov.NewPlan(context.Background(), request(h, "n1/43.0.0", "ib0"))
	for _, rule := range []error{sriov.ErrNoFreeVF, sriov.ErrNoIOMMU, sriov.ErrVFIO, sriov.ErrBusy, sriov.ErrClaimed} {
		if !errors.Is(err, rule) {
			t.Errorf("second step: %v; want it to wrap %v", err, rule)
		}
	}
	for _, want := range []string{"(no-iommu)", "VFIO group device /dev/vfio/42 does not exist", "/dev/vfio/43 is held open by qemu-system-x86 (pid 777)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}
