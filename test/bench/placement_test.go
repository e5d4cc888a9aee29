package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/placement"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// BenchmarkPlacement boots 2-vCPU sandboxes pinned to this process's
// first two CPUs (SandboxConfig.HostCPUs, as the lifecycle passes a step's
// allocation) side by side with unpinned ones, and reports the share of
// vCPU threads the kernel shows on their allocated CPU, how long after the
// VMM's start its vCPU threads are there and how long pinning them all
// takes (from the driver's log), and what pinning does to the boot.
func BenchmarkPlacement(b *testing.B) {
	fixture.RequireRoot(b)
	fixture.Require(b, "qemu-system-x86_64", "mkfs.erofs", "busybox")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tmp := b.TempDir()
	d, _, _ := benchDriver(ctx, b, fixture.Agent(b), filepath.Join(tmp, "assets"))
	rootfs := filepath.Join(tmp, "rootfs")
	fixture.BusyboxRootfs(b, rootfs, "Placement Bench OS")
	disk := filepath.Join(tmp, "root.erofs")
	fixture.Erofs(b, rootfs, disk)
	self, err := placement.Of(os.Getpid(), placement.Host, 0, 0)
	if err != nil {
		b.Fatal(err)
	}
	host := self.CPUs
	if len(host) > 2 {
		host = host[:2]
	}
	var pinnedBoot, plainBoot, found, setting []time.Duration
	vcpus, onCPU := 0, 0
	for i := 0; i < rounds; i++ {
		for _, pin := range []bool{true, false} {
			logBuf := &fixture.SyncBuffer{}
			cfg := driver.SandboxConfig{ID: fmt.Sprintf("place%d", i), StateDir: b.TempDir(), CPUs: 2, MemoryMiB: 512,
				RootFS: driver.RootFS{Image: disk, OverlayMiB: 64}, Logger: slog.New(slog.NewJSONHandler(logBuf, nil))}
			if pin {
				cfg.HostCPUs = host
			}
			t0 := time.Now()
			sb, err := d.Start(ctx, cfg)
			if err != nil {
				b.Fatal(err)
			}
			took := time.Since(t0)
			if !pin {
				plainBoot = append(plainBoot, took)
				_ = sb.Stop(ctx)
				continue
			}
			pinnedBoot = append(pinnedBoot, took)
			threads, err := qemu.Threads(sb.Pid())
			if err != nil {
				b.Fatal(err)
			}
			want := placement.VCPUs(cfg.CPUs, host)
			for _, th := range threads {
				if th.VCPU < 0 {
					continue
				}
				vcpus++
				if got := affinity(b, sb.Pid(), th.TID); got.Equal(placement.CPUSet{want[th.VCPU]}) {
					onCPU++
				}
			}
			f, took := pinTook(b, logBuf.String())
			found = append(found, f)
			setting = append(setting, took-f)
			_ = sb.Stop(ctx)
		}
	}
	cmd := fmt.Sprintf("go test -run XXX -bench BenchmarkPlacement -benchtime 1x ./test/bench/ (2 vCPUs, 512 MiB, HostCPUs %s)", host)
	report.Add(Figure{Section: "placement", Name: "vCPU threads pinned to allocated CPUs", Value: float64(onCPU) / float64(max(vcpus, 1)), Unit: "ratio", Target: ">= 1", Command: cmd})
	report.Add(Figure{Section: "placement", Name: "vCPU threads there, after VMM start", Value: ms(median(found)), Unit: "ms", Command: cmd})
	report.Add(Figure{Section: "placement", Name: "pinning every VMM thread (sched_setaffinity)", Value: ms(median(setting)), Unit: "ms", Command: cmd})
	report.Add(Figure{Section: "placement", Name: "boot to agent ready, pinned / unpinned", Value: float64(median(pinnedBoot)) / float64(median(plainBoot)), Unit: "ratio", Command: cmd})
	b.ReportMetric(float64(onCPU)/float64(max(vcpus, 1)), "pinned-ratio")
	b.ReportMetric(ms(median(setting)), "pin-ms")
}

// affinity reads a thread's allowed CPUs from the kernel.
func affinity(b *testing.B, pid, tid int) placement.CPUSet {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			c, err := placement.ParseList(v)
			if err != nil {
				b.Fatal(err)
			}
			return c
		}
	}
	return nil
}

// pinTook is what the driver logged of its pinning ("vCPUs pinned"): when
// the vCPU threads were there, and when the last was pinned, from the
// VMM's start.
func pinTook(b *testing.B, log string) (found, took time.Duration) {
	for _, l := range strings.Split(log, "\n") {
		var rec struct {
			Msg     string `json:"msg"`
			FoundUS int64  `json:"found_us"`
			US      int64  `json:"us"`
		}
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Msg == "vCPUs pinned" {
			return time.Duration(rec.FoundUS) * time.Microsecond, time.Duration(rec.US) * time.Microsecond
		}
	}
	b.Fatalf("no \"vCPUs pinned\" line in the driver's log:\n%s", log)
	return 0, 0
}
