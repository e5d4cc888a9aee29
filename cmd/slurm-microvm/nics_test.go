package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/network/sriov"
)

// fakeSRIOV lays out, under dir/sys, a ConnectX PF 0000:3b:00.0 (ib0)
// with two VFs on vfio-pci: 3b:00.2 in IOMMU group 41 alone and 3b:00.3
// in group 40 with the PF.
func fakeSRIOV(t *testing.T, dir string) {
	t.Helper()
	sys := filepath.Join(dir, "sys")
	mk := func(rel, content string) {
		p := filepath.Join(sys, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln := func(target, rel string) {
		p := filepath.Join(sys, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	dev := func(bdf string, device uint16, group int, driver string) {
		d := "bus/pci/devices/" + bdf
		mk(d+"/class", "0x020700\n")
		mk(d+"/vendor", "0x15b3\n")
		mk(d+"/device", fmt.Sprintf("0x%04x\n", device))
		ln(filepath.Join(sys, "kernel/iommu_groups", fmt.Sprint(group)), d+"/iommu_group")
		ln(filepath.Join(sys, d), fmt.Sprintf("kernel/iommu_groups/%d/devices/%s", group, bdf))
		ln(filepath.Join(sys, "bus/pci/drivers", driver), d+"/driver")
		if driver == "vfio-pci" {
			p := filepath.Join(dir, "dev/vfio", fmt.Sprint(group))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("bus/pci/drivers/vfio-pci/bind", "")
	mk("bus/pci/drivers/mlx5_core/bind", "")
	dev("0000:3b:00.0", 0x1021, 40, "mlx5_core")
	mk("bus/pci/devices/0000:3b:00.0/sriov_totalvfs", "8\n")
	mk("bus/pci/devices/0000:3b:00.0/sriov_numvfs", "2\n")
	mk("bus/pci/devices/0000:3b:00.0/net/ib0/flags", "0x1003\n")
	ln(filepath.Join(sys, "bus/pci/devices/0000:3b:00.0"), "bus/pci/devices/0000:3b:00.0/net/ib0/device")
	ln(filepath.Join(sys, "bus/pci/devices/0000:3b:00.0/net/ib0"), "class/net/ib0")
	for i, g := range []int{41, 40} {
		vf := fmt.Sprintf("0000:3b:00.%d", i+2)
		dev(vf, 0x101e, g, "vfio-pci")
		ln("../"+vf, fmt.Sprintf("bus/pci/devices/0000:3b:00.0/virtfn%d", i))
		ln("../0000:3b:00.0", "bus/pci/devices/"+vf+"/physfn")
	}
}

// TestNICsReport: `nics --json` lists the configured PF (by interface
// name, from the configuration) and its VFs, one free and one refused for
// its shared IOMMU group with the rule named; a second run after a claim
// shows the first claimed. A PF that does not exist exits 1.
func TestNICsReport(t *testing.T) {
	dir := t.TempDir()
	fakeSRIOV(t, dir)
	claims := filepath.Join(dir, "claims")
	cfg := write(t, dir, "microvm.toml", "[network.sriov]\npfs = [\"ib0\"]\n")
	args := []string{"--config", cfg, "nics", "--json", "--sysfs", filepath.Join(dir, "sys"), "--dev-root", filepath.Join(dir, "dev"), "--procfs-root", filepath.Join(dir, "proc"), "--claim-dir", claims}
	report := func() sriov.Report {
		t.Helper()
		code, out := runApp(t, args...)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		var rep sriov.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		return rep
	}
	rep := report()
	if len(rep.PFs) != 1 || rep.PFs[0].BDF != "0000:3b:00.0" || len(rep.PFs[0].VFs) != 2 || rep.Free != 1 {
		t.Fatalf("report %+v", rep)
	}
	v0, v1 := rep.PFs[0].VFs[0], rep.PFs[0].VFs[1]
	if v0.BDF != "0000:3b:00.2" || v0.State != sriov.StateFree || v0.IOMMUGroup != 41 {
		t.Errorf("VF 0 = %+v", v0)
	}
	if v1.State != sriov.StateUnusable || v1.Rule != "shared-iommu-group" || !strings.Contains(v1.Why, "0000:3b:00.0") {
		t.Errorf("VF 1 = %+v, want unusable for its shared IOMMU group", v1)
	}

	// A step on this node claims VF 0 (procfs is empty: nobody holds a device).
	if err := os.MkdirAll(filepath.Join(dir, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "dev/vfio"), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := sriov.NewPlan(t.Context(), sriov.Request{Config: sriov.Config{PFs: []string{"ib0"}}, ClaimDir: claims, Owner: "vm/7.0.0",
		Roots: sriov.Roots{Sys: filepath.Join(dir, "sys"), Proc: filepath.Join(dir, "proc"), Dev: filepath.Join(dir, "dev")}})
	if err != nil {
		t.Fatal(err)
	}
	rep = report()
	if v := rep.PFs[0].VFs[0]; v.State != sriov.StateClaimed || v.Claim == nil || v.Claim.Owner != "vm/7.0.0" || rep.Free != 0 {
		t.Errorf("after a claim: VF 0 = %+v, free %d", v, rep.Free)
	}
	if err := p.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if rep = report(); rep.PFs[0].VFs[0].State != sriov.StateFree {
		t.Errorf("after Release: VF 0 = %+v", rep.PFs[0].VFs[0])
	}

	// No PF configured: nothing to pass, not an error (as gpus without gres.conf).
	if code, out := runApp(t, "--config", filepath.Join(dir, "none.toml"), "nics", "--sysfs", filepath.Join(dir, "sys"), "--claim-dir", claims); code != 0 || !strings.Contains(out, "passes no VFs") {
		t.Errorf("nics without network.sriov: exit %d:\n%s", code, out)
	}
	code, out := runApp(t, "--config", cfg, "nics", "--pf", "ib9", "--sysfs", filepath.Join(dir, "sys"), "--claim-dir", claims)
	if code != 1 || !strings.Contains(out, "ib9") || !strings.Contains(out, "no-pf") {
		t.Errorf("nics --pf ib9: exit %d, want 1 naming ib9 and the rule:\n%s", code, out)
	}
}
