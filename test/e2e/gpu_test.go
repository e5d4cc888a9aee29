package e2e

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/fixture/nvstandin"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// gpuDriverTests are the GPU steps of stand-in GPUs (gres Type=standin,
// booted without VFIO by the e2e build) and a real stand-in NVIDIA driver
// (test/fixture/nvstandin: kernel modules built for the guest kernel that
// register NVIDIA's character devices and request its firmware, sonamed
// user-space libraries in a linker cache, nvidia-smi) installed at
// gpu.driver.root. Only the hardware is missing; the driver set goes the
// way a real one does: discovery, the cached set, the 9p share, module
// loading, device nodes and the guest's dynamic linker.
func gpuDriverTests(t *testing.T, e *harness.Env) {
	if err := os.RemoveAll(harness.GPUDriverRoot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(harness.GPUDriverRoot) })

	e.Run(t, "a GPU step on a node without a driver set fails before boot", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			setup func() error
			want  []string
		}{
			{"no driver root", func() error { return nil }, []string{harness.GPUDriverRoot, "does not exist", "gpu.driver.root"}},
			{"no modules for the guest kernel", func() error { return os.MkdirAll(harness.GPUDriverRoot, 0o755) },
				[]string{"NVIDIA kernel modules are not built for the guest kernel " + e.Kernel, harness.GPUDriverRoot + "/lib/modules/" + e.Kernel}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if err := tc.setup(); err != nil {
					t.Fatal(err)
				}
				out, errOut, code := e.Srun(t, cluster.TestUser, "--gres=gpu:standin:1", "--microvm="+e.Image, "echo", "SHOULD-NOT-RUN")
				if code == 0 || strings.Contains(out, "SHOULD-NOT-RUN") {
					t.Fatalf("exit %d, stdout %q: the step must fail", code, out)
				}
				first := lineWith(errOut, "slurm-microvm: ")
				for _, w := range tc.want {
					if !strings.Contains(first, w) {
						t.Errorf("stderr %q: want one line with %q", errOut, w)
					}
				}
				if strings.Contains(errOut, "console") {
					t.Errorf("stderr %q: no VM may boot", errOut)
				}
			})
		}
	})

	d := harness.InstallStandinDriver(t, e)
	img := gpuImage(t)
	before := fileSum(t, img)

	const script = `echo MODULES $(cut -d' ' -f1 /proc/modules | sort | tr '\n' ' ')
grep nvidia /proc/devices | sed 's/^/PROCDEV /'
for n in /dev/nvidia*; do stat -c 'NODE %n %F %t:%T %a' "$n"; done
echo FW=$(cat /sys/module/nvidia/parameters/fw_bytes)
echo PARAM=$(cat /sys/module/nvidia/parameters/NVreg_StandinParam)
echo READ=$(head -c 64 /dev/nvidia0)
cuda_probe
nvidia-smi
echo CVD=$CUDA_VISIBLE_DEVICES
`
	e.Run(t, "a GPU step gets the node's driver", func(t *testing.T) {
		out, errOut, code := e.Srun(t, cluster.TestUser, "--gres=gpu:standin:2", "--microvm="+img, "sh", "-c", script)
		if code != 0 {
			t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
		}
		t.Logf("guest:\n%s", out)
		mods := lineWith(out, "MODULES ")
		for _, m := range []string{" nvidia ", " nvidia_uvm "} {
			if !strings.Contains(mods+" ", m) {
				t.Errorf("/proc/modules %q lacks%s", mods, m)
			}
		}
		uvm := regexp.MustCompile(`(?m)^PROCDEV (\d+) nvidia-uvm$`).FindStringSubmatch(out)
		if uvm == nil || !strings.Contains(out, "PROCDEV 195 nvidia\n") {
			t.Fatalf("/proc/devices: want 195 nvidia and a dynamic nvidia-uvm major:\n%s", out)
		}
		var major int
		fmt.Sscan(uvm[1], &major)
		for _, want := range []string{
			"NODE /dev/nvidia0 character special file c3:0 666",
			"NODE /dev/nvidia1 character special file c3:1 666",
			"NODE /dev/nvidiactl character special file c3:ff 666",
			fmt.Sprintf("NODE /dev/nvidia-uvm character special file %x:0 666", major),
			fmt.Sprintf("NODE /dev/nvidia-uvm-tools character special file %x:1 666", major),
		} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("want %q (device nodes from the majors the driver registered)", want)
			}
		}
		if strings.Contains(out, "/dev/nvidia2") || strings.Contains(out, "nvidia-modeset") {
			t.Errorf("nodes beyond the step's 2 GPUs and its modules:\n%s", out)
		}
		checks := map[string]string{
			"FW=":    fmt.Sprint(nvstandin.FirmwareSize),
			"PARAM=": "from-site-config",
			"READ=":  strings.TrimSpace(nvstandin.DeviceMessage),
			"CVD=":   "0,1",
		}
		for k, want := range checks {
			if got := strings.TrimPrefix(lineWith(out, k), k); got != want {
				t.Errorf("%s%q, want %q", k, got, want)
			}
		}
		if got := lineWith(out, "libcuda: "); got != "libcuda: "+d.Version+"-host" {
			t.Errorf("cuda_probe %q: want the node's libcuda %s ahead of the image's own (%s)", got, d.Version, nvstandin.StaleVersion)
		}
		if got := lineWith(out, "libcuda path: "); !strings.HasPrefix(got, "libcuda path: /usr/local/nvidia/lib64/") {
			t.Errorf("cuda_probe %q: want libcuda from /usr/local/nvidia/lib64", got)
		}
		if !strings.Contains(out, "Driver Version: "+d.Version) {
			t.Errorf("nvidia-smi did not report driver %s", d.Version)
		}
	})

	e.Run(t, "a step without GPUs gets none of it", func(t *testing.T) {
		out, errOut, code := e.Srun(t, cluster.TestUser, "--microvm="+img, "sh", "-c",
			script+"echo NVDIR=$(ls -d /usr/local/nvidia 2>&1)\n")
		t.Logf("guest:\n%s%s", out, errOut)
		if strings.Contains(lineWith(out, "MODULES ")+" ", " nvidia ") || strings.Contains(out, "PROCDEV") || strings.Contains(out, "NODE /dev/nvidia") {
			t.Errorf("a step without GPUs got the driver:\n%s", out)
		}
		if got := lineWith(out, "libcuda: "); got != "libcuda: "+nvstandin.StaleVersion {
			t.Errorf("cuda_probe %q: want the image's own libcuda", got)
		}
		if !strings.Contains(lineWith(out, "NVDIR="), "No such file") {
			t.Errorf("/usr/local/nvidia exists in a step without GPUs: %q", lineWith(out, "NVDIR="))
		}
		_ = code
	})

	if after := fileSum(t, img); after != before {
		t.Errorf("the image changed: sha256 %s -> %s", before, after)
	}
}

// gpuImage is a Debian image with a CUDA-style program (cuda_probe, which
// dlopen()s libcuda.so.1) and its own stale libcuda.so.1 in the linker's
// cache: what an image that carries a driver library looks like.
func gpuImage(t *testing.T) string {
	dir := t.TempDir()
	probe, stale := filepath.Join(dir, "cuda_probe"), filepath.Join(dir, "libcuda.so.1")
	if err := nvstandin.ImageProgram(t.Context(), probe); err != nil {
		t.Fatal(err)
	}
	if err := nvstandin.StaleLibcuda(t.Context(), stale); err != nil {
		t.Fatal(err)
	}
	return harness.DebianImage(t, "cuda", "", map[string]string{
		"usr/local/bin/cuda_probe":              probe,
		"usr/lib/x86_64-linux-gnu/libcuda.so.1": stale,
	})
}

func lineWith(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

func fileSum(t *testing.T, p string) string {
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}
