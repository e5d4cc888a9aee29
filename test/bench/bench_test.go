// Package bench measures slurm-microvm side by side with its baselines in
// one run (`make bench`), each figure with its target and the command that
// measures it (benchreport), printed and written as JSON; the README's
// measurements are regenerated from that JSON (benchdoc). Targets are
// ratios measured in the same run, never timed assertions:
//
//   - launch: `srun --microvm=IMG true` vs a bare QEMU boot of the same
//     kernel and initramfs (same accelerator and machine) whose PID 1
//     powers off at once, target at most 1.15, with the breakdown of the
//     median round, read off the supervisor's log and the guest's boot
//     marks, whose parts add up to it;
//   - size: the same step from 1 vCPU and 512 MiB to all CPUs and the
//     node's memory, each within 10% of the small shape;
//   - memory: the VMM's resident memory beyond the guest's;
//   - exec, placement, shares, baseline, mpi: their own files.
package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/image"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// rounds is how many samples each figure is the median of.
const rounds = 5

// stepShape makes the srun step's guest the bare boot's twin: 2 vCPUs and
// 512 MiB (704 MiB step memory minus the harness config's 192 MiB VMM
// overhead).
var stepShape = [2]string{"-c2", "--mem=704"}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkStepLaunch measures, side by side in one run: image prepare
// (uncached, cached), the sandbox alone (boot to agent ready, stop), a bare
// boot of the same kernel and initramfs, `srun true` and `srun --microvm
// true`, with the breakdown of the median `srun --microvm` round read off
// the supervisor's log (launch.go), and the launch's independence of the
// guest's size (sizes.go).
func BenchmarkStepLaunch(b *testing.B) {
	e := harness.Setup(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	d, a, accel := benchDriver(ctx, b, e.Agent, filepath.Join(harness.CacheDir, "assets"))
	helper := []string{e.Launcher, "image", "helper"}

	// Image prepare: uncached (fresh cache each round), then cached.
	var uncached, cached []time.Duration
	var disk string
	for i := 0; i < rounds; i++ {
		cacheRoot := b.TempDir()
		o := image.Options{UID: 0, GID: 0, CacheRoot: cacheRoot, Helper: helper}
		t0 := time.Now()
		if _, err := image.Prepare(ctx, e.Image, o); err != nil {
			b.Fatal(err)
		}
		uncached = append(uncached, time.Since(t0))
		t0 = time.Now()
		img, err := image.Prepare(ctx, e.Image, o)
		if err != nil || !img.Cached {
			b.Fatalf("cached prepare: %v (cached=%v)", err, img != nil && img.Cached)
		}
		cached = append(cached, time.Since(t0))
		disk = filepath.Join(b.TempDir(), "root.erofs")
		data, _ := os.ReadFile(img.Disk)
		_ = os.WriteFile(disk, data, 0o644)
	}

	// The sandbox alone: boot to agent ready, VMM memory, stop.
	var boot, stop []time.Duration
	var mem []vmmMemory
	for i := 0; i < rounds; i++ {
		dir := b.TempDir()
		t0 := time.Now()
		sb, err := d.Start(ctx, driver.SandboxConfig{ID: "bench", StateDir: dir, CPUs: 2, MemoryMiB: 512, RootFS: driver.RootFS{Image: disk, OverlayMiB: 64}})
		if err != nil {
			b.Fatal(err)
		}
		boot = append(boot, time.Since(t0))
		m, err := readVMMMemory(dir, 512)
		if err != nil {
			b.Fatal(err)
		}
		mem = append(mem, m)
		t0 = time.Now()
		_ = sb.Stop(ctx)
		stop = append(stop, time.Since(t0))
	}

	// srun --microvm=IMG true vs the bare boot and srun true, alternating.
	bare := func() time.Duration {
		args, err := qemu.Args(qemu.VMConfig{
			Name: "bare", Accel: accel, CPUs: 2, MemoryMiB: 512, Kernel: a.Kernel, Initrd: a.Initrd,
			Cmdline:  append(assets.KernelCmdline(accel), "quiet", "loglevel=3", "slurm_microvm.poweroff=1"),
			RootDisk: disk, ConsoleLog: "/dev/null", AgentFD: 3, Seccomp: true,
		})
		if err != nil {
			b.Fatal(err)
		}
		fds, _ := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
		host, guest := os.NewFile(uintptr(fds[0]), "h"), os.NewFile(uintptr(fds[1]), "g")
		defer host.Close()
		cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
		cmd.ExtraFiles = []*os.File{guest}
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("bare boot: %v\n%s", err, out)
		}
		guest.Close()
		return time.Since(t0)
	}
	plain := func() time.Duration {
		t0 := time.Now()
		if _, errOut, code := e.Srun(b, "", stepShape[0], stepShape[1], "true"); code != 0 {
			b.Fatalf("srun true: exit %d: %s", code, errOut)
		}
		return time.Since(t0)
	}
	srunMicroVM(b, e, stepShape[:]) // warm the per-user image cache of the Slurm path
	var bares, plains []time.Duration
	var sruns []launchRound
	for i := 0; i < rounds; i++ {
		bares = append(bares, bare())
		sruns = append(sruns, srunMicroVM(b, e, stepShape[:]))
		plains = append(plains, plain())
	}
	totals := make([]time.Duration, len(sruns))
	for i, r := range sruns {
		totals[i] = r.Total
	}
	srunCmd := "srun " + strings.Join(stepShape[:], " ") + " --microvm=IMG true"
	add := func(name string, v time.Duration, command string) {
		report.Add(Figure{Section: "launch", Name: name, Value: ms(v), Unit: "ms", Command: command})
	}
	add("image prepare, uncached", median(uncached), "image.Prepare of the busybox OCI archive, empty cache")
	add("image prepare, cached", median(cached), "image.Prepare again, cache hit")
	add("sandbox boot to agent ready", median(boot), "qemu driver Start, 2 vCPUs 512 MiB, no Slurm")
	add("sandbox stop", median(stop), "qemu driver Stop of the booted sandbox")
	add("bare QEMU boot + poweroff", median(bares), "qemu-system-x86_64 (same kernel, initramfs, machine) with slurm_microvm.poweroff=1")
	add("srun true (no microVM)", median(plains), "srun "+strings.Join(stepShape[:], " ")+" true")
	add("srun --microvm true", median(totals), srunCmd)
	// The ratio of each round (a bare boot and a step taken one after the
	// other), so that load that comes and goes on the machine weighs on
	// both sides of it; its median is held to the target, its spread shown.
	var ratios []float64
	for i := range sruns {
		ratios = append(ratios, float64(sruns[i].Total)/float64(bares[i]))
	}
	sort.Float64s(ratios)
	report.Add(Figure{Section: "launch", Name: "srun --microvm true / bare boot", Value: ratios[len(ratios)/2], Unit: "ratio", Target: "<= 1.15", Command: srunCmd + " vs the bare boot just before it, median of the rounds' ratios"})
	report.Add(Figure{Section: "launch", Name: "  lowest round", Value: ratios[0], Unit: "ratio", Command: "the same, the round with the lowest ratio"})
	report.Add(Figure{Section: "launch", Name: "  highest round", Value: ratios[len(ratios)-1], Unit: "ratio", Command: "the same, the round with the highest ratio"})
	report.Add(Figure{Section: "launch", Name: "(srun --microvm - srun) / bare boot", Value: float64(median(totals)-median(plains)) / float64(median(bares)), Unit: "ratio", Command: "the VM's share of the launch, Slurm's own removed"})
	mid := medianRound(sruns)
	for _, p := range mid.Parts {
		add("  "+p.Name, p.D, "part of the median round (supervisor log, guest boot marks)")
	}
	mm := medianMemory(mem)
	report.Add(Figure{Section: "memory", Name: "guest memory touched at agent ready", Value: mm.GuestMiB, Unit: "MiB", Command: "Rss of the guest RAM mapping in /proc/<vmm>/smaps, 512 MiB guest"})
	report.Add(Figure{Section: "memory", Name: "VMM memory beyond the guest's (Rss)", Value: mm.VMMMiB, Unit: "MiB", Command: "Rss of the VMM minus that of the guest RAM mapping, at agent ready"})
	report.Add(Figure{Section: "memory", Name: "  of which TCG translation cache", Value: mm.TCGMiB, Unit: "MiB", Command: "Rss of the VMM's anonymous rwx mappings (TCG only; none under KVM)"})
	report.Add(Figure{Section: "memory", Name: "  of which mapped files (page cache shared by VMMs)", Value: mm.FilesMiB, Unit: "MiB", Command: "Rss of file mappings: QEMU, its libraries, the kernel and initramfs it keeps mapped"})
	report.Add(Figure{Section: "memory", Name: "  of which the VMM's own anonymous memory", Value: mm.OwnMiB, Unit: "MiB", Command: "the rest: heap, device state, thread stacks"})

	launchSizes(b, e)
}
