package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/image"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// execRounds is how many exec round trips each exec figure is taken from.
const execRounds = 50

// pct is the p-th percentile (0-100) of d, nearest rank.
func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	if i < 1 {
		i = 1
	}
	return s[i-1]
}

// execStages are the host-side timestamps of one exec round trip through
// the control socket, each stage from the end of the one before.
type execStages struct {
	attach time.Duration // control.Attach: connect to the supervisor's socket
	create time.Duration // Exec: CreateProcess answered (the process started in the guest)
	wait   time.Duration // Relay + Wait: exit status back, stdout and stderr drained
	close  time.Duration // Close the connection
}

func (s execStages) total() time.Duration { return s.attach + s.create + s.wait + s.close }

// BenchmarkExec measures the exec round trip of `true` in a running
// microVM (issue 13, target 3: p50 at most 10 ms): execRounds round trips
// through the control socket, as a task's relay makes them, with the time
// of each stage, and as many through the exec entry binary, as slurmstepd
// starts it per task (process start, config, state, attach, exec, exit).
func BenchmarkExec(b *testing.B) {
	e := harness.Setup(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	accel := qemu.DetectAccel()
	a, err := assets.Ensure(ctx, assets.Options{Agent: e.Agent, CacheDir: filepath.Join(harness.CacheDir, "assets")})
	if err != nil {
		b.Fatal(err)
	}
	report.Environment(accel, a.KernelVersion)
	img, err := image.Prepare(ctx, e.Image, image.Options{CacheRoot: b.TempDir(), Helper: []string{e.Launcher, "image", "helper"}})
	if err != nil {
		b.Fatal(err)
	}
	d := qemu.New(qemu.Options{
		Binary: "qemu-system-x86_64", Accel: accel, Kernel: a.Kernel, Initrd: a.Initrd,
		Cmdline: assets.KernelCmdline(accel), Seccomp: true,
		BootTimeout: 2 * time.Minute, StopGrace: 5 * time.Second,
	})
	dir := b.TempDir()
	sb, err := d.Start(ctx, driver.SandboxConfig{ID: "bench", StateDir: dir, CPUs: 2, MemoryMiB: 512, RootFS: driver.RootFS{Image: img.Disk, OverlayMiB: 64}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sb.Stop(ctx) }()
	if err := sb.Listen(); err != nil {
		b.Fatal(err)
	}
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	go func() { _ = sb.Serve(sctx) }()

	once := func() execStages {
		var s execStages
		t0 := time.Now()
		c, err := control.Attach(ctx, dir)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		p, err := c.Exec(ctx, driver.ProcessSpec{Argv: []string{"true"}})
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		p.Relay(ctx, nil, nil, nil)
		st, err := p.Wait(ctx)
		if err != nil || st.Code != 0 || st.Signal != 0 {
			b.Fatalf("exec true: %v, %v", st, err)
		}
		t3 := time.Now()
		c.Close()
		t4 := time.Now()
		s.attach, s.create, s.wait, s.close = t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), t4.Sub(t3)
		return s
	}
	for i := 0; i < 5; i++ { // warm up: page cache, the guest's dentries
		once()
	}
	var stages []execStages
	var totals []time.Duration
	for i := 0; i < execRounds; i++ {
		s := once()
		stages = append(stages, s)
		totals = append(totals, s.total())
	}

	// The exec entry binary as slurmstepd starts it for a task: argv[0]
	// is the exec entry link, the task's argv in SLURM_MICROVM_ARGV0 and
	// the arguments, the state directory named by SLURM_MICROVM_STATE
	// (the plugin's SLURM_MICROVM_STEP resolves to the same directory).
	if err := state.WriteFileAtomic(filepath.Join(dir, state.ReadyFile), nil, 0o644); err != nil {
		b.Fatal(err)
	}
	entry := filepath.Join(filepath.Dir(e.Launcher), "slurm-microvm-exec")
	entryOnce := func() time.Duration {
		cmd := exec.CommandContext(ctx, entry)
		cmd.Args = []string{entry}
		cmd.Env = append(os.Environ(), launcher.EnvArgv0+"=true", launcher.EnvState+"="+dir, launcher.EnvConfig+"="+e.Config)
		t0 := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(t0)
		if err != nil {
			b.Fatalf("%s (argv0 true): %v\n%s", entry, err, out)
		}
		return d
	}
	for i := 0; i < 3; i++ {
		entryOnce()
	}
	var entries []time.Duration
	for i := 0; i < execRounds; i++ {
		entries = append(entries, entryOnce())
	}
	// The same binary doing nothing but start and exit: the share of the
	// entry's figure that is process start (exec, Go runtime, init).
	var starts []time.Duration
	for i := 0; i < execRounds; i++ {
		cmd := exec.CommandContext(ctx, e.Launcher, "--version")
		t0 := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s --version: %v\n%s", e.Launcher, err, out)
		}
		starts = append(starts, time.Since(t0))
	}

	stage := func(f func(execStages) time.Duration) time.Duration {
		var d []time.Duration
		for _, s := range stages {
			d = append(d, f(s))
		}
		return pct(d, 50)
	}
	const cmdSock = "control.Attach + Exec(true) + Relay + Wait + Close on a running sandbox (2 vCPUs, 512 MiB)"
	const cmdEntry = "SLURM_MICROVM_ARGV0=true SLURM_MICROVM_STATE=DIR slurm-microvm-exec (as slurmstepd starts a task)"
	figs := []Figure{
		{Section: "exec", Name: "exec round trip (true), p50", Value: ms(pct(totals, 50)), Unit: "ms", Target: "<= 10", Command: cmdSock},
		{Section: "exec", Name: "exec round trip (true), p90", Value: ms(pct(totals, 90)), Unit: "ms", Command: cmdSock},
		{Section: "exec", Name: "  stage: client attach, p50", Value: ms(stage(func(s execStages) time.Duration { return s.attach })), Unit: "ms", Command: cmdSock},
		{Section: "exec", Name: "  stage: agent create (process started), p50", Value: ms(stage(func(s execStages) time.Duration { return s.create })), Unit: "ms", Command: cmdSock},
		{Section: "exec", Name: "  stage: exit status + output drained, p50", Value: ms(stage(func(s execStages) time.Duration { return s.wait })), Unit: "ms", Command: cmdSock},
		{Section: "exec", Name: "  stage: close, p50", Value: ms(stage(func(s execStages) time.Duration { return s.close })), Unit: "ms", Command: cmdSock},
		{Section: "exec", Name: "exec entry round trip (true), p50", Value: ms(pct(entries, 50)), Unit: "ms", Command: cmdEntry},
		{Section: "exec", Name: "exec entry round trip (true), p90", Value: ms(pct(entries, 90)), Unit: "ms", Command: cmdEntry},
		{Section: "exec", Name: "  of which: entry binary start + exit, p50", Value: ms(pct(starts, 50)), Unit: "ms", Command: "slurm-microvm --version"},
	}
	var sbuf strings.Builder
	fmt.Fprintf(&sbuf, "\nexec, %d round trips each, accelerator %s\n", execRounds, accel)
	for _, f := range figs {
		report.Add(f)
		fmt.Fprintf(&sbuf, "  %-50s %8.2f %s\n", f.Name, f.Value, f.Unit)
	}
	b.Log(sbuf.String())
	b.ReportMetric(ms(pct(totals, 50)), "exec-p50-ms")
	b.ReportMetric(ms(pct(entries, 50)), "entry-p50-ms")
}
