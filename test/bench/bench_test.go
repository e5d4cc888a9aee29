// Package bench measures slurm-microvm side by side with its baselines in
// one run (`make bench`). Targets are ratios, never timed assertions:
//
//   - step launch: `srun --microvm=IMG true` vs a bare QEMU boot of the same
//     kernel and initramfs (same accelerator, same machine options) whose
//     PID 1 powers off at once; target: at most 1.15 once the image is
//     cached.
package bench

import (
	"context"
	"fmt"
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
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/image"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
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

// BenchmarkStepLaunch prints every launch figure of issue 2 in one run:
// image prepare (uncached, cached), boot to agent ready, exec round trip,
// stop, and srun --microvm true vs the bare boot.
func BenchmarkStepLaunch(b *testing.B) {
	e := harness.Setup(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	accel := qemu.DetectAccel()
	a, err := assets.Ensure(ctx, assets.Options{Agent: e.Agent, CacheDir: filepath.Join(harness.CacheDir, "assets")})
	if err != nil {
		b.Fatal(err)
	}
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

	// The sandbox alone: boot to agent ready, one exec round trip, stop.
	d := qemu.New(qemu.Options{
		Binary: "qemu-system-x86_64", Accel: accel, Kernel: a.Kernel, Initrd: a.Initrd,
		Cmdline: assets.KernelCmdline(accel), Seccomp: true,
		BootTimeout: 2 * time.Minute, StopGrace: 5 * time.Second,
	})
	var boot, execRT, stop []time.Duration
	for i := 0; i < rounds; i++ {
		dir := b.TempDir()
		t0 := time.Now()
		sb, err := d.Start(ctx, driver.SandboxConfig{ID: "bench", StateDir: dir, CPUs: 2, MemoryMiB: 512, RootFS: driver.RootFS{Image: disk, OverlayMiB: 64}})
		if err != nil {
			b.Fatal(err)
		}
		boot = append(boot, time.Since(t0))
		sctx, scancel := context.WithCancel(ctx)
		if err := sb.Listen(); err != nil {
			b.Fatal(err)
		}
		go func() { _ = sb.Serve(sctx) }()
		for j := 0; j < 500; j++ {
			if _, err := os.Stat(filepath.Join(dir, "control.sock")); err == nil {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		t0 = time.Now()
		c, err := control.Attach(ctx, dir)
		if err != nil {
			b.Fatal(err)
		}
		p, err := c.Exec(ctx, driver.ProcessSpec{Argv: []string{"true"}})
		if err != nil {
			b.Fatal(err)
		}
		p.Relay(ctx, nil, nil, nil)
		if _, err := p.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		execRT = append(execRT, time.Since(t0))
		c.Close()
		t0 = time.Now()
		_ = sb.Stop(ctx)
		stop = append(stop, time.Since(t0))
		scancel()
	}

	// srun --microvm=IMG true vs the bare boot, alternating.
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
	srun := func() time.Duration {
		t0 := time.Now()
		_, errOut, code := e.Srun(b, "", stepShape[0], stepShape[1], "--microvm="+e.Image, "true")
		if code != 0 {
			b.Fatalf("srun --microvm true: exit %d: %s", code, errOut)
		}
		return time.Since(t0)
	}
	plain := func() time.Duration {
		t0 := time.Now()
		if _, errOut, code := e.Srun(b, "", stepShape[0], stepShape[1], "true"); code != 0 {
			b.Fatalf("srun true: exit %d: %s", code, errOut)
		}
		return time.Since(t0)
	}
	srun() // warm the per-user image cache of the Slurm path
	var bares, sruns, plains []time.Duration
	for i := 0; i < rounds; i++ {
		bares = append(bares, bare())
		sruns = append(sruns, srun())
		plains = append(plains, plain())
	}

	rows := []struct {
		name string
		v    time.Duration
	}{
		{"image prepare, uncached", median(uncached)},
		{"image prepare, cached", median(cached)},
		{"boot to agent ready", median(boot)},
		{"exec round trip (true)", median(execRT)},
		{"stop (end processes, sync, kill)", median(stop)},
		{"bare QEMU boot + poweroff", median(bares)},
		{"srun true (no microVM)", median(plains)},
		{"srun --microvm true", median(sruns)},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\naccelerator %s, kernel %s, guest 2 vCPUs 512 MiB, median of %d\n", accel, a.KernelVersion, rounds)
	for _, r := range rows {
		fmt.Fprintf(&sb, "  %-30s %9.1f ms\n", r.name, ms(r.v))
	}
	ratio := float64(median(sruns)) / float64(median(bares))
	fmt.Fprintf(&sb, "  %-30s %9.2f   (target <= 1.15)\n", "srun --microvm / bare boot", ratio)
	fmt.Fprintf(&sb, "  %-30s %9.2f\n", "(srun --microvm - srun) / bare", float64(median(sruns)-median(plains))/float64(median(bares)))
	b.Log(sb.String())
	b.ReportMetric(ms(median(boot)), "boot-ms")
	b.ReportMetric(ms(median(execRT)), "exec-ms")
	b.ReportMetric(ms(median(sruns)), "srun-microvm-ms")
	b.ReportMetric(ms(median(bares)), "bare-boot-ms")
	b.ReportMetric(ratio, "launch/bare")
	_ = fixture.RepoRoot
}
