package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/image"
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

// execStages split one exec round trip through the control socket, as the
// agent client makes it, into stages that add up to its total: host
// timestamps around each call, and the guest agent's own timings of the
// process (api.CreateProcessResponse.create_ns, api.WaitResponse.run_ns).
type execStages struct {
	attach time.Duration // connect to the supervisor's control socket (host)
	create time.Duration // the agent's CreateProcess work, arrival to the process's start (guest)
	run    time.Duration // the process, its start to its reaping (guest)
	relay  time.Duration // the rest: requests and answers through supervisor, yamux, virtio-serial; exit status and output EOFs back (host total less the guest parts)
	close  time.Duration // close the connection (host)
}

func (s execStages) total() time.Duration { return s.attach + s.create + s.run + s.relay + s.close }

// BenchmarkExec measures the exec round trip of `true` in a running
// microVM (issue 13, target 3: p50 at most 10 ms): execRounds round trips
// through the control socket, as a task's relay makes them, with the time
// of each stage, and as many through the exec entry binary, as slurmstepd
// starts it per task (process start, config, state, attach, exec, exit).
func BenchmarkExec(b *testing.B) {
	e := harness.Setup(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	d, _, accel := benchDriver(ctx, b, e.Agent, filepath.Join(harness.CacheDir, "assets"))
	img, err := image.Prepare(ctx, e.Image, image.Options{CacheRoot: b.TempDir(), Helper: []string{e.Launcher, "image", "helper"}})
	if err != nil {
		b.Fatal(err)
	}
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

	// The round trip a task makes (launcher.ExecIn, as the exec entry
	// calls it, with no input): attach, run, relay, exit status, close.
	once := func() time.Duration {
		t0 := time.Now()
		c, err := control.Attach(ctx, dir)
		if err != nil {
			b.Fatal(err)
		}
		st, err := launcher.ExecIn(ctx, c, driver.ProcessSpec{Argv: []string{"true"}}, launcher.Stdio{})
		if err != nil || st.Code != 0 || st.Signal != 0 {
			b.Fatalf("exec true: %v, %v", st, err)
		}
		c.Close()
		return time.Since(t0)
	}
	// The same round trip by the agent client's calls, split in stages.
	sock := filepath.Join(dir, state.ControlSocket)
	staged := func() execStages {
		var s execStages
		t0 := time.Now()
		conn, err := net.Dial("unix", sock)
		if err != nil {
			b.Fatal(err)
		}
		c := agent.NewClient(conn)
		t1 := time.Now()
		p, err := c.Start(ctx, &api.CreateProcessRequest{Argv: api.Bytes([]string{"true"}), StdinClosed: true})
		if err != nil {
			b.Fatal(err)
		}
		p.Relay(ctx, nil, nil, nil)
		st, err := p.Wait(ctx)
		if err != nil || st.Code != 0 || st.Signal != 0 {
			b.Fatalf("exec true: %v, %v", st, err)
		}
		t2 := time.Now()
		c.Close()
		t3 := time.Now()
		s.attach, s.create, s.run, s.close = t1.Sub(t0), p.GuestCreate, st.GuestRun, t3.Sub(t2)
		s.relay = t2.Sub(t1) - s.create - s.run
		return s
	}
	for i := 0; i < 5; i++ { // warm up: page cache, the guest's dentries
		once()
		staged()
	}
	var totals []time.Duration
	var stages []execStages
	for i := 0; i < execRounds; i++ {
		totals = append(totals, once())
		stages = append(stages, staged())
	}
	// One agent round trip on an open connection: what each call costs
	// in transit.
	conn, err := net.Dial("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	pc := agent.NewClient(conn)
	var pings []time.Duration
	for i := 0; i < execRounds; i++ {
		t0 := time.Now()
		if _, err := pc.Ping(ctx, &api.PingRequest{}); err != nil {
			b.Fatal(err)
		}
		pings = append(pings, time.Since(t0))
	}
	pc.Close()

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

	// The stages of the median round trip, so that they add up to it.
	sort.Slice(stages, func(i, j int) bool { return stages[i].total() < stages[j].total() })
	mid := stages[(len(stages)-1)/2]
	const cmdSock = "control.Attach + launcher.ExecIn(true, no stdin) + Close on a running sandbox (2 vCPUs, 512 MiB)"
	const cmdStages = "agent client on the control socket: dial, Start(true, stdin_closed), Relay, Wait, Close; guest parts from the agent's create_ns and run_ns"
	const cmdEntry = "SLURM_MICROVM_ARGV0=true SLURM_MICROVM_STATE=DIR slurm-microvm-exec (as slurmstepd starts a task)"
	figs := []Figure{
		{Section: "exec", Name: "exec round trip (true), p50", Value: ms(pct(totals, 50)), Unit: "ms", Target: "<= 10", Command: cmdSock},
		{Section: "exec", Name: "exec round trip (true), p90", Value: ms(pct(totals, 90)), Unit: "ms", Command: cmdSock},
		{Section: "exec", Name: "staged round trip (true), median", Value: ms(mid.total()), Unit: "ms", Command: cmdStages},
		{Section: "exec", Name: "  stage: client attach (host)", Value: ms(mid.attach), Unit: "ms", Command: cmdStages},
		{Section: "exec", Name: "  stage: agent create, to process start (guest)", Value: ms(mid.create), Unit: "ms", Command: cmdStages},
		{Section: "exec", Name: "  stage: process start to exit (guest)", Value: ms(mid.run), Unit: "ms", Command: cmdStages},
		{Section: "exec", Name: "  stage: transit, exit status, output drained", Value: ms(mid.relay), Unit: "ms", Command: cmdStages},
		{Section: "exec", Name: "  stage: close (host)", Value: ms(mid.close), Unit: "ms", Command: cmdStages},
		{Section: "exec", Name: "agent round trip (Ping on an open connection), p50", Value: ms(pct(pings, 50)), Unit: "ms", Command: "agent client Ping over the control socket"},
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
