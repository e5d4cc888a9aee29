package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
	"github.com/slurm-microvm/slurm-microvm/test/fixture/nvstandin"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestGPUsDriverReport: `gpus` reports the driver set a GPU step would get
// from a real (stand-in) driver installation, and why there is none from
// a root without one.
func TestGPUsDriverReport(t *testing.T) {
	rel, err := assets.GuestKernelRelease("")
	if err != nil {
		prereq.Missing(t, "no guest kernel: %v", err)
	}
	d := nvstandin.Require(t, nvstandin.Options{KernelRelease: rel})
	dir := t.TempDir()
	for _, s := range []string{"sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := write(t, dir, "microvm.toml", "[gpu.driver]\nmodules = [\"nvidia\", \"nvidia-uvm\"]\n[gpu.driver.params]\nnvidia = \"NVreg_StandinParam=x\"\n")
	base := []string{"--config", cfg, "gpus", "--gres-conf", write(t, dir, "other.conf", "NodeName=other Name=gpu File=/dev/nvidia0\n"), "--node", "vm", "--sysfs-root", filepath.Join(dir, "sys"), "--dev-root", filepath.Join(dir, "dev"), "--no-nvml"}

	code, out := runApp(t, append(base, "--json", "--driver-root", d.Root)...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	var rep gpu.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	dr := rep.Driver
	if dr == nil || dr.Error != "" || dr.Set == nil {
		t.Fatalf("driver report %+v", dr)
	}
	var mods, sonames []string
	for _, m := range dr.Set.Modules {
		mods = append(mods, m.Name+"("+m.Params+")")
	}
	for _, l := range dr.Set.Libraries {
		sonames = append(sonames, l.Soname)
	}
	if dr.Set.Version != d.Version || dr.KernelRelease != rel || strings.Join(mods, " ") != "nvidia(NVreg_StandinParam=x) nvidia_uvm()" ||
		!strings.Contains(strings.Join(sonames, " "), "libcuda.so.1") || len(dr.Set.Firmware) != 1 {
		t.Errorf("driver set: version %s release %s modules %v libraries %v firmware %v", dr.Set.Version, dr.KernelRelease, mods, sonames, dr.Set.Firmware)
	}

	if dr.GuestLibDir != "/usr/local/nvidia/lib64" || len(dr.Devices) != 4 || dr.Devices[0].Path != "nvidia0" {
		t.Errorf("guest side: lib %q devices %+v", dr.GuestLibDir, dr.Devices)
	}
	code, out = runApp(t, append(base, "--driver-root", d.Root)...)
	if code != 0 || !strings.Contains(out, "driver: "+d.Version+" (root "+d.Root+")") || !strings.Contains(out, "library libcuda.so.1") ||
		!strings.Contains(out, "guest: libraries at /usr/local/nvidia/lib64") || !strings.Contains(out, "/dev/nvidia-uvm-tools") {
		t.Errorf("text report (exit %d):\n%s", code, out)
	}
	empty := filepath.Join(dir, "emptyroot")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	code, out = runApp(t, append(base, "--driver-root", empty)...)
	if code != 0 || !strings.Contains(out, "driver: FAIL") || !strings.Contains(out, "not built for the guest kernel "+rel) {
		t.Errorf("no driver (exit %d, 0 without configured GPUs):\n%s", code, out)
	}
}
