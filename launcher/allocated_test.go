package launcher

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// fakeGPUMajor is a character major of the range for local use (Linux
// devices.txt: 240-254), so that no driver answers: an open that the
// devices cgroup lets through fails with ENXIO, one it denies with EPERM.
const fakeGPUMajor = 240

// TestCheckAllocated runs checkAllocated in a real devices cgroup (v1)
// that allows some of three fake GPU device files, as a step's cgroup
// with ConstrainDevices=yes does: the step's SLURM_STEP_GPUS must be
// exactly what the cgroup allows.
func TestCheckAllocated(t *testing.T) {
	if os.Getenv("SMV_ALLOC_HELPER_CGROUP") != "" {
		allocHelper()
		return
	}
	prereq.Root(t, "mknod and cgroup directories")
	const devRoot = "/sys/fs/cgroup/devices"
	if _, err := os.Stat(devRoot + "/devices.deny"); err != nil {
		prereq.Hardware(t, "no cgroup v1 devices controller at %s (cgroup v2 constrains devices with eBPF): %v", devRoot, err)
	}
	dir := t.TempDir()
	for i := 0; i < 3; i++ {
		if err := syscall.Mknod(filepath.Join(dir, fmt.Sprintf("fakegpu%d", i)), syscall.S_IFCHR|0o666, fakeGPUMajor<<8|i); err != nil {
			t.Fatal(err)
		}
	}
	gres := filepath.Join(dir, "gres.conf")
	if err := os.WriteFile(gres, []byte("AutoDetect=off\nName=gpu File="+dir+"/fakegpu[0-2]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		stepGPUs string
		allowed  []int
		want     string // "" for no error
	}{
		{"the allocated GPU", "0", []int{0}, ""},
		{"two allocated GPUs, as a range", "1-2", []int{1, 2}, ""},
		{"a forged GPU", "1", []int{0}, "GPU 1 (" + gres + ":2) is not allocated to this step"},
		{"a forged GPU and no allocation", "0", nil, "is not allocated to this step"},
		{"one allocated and one forged", "0,1", []int{0}, "GPU 1"},
		{"devices not constrained", "0", []int{0, 1, 2}, "devices are not constrained"},
		{"malformed", "0,x", []int{0}, "bad SLURM_STEP_GPUS"},
	}
	for n, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cg := filepath.Join(devRoot, fmt.Sprintf("slurm-microvm-alloc-test-%d-%d", os.Getpid(), n))
			if err := os.Mkdir(cg, 0o755); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(cg)
			if err := os.WriteFile(cg+"/devices.deny", []byte("a"), 0); err != nil {
				t.Fatal(err)
			}
			for _, i := range tt.allowed {
				rule := fmt.Sprintf("c %d:%d rwm", fakeGPUMajor, i)
				if err := os.WriteFile(cg+"/devices.allow", []byte(rule), 0); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestCheckAllocated$")
			cmd.Env = append(os.Environ(), "SMV_ALLOC_HELPER_CGROUP="+cg, "SMV_ALLOC_HELPER_GPUS="+tt.stepGPUs, "SMV_ALLOC_HELPER_GRES="+gres)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("helper: %v\n%s", err, out)
			}
			got := string(out)
			res, _, _ := strings.Cut(got[strings.Index(got, "RESULT ")+len("RESULT "):], "\n")
			if tt.want == "" && res != "ok" || tt.want != "" && !strings.Contains(res, tt.want) {
				t.Fatalf("SLURM_STEP_GPUS=%s in a cgroup allowing %v: %s; want %q", tt.stepGPUs, tt.allowed, res, tt.want)
			}
			if tt.name == "malformed" && !strings.Contains(res, gpu.ErrStepGPUs.Error()) {
				t.Errorf("%s does not wrap gpu.ErrStepGPUs", res)
			}
		})
	}
}

// allocHelper is TestCheckAllocated's child: it moves itself into the
// devices cgroup and prints checkAllocated's verdict.
func allocHelper() {
	cg := os.Getenv("SMV_ALLOC_HELPER_CGROUP")
	if err := os.WriteFile(cg+"/cgroup.procs", []byte("0"), 0); err != nil {
		fmt.Println("RESULT join", cg, err)
		return
	}
	if err := checkAllocated(os.Getenv("SMV_ALLOC_HELPER_GPUS"), os.Getenv("SMV_ALLOC_HELPER_GRES")); err != nil {
		fmt.Println("RESULT", err)
		return
	}
	fmt.Println("RESULT ok")
}
