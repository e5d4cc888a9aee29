package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/fs"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/fault"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu/driverset"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu/gpunvml"
	"github.com/slurm-microvm/slurm-microvm/launcher/image"
	"github.com/slurm-microvm/slurm-microvm/launcher/inventory"
	"github.com/slurm-microvm/slurm-microvm/launcher/network"
	"github.com/slurm-microvm/slurm-microvm/launcher/placement"
	"github.com/slurm-microvm/slurm-microvm/launcher/runtime"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// Launcher runs the lifecycle calls with one configuration.
type Launcher struct {
	Config *config.Config
	Log    *slog.Logger
	// Trampoline is the launcher binary, through which the VMM is
	// started (launcher/runtime Options.Trampoline); "" starts it directly.
	Trampoline string

	// afterStopMark, when set (tests), runs in Stop right after the step
	// was marked stopped and its records were read.
	afterStopMark func()
	// imageHelper and imageHelperEnv, when set (tests), replace the image
	// helper's command line (image.Options.Helper, HelperEnv).
	imageHelper, imageHelperEnv []string
}

func (l *Launcher) log() *slog.Logger {
	if l.Log == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return l.Log
}

// Prepare records a step: creates its root-owned state directory (see
// package state for who may enter it) and writes spec.json. Nothing boots.
// Calling it again for the same step rewrites the spec (SPANK callbacks may
// run twice); a step already stopped is refused (state.ErrStopped).
func (l *Launcher) Prepare(ctx context.Context, s *Spec) error {
	if s.Image == "" {
		return errors.New("prepare: no image given")
	}
	if s.LocalTasks < 0 {
		return fmt.Errorf("prepare: %d local tasks", s.LocalTasks)
	}
	if _, err := GuestMemoryMiB(s, 0, l.Config.Resources); err != nil {
		return err
	}
	if _, err := l.Config.Network.NetworkMode(s.Network); err != nil {
		return err
	}
	d := s.Dir(l.Config)
	// The root: entered by job users (0711 for root, whose steps are many
	// users'; a private run's own 0700 otherwise), written by nobody else.
	rootMode := os.FileMode(0o711)
	if os.Geteuid() != 0 {
		rootMode = 0o700
	}
	if err := state.MakeDir(d.Root, rootMode); err != nil {
		return fmt.Errorf("runtime root: %w", err)
	}
	if err := d.CheckPrepare(); err != nil {
		return err
	}
	created := true
	if err := os.Mkdir(d.Path(), 0o700); errors.Is(err, os.ErrExist) {
		created = false
	} else if err != nil {
		return fmt.Errorf("create step state %s: %w", d.Path(), err)
	}
	// Stop writes its record before it looks for this directory: checked
	// again now that the directory exists, a concurrent stop is seen.
	if err := d.CheckPrepare(); err != nil {
		if created {
			_ = os.RemoveAll(d.Path())
		}
		return err
	}
	if err := state.CheckDir(d.Path()); err != nil {
		return err
	}
	if os.Geteuid() == 0 && s.UID != 0 {
		if err := state.GrantSearch(d.Path(), s.UID); err != nil {
			return fmt.Errorf("step state: %w", err)
		}
	} else if err := os.Chmod(d.Path(), 0o700); err != nil {
		return fmt.Errorf("step state: %w", err)
	}
	if err := writeSpec(d, s); err != nil {
		return fmt.Errorf("write step spec: %w", err)
	}
	return nil
}

// fail records the user-facing reason the sandbox could not start.
func fail(d state.Dir, err error) error {
	msg := strings.TrimSpace(err.Error())
	_ = state.WriteFileAtomic(d.File(state.ErrorFile), []byte(msg+"\n"), 0o644)
	return err
}

// Start is the supervisor (`slurm-microvm start`): it places itself in the
// step's cgroups, boots the sandbox, marks it ready, serves exec clients,
// and returns when the sandbox stopped (Stop, SIGTERM via ctx, or the guest
// ending by itself). Errors are also written to the step's error file.
func (l *Launcher) Start(ctx context.Context, id state.StepID) (err error) {
	d := state.Dir{Root: l.Config.RuntimeDir, ID: id}
	s, err := ReadSpec(d.Path())
	if err != nil {
		return err
	}
	log := l.log().With("step", id.String())
	// Under the step's lock: a stop that began earlier is seen here, one
	// that begins later finds this record and signals this process.
	if err := d.RecordSupervisor(os.Getpid()); err != nil {
		if errors.Is(err, state.ErrStopped) {
			log.Info("not starting", "reason", err)
			return fail(d, err)
		}
		return fail(d, fmt.Errorf("record supervisor: %w", err))
	}
	// Counted in the node's metrics from here on, whatever the end.
	tm := newTimings(log)
	defer func() { l.recordMetrics(d, tm, err) }()
	cg, err := cgroup.EnterStep(os.Getpid(), id.Job, id.Step, cgroup.Roots{})
	if err != nil {
		return fail(d, fmt.Errorf("enter step cgroup: %w", err))
	}
	for _, m := range cg.Moves {
		log.Info("moved into step cgroup", "hierarchy", cg.Mode.String(), "controller", m.Controller, "path", m.Path)
	}
	if len(cg.Outside) > 0 {
		log.Warn("the sandbox runs outside the step's cgroup: scancel and the step's memory limit do not reach it (slurm-microvm config check names the Slurm settings)",
			"hierarchy", cg.Mode.String(), "outside", cg.Outside)
	} else {
		log.Info("in the step's cgroup", "hierarchy", cg.Mode.String())
	}
	if lim, err := cgroup.MemoryLimit(os.Getpid(), cgroup.Roots{Mode: cg.Mode}); err != nil {
		log.Warn("step memory limit not read", "err", err)
	} else if lim.Bytes > 0 {
		s.MemLimitMiB = lim.MiB()
		log.Info("step memory limit", "mib", s.MemLimitMiB, "file", lim.File)
	}
	tStart := time.Now()
	sb, release, err := l.boot(ctx, s, d, log, tm)
	if err != nil {
		return fail(d, err)
	}
	defer release()
	tReady := time.Now()
	if err := l.phase(ctx, d, "mark the sandbox ready"); err != nil {
		_ = sb.Stop(context.Background())
		return fail(d, err)
	}
	// The control socket exists, the user's, before "ready" does.
	if err := sb.Listen(); err != nil {
		_ = sb.Stop(context.Background())
		return fail(d, err)
	}
	if err := state.WriteFileAtomic(d.File(state.ReadyFile), nil, 0o644); err != nil {
		_ = sb.Stop(context.Background())
		return fail(d, fmt.Errorf("mark sandbox ready: %w", err))
	}
	tm.done(PhaseReady, tReady)
	tm.done(PhaseStart, tStart)
	tm.ready(d)
	serveErr := make(chan error, 1)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { serveErr <- sb.Serve(sctx) }()
	hung := make(chan error, 1)
	go func() {
		if err := watchAgent(sctx, sb, l.Config.Timeouts.AgentPing.Duration, l.Config.Timeouts.AgentHang.Duration, log); err != nil {
			hung <- err
		}
	}()
	select {
	case <-ctx.Done():
		log.Info("stopping sandbox", "reason", context.Cause(ctx))
		t0 := time.Now()
		err := sb.Stop(context.Background())
		cancel()
		<-serveErr
		tm.done(PhaseStop, t0)
		return err
	case err := <-hung:
		log.Error("guest agent hung; killing the VMM", "err", err, "vmm_pid", sb.Pid())
		if dg, ok := sb.(driver.Diagnoser); ok {
			log.Error("hung guest", "vmm", dg.Diagnose())
		}
		// The reason first: a task whose connection breaks when the VMM
		// is gone reports the error file (Exec).
		_ = fail(d, err)
		// No graceful stop: a hung guest does not answer it, and
		// Stop with an ended ctx kills the VMM at once (SIGKILL ends a
		// stopped process too).
		now, end := context.WithCancel(context.Background())
		end()
		_ = sb.Stop(now)
		cancel()
		<-serveErr
		return err
	case <-sb.Done():
		cancel()
		<-serveErr
		return fail(d, errors.New("the microVM exited while the step was running (see --microvm-debug for its console)"))
	case err := <-serveErr:
		_ = sb.Stop(context.Background())
		return fail(d, err)
	}
}

// The phases of a start and the stop, as the supervisor logs them: one
// line each at info, msg "phase" with phase=<name> and ms=<duration in
// whole milliseconds>, once the phase succeeded (a failed phase logs its
// error instead). Names and keys are stable; tools parse them. A phase a
// step does not need (GPUs, shares, MPI, network) still gets its line,
// with the time it took to find that out.
const (
	PhaseGPUs    = "gpus"    // map and bind the step's GPUs, prepare their driver
	PhaseShares  = "shares"  // resolve the mount policy, open the shares
	PhaseImage   = "image"   // convert or find the image's disk
	PhaseMPI     = "mpi"     // check the host MPI against the image
	PhaseAssets  = "assets"  // find or build the guest kernel and initramfs
	PhaseNetwork = "network" // set up the step network
	PhaseBoot    = "boot"    // VMM spawn to agent ready and guest set up
	PhaseReady   = "ready"   // the control socket and the ready mark
	PhaseStart   = "start"   // all of the above, end to end
	PhaseStop    = "stop"    // the supervisor's stop: guest shutdown, VMM gone
	// PhaseFirstExec is the time from the ready mark to the first exec
	// client (a task) on the control socket, logged once per step.
	PhaseFirstExec = "first_exec"
)

// logPhase logs that phase, begun at t0, is done. Nothing but the name and
// the duration: never a value of the job's.
func logPhase(log *slog.Logger, phase string, t0 time.Time) {
	log.Info("phase", "phase", phase, "ms", time.Since(t0).Milliseconds())
}

// AgentHungError is the step's failure when the guest agent answered no
// ping for Hang (timeouts.agent_hang) while the VMM was alive: the guest is
// frozen (a VMM stopped by a signal, a guest kernel that locked up, an
// agent that no longer runs). The supervisor then kills the VMM.
type AgentHungError struct {
	// Hang is timeouts.agent_hang; Last the last error of a ping.
	Hang time.Duration
	Last error
}

func (e *AgentHungError) Error() string {
	return fmt.Sprintf("the guest agent did not answer for %s (timeouts.agent_hang): the guest is hung; the microVM was stopped", e.Hang)
}

func (e *AgentHungError) Unwrap() error { return e.Last }

// watchAgent pings the agent of sb every `every` while ctx lasts, and
// returns an *AgentHungError once no ping was answered for hang (measured
// from the last answer, or from the call); nil when ctx ends or the
// sandbox is gone (its end is the supervisor's other case). One ping is in
// flight at a time, bounded by the hang deadline, so a guest that froze
// right after an answer is found hang after it, and at most one interval
// later otherwise.
func watchAgent(ctx context.Context, sb driver.Sandbox, every, hang time.Duration, log *slog.Logger) error {
	last := time.Now()
	var lastErr error
	for {
		deadline := last.Add(hang)
		pctx, cancel := context.WithDeadline(ctx, deadline)
		t0 := time.Now()
		err := sb.Ping(pctx)
		cancel()
		select {
		case <-ctx.Done():
			return nil
		case <-sb.Done():
			return nil
		default:
		}
		if err == nil {
			last = time.Now()
			if took := last.Sub(t0); took > every {
				log.Warn("guest agent slow to answer a ping", "ms", took.Milliseconds())
			}
		} else {
			lastErr = err
			if !time.Now().Before(deadline) {
				return &AgentHungError{Hang: hang, Last: lastErr}
			}
			log.Warn("guest agent ping failed", "err", err)
		}
		wait := every
		if err != nil {
			// Never past the deadline: the next ping then fails at
			// once and the hang is reported on time.
			wait = min(wait, time.Until(deadline))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-sb.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// phase returns an error, without side effects, once ctx ended or a stop
// of the step began (state.ErrStopped): the supervisor checks before each
// phase that leaves something on the host, so a stop that raced with the
// start is never outlived by a scratch directory, an image conversion, a
// GPU binding or a VMM.
func (l *Launcher) phase(ctx context.Context, d state.Dir, what string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, context.Cause(ctx))
	}
	return d.CheckNotStopped(what)
}

// mountTable is a step's resolved host shares.
type mountTable struct{ *fs.Table }

func (t mountTable) Close() {
	if t.Table != nil {
		_ = t.Table.Close()
	}
}

func (t mountTable) driverShares() []driver.Share {
	if t.Table == nil {
		return nil
	}
	out := make([]driver.Share, 0, len(t.Shares))
	for _, sh := range t.Shares {
		out = append(out, driver.Share{Dir: sh.File, Destination: sh.Destination, ReadOnly: sh.ReadOnly})
	}
	return out
}

// resolveMounts applies the node's mount policy to the step's request
// (site mounts, scratch, --microvm-mounts), opening every source with the
// job user's credentials (package fs).
func (l *Launcher) resolveMounts(ctx context.Context, s *Spec, log *slog.Logger) (mountTable, error) {
	u, err := fs.LookupUser(s.UID, s.GID, s.Groups)
	if err != nil {
		return mountTable{}, err
	}
	origin := s.MountsOrigin
	if origin == "" {
		origin = fs.OptionName
	}
	t, err := l.Config.Mounts.Resolve(ctx, fs.Request{User: u, Mounts: s.Mounts, Origin: origin, Step: s.ID.String()})
	if err != nil {
		return mountTable{}, err
	}
	if len(t.Shares) > 0 {
		log.Info("host shares", "table", t.String())
	}
	return mountTable{t}, nil
}

// gpuPlanFile keeps the step's GPU plan (JSON) so that stop can release
// the GPUs from a fresh process.
const gpuPlanFile = "gpus.json"

// planGPUs maps the step's GPUs (SLURM_STEP_GPUS) to VFIO devices, binds
// them if allowed, and returns them as the sandbox gets them with the
// 64-bit PCI hole they need (bytes); none without GPUs.
// It runs before anything boots, so a GPU that cannot be passed fails the
// step with one line naming the device.
//
// It also returns the number of GPUs the guest gets.
func (l *Launcher) planGPUs(ctx context.Context, s *Spec, d state.Dir, memMiB uint64, log *slog.Logger) ([]driver.PCIDevice, uint64, int, error) {
	if s.GPUs == "" {
		return nil, 0, 0, nil
	}
	c := l.Config
	if err := checkAllocated(s.GPUs, c.GPU.GresConf); err != nil {
		return nil, 0, 0, err
	}
	if n, ok := standinGPUs(s.GPUs, c.GPU.GresConf); ok {
		log.Warn("stand-in GPUs: no VFIO passthrough (test build)", "gpus", s.GPUs)
		return nil, 0, n, nil
	}
	plan, err := gpu.NewPlan(ctx, gpu.Request{
		StepGPUs: s.GPUs, GresConf: c.GPU.GresConf, NVML: gpunvml.New(),
		AllowRebind: c.GPU.AllowRebind, GuestMemoryMiB: memMiB,
		NVSwitch: c.GPU.NVSwitch,
	})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("GPUs %s: %w", s.GPUs, err)
	}
	b, err := json.Marshal(plan)
	if err != nil {
		return nil, 0, 0, err
	}
	if err := state.WriteFileAtomic(d.File(gpuPlanFile), b, 0o644); err != nil {
		return nil, 0, 0, fmt.Errorf("record GPU plan: %w", err)
	}
	log.Info("GPU mapping", "mapping", plan.Mapping(), "notes", plan.Notes)
	if err := plan.Bind(ctx); err != nil {
		return nil, 0, 0, fmt.Errorf("GPUs %s: %w", s.GPUs, err)
	}
	return plan.Devices(), plan.Hole64(), len(plan.GPUs), nil
}

// gpuDriverFile records the step's GPU driver set (JSON) for inspection.
const gpuDriverFile = "gpu-driver.json"

// planGPUDriver finds the node's GPU driver set for the guest kernel
// (launcher/gpu/driverset), builds or reuses its cached copy, and returns
// it for a guest with gpus GPUs, with the function that closes it and
// lets the cache prune it again. nil without injection
// (gpu.driver.inject = false). A node without a usable driver set fails
// the step here, before anything boots, with one line naming what is
// missing.
func (l *Launcher) planGPUDriver(ctx context.Context, s *Spec, d state.Dir, gpus int, log *slog.Logger) (*driver.GPUDriver, func(), error) {
	c := l.Config.GPU.Driver
	if c.Inject != nil && !*c.Inject {
		log.Info("GPU driver not injected (gpu.driver.inject = false): the guest must drive its GPUs")
		return nil, func() {}, nil
	}
	rel, err := assets.GuestKernelRelease(l.Config.QEMU.Kernel)
	if err != nil {
		return nil, nil, fmt.Errorf("GPUs %s: %w", s.GPUs, err)
	}
	cache := filepath.Join(l.Config.CacheDir, "drivers")
	set, cached, err := driverset.DiscoverCached(ctx, driverset.Options{Root: c.Root, KernelRelease: rel, Modules: c.Modules, Params: c.Params}, cache)
	if err != nil {
		return nil, nil, fmt.Errorf("GPUs %s: %w", s.GPUs, err)
	}
	var built *driverset.Built
	var release func()
	// Twice at most: pruning by another step's Build may remove the entry
	// between this Build and Use.
	for try := 0; ; try++ {
		built, err = driverset.Build(ctx, set, cache)
		if err != nil {
			return nil, nil, fmt.Errorf("GPUs %s: build the driver set: %w", s.GPUs, err)
		}
		release, err = driverset.Use(ctx, built)
		if err == nil {
			break
		}
		if !errors.Is(err, driverset.ErrPruned) || try > 0 {
			return nil, nil, fmt.Errorf("GPUs %s: %w", s.GPUs, err)
		}
	}
	dir, err := os.OpenFile(built.Dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("GPUs %s: open the driver set: %w", s.GPUs, err)
	}
	done := func() { dir.Close(); release() }
	rec := struct {
		Set   *driverset.Set         `json:"set"`
		Built *driverset.Built       `json:"built"`
		Nodes []driverset.DeviceNode `json:"devices"`
	}{Set: set, Built: built}
	g := &driver.GPUDriver{
		Dir: dir, FirmwareDir: built.FirmwareDir,
		LibDir: built.LibDir, BinDir: built.BinDir,
		GuestLibDir: driverset.GuestLibDir, GuestBinDir: driverset.GuestBinDir,
	}
	for _, m := range built.Modules {
		g.Modules = append(g.Modules, driver.KernelModule{Name: m.Name, File: m.File, Params: m.Params})
	}
	rec.Nodes = set.DeviceNodes(gpus)
	for _, n := range rec.Nodes {
		g.Devices = append(g.Devices, driver.DeviceNode{Path: n.Path, MajorName: n.MajorName, FallbackMajor: n.FallbackMajor, Minor: n.Minor, Mode: n.Mode})
	}
	if b, err := json.Marshal(rec); err == nil {
		if err := state.WriteFileAtomic(d.File(gpuDriverFile), b, 0o644); err != nil {
			done()
			return nil, nil, fmt.Errorf("record GPU driver set: %w", err)
		}
	}
	log.Info("GPU driver", "set", set.Summary(), "dir", built.Dir, "discovery_cached", cached, "notes", append(set.Notes, built.Notes...))
	return g, done, nil
}

// checkAllocated verifies the step's GPUs against Slurm's own record of
// the allocation. SLURM_STEP_GPUS reaches the plugin through the job's
// environment, which the user can set (`SLURM_STEP_GPUS=0 srun ...`
// without --gres); the step's devices cgroup (cgroup.conf
// ConstrainDevices=yes) is what Slurm enforces. This process sits in it,
// so opening a GPU's device file fails with EPERM unless the step owns it
// (other errors, such as ENXIO without a driver, mean the cgroup let the
// open through). If the cgroup lets through a GPU of the node that the
// step did not ask for, devices are not constrained and nothing can be
// verified: passthrough is refused.
func checkAllocated(stepGPUs, gresConf string) error {
	idx, err := gpu.ParseStepGPUs(stepGPUs)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	if i := strings.IndexByte(host, '.'); i > 0 {
		host = host[:i]
	}
	gc, err := gpu.LoadGresConf(gresConf, host)
	if err != nil {
		return fmt.Errorf("GPUs %s: %w", stepGPUs, err)
	}
	asked := map[int]bool{}
	for _, i := range idx {
		asked[i] = true
	}
	allowed := func(dev gpu.GresDevice) (bool, string) {
		files := dev.Files
		if len(files) == 0 {
			files = []string{dev.File}
		}
		for _, f := range files {
			fd, err := unix.Open(f, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(fd)
				continue
			}
			if errors.Is(err, unix.EPERM) {
				return false, f
			}
		}
		return true, ""
	}
	// Denied GPUs first: a forged index beside a real allocation is the
	// user's error, not an unconstrained node.
	var unconstrained error
	for _, dev := range gc.Devices {
		ok, file := allowed(dev)
		switch {
		case asked[dev.Index] && !ok:
			return fmt.Errorf("GPU %d (%s) is not allocated to this step: the step's devices cgroup denies %s (SLURM_STEP_GPUS=%s comes from the job's environment; ask for GPUs with --gres=gpu:N)", dev.Index, dev.Where(), file, stepGPUs)
		case !asked[dev.Index] && ok && unconstrained == nil:
			unconstrained = fmt.Errorf("GPUs %s: the step may open %s (GPU %d, not in the step): devices are not constrained, so the step's GPUs cannot be verified; set ConstrainDevices=yes in cgroup.conf", stepGPUs, dev.File, dev.Index)
		}
	}
	return unconstrained
}

// releaseGPUs gives the step's GPUs back (their drivers as before) once the
// sandbox is gone (its driver's Cleanup gave the VFIO group files back to
// root); an error names the device that is not free.
func releaseGPUs(ctx context.Context, d state.Dir) error {
	b, err := os.ReadFile(d.File(gpuPlanFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var plan gpu.Plan
	if err := json.Unmarshal(b, &plan); err != nil {
		return fmt.Errorf("read GPU plan: %w", err)
	}
	return plan.Release(ctx)
}

// boot resolves the image and the guest assets and starts the sandbox.
func (l *Launcher) boot(ctx context.Context, s *Spec, d state.Dir, log *slog.Logger, tm *timings) (driver.Sandbox, func(), error) {
	c := l.Config
	cpus := GuestCPUs(s, os.Getpid())
	memMiB, err := GuestMemoryMiB(s, cpus, c.Resources)
	if err != nil {
		return nil, nil, err
	}
	drv, err := runtime.New(c, runtime.Options{Trampoline: l.Trampoline})
	if err != nil {
		return nil, nil, err
	}
	caps := drv.Capabilities()
	hostCPUs, memNodes := placeStep(s, caps, placement.Host, log)
	// Stop and gc clean up with the driver that started the sandbox,
	// whatever the configuration says by then.
	if err := runtime.Record(d.Path(), drv.Name()); err != nil {
		return nil, nil, err
	}
	if err := l.phase(ctx, d, "plan GPUs"); err != nil {
		return nil, nil, err
	}
	t0 := time.Now()
	devices, hole64, gpus, err := l.planGPUs(ctx, s, d, memMiB, log)
	if err != nil {
		return nil, nil, err
	}
	var gpuDriver *driver.GPUDriver
	done := func() {}
	if gpus > 0 {
		if err := l.phase(ctx, d, "prepare the GPU driver"); err != nil {
			return nil, nil, err
		}
		if gpuDriver, done, err = l.planGPUDriver(ctx, s, d, gpus, log); err != nil {
			return nil, nil, err
		}
	}
	tm.done(PhaseGPUs, t0)
	// Held while the sandbox runs (the cache prunes no set in use); the
	// directory itself the VMM holds once started.
	started := false
	defer func() {
		if !started {
			done()
		}
	}()
	if err := l.phase(ctx, d, "create scratch and open shares"); err != nil {
		return nil, nil, err
	}
	t0 = time.Now()
	shares, err := l.resolveMounts(ctx, s, log)
	if err != nil {
		return nil, nil, err
	}
	tm.done(PhaseShares, t0)
	// QEMU holds its own descriptors once started.
	defer shares.Close()
	if err := fault.At(s.ID.Job, fault.Shares); err != nil {
		return nil, nil, fmt.Errorf("open the host shares: %w", err)
	}
	if len(devices) > 0 && caps.Passthrough != "" {
		return nil, nil, fmt.Errorf("GPUs %s: %s", s.GPUs, caps.Passthrough)
	}
	if err := l.phase(ctx, d, "prepare the image"); err != nil {
		return nil, nil, err
	}
	if err := fault.At(s.ID.Job, fault.Image); err != nil {
		return nil, nil, fmt.Errorf("image %s: %w", s.Image, err)
	}
	t0 = time.Now()
	// The disk is held (a shared flock) while the sandbox runs, so a prune
	// never removes it; holding it records the use (launcher/image Use).
	img, releaseImage, err := image.Hold(ctx, s.Image, image.Options{
		UID: s.UID, GID: s.GID, Groups: s.Groups,
		CacheRoot: filepath.Join(c.CacheDir, "images"),
		Logger:    log,
		Limits:    ImageLimits(c.Images),
		Helper:    l.imageHelper, HelperEnv: l.imageHelperEnv,
	})
	if err != nil {
		return nil, nil, err
	}
	releaseGPUDriver := done
	done = func() { releaseImage(); releaseGPUDriver() }
	log.Info("image ready", "image", s.Image, "digest", img.Digest, "disk", img.Disk, "ms", time.Since(t0).Milliseconds())
	tm.done(PhaseImage, t0)
	if err := fault.At(s.ID.Job, fault.Disk); err != nil {
		return nil, nil, fmt.Errorf("image %s: disk %s: %w", s.Image, img.Disk, err)
	}
	if err := l.phase(ctx, d, "check MPI"); err != nil {
		return nil, nil, err
	}
	t0 = time.Now()
	mpiShare, err := l.planMPI(ctx, s, d, img.Disk, log)
	if err != nil {
		return nil, nil, err
	}
	tm.done(PhaseMPI, t0)
	sharesForVM := shares.driverShares()
	if mpiShare != nil {
		defer mpiShare.Dir.Close()
		sharesForVM = append(sharesForVM, *mpiShare)
	}
	if fault.On(s.ID.Job, fault.ShareRW) {
		log.Warn("fault injected: every host share read-write", "fault", fault.ShareRW)
		sharesForVM = readWrite(sharesForVM)
	}
	t0 = time.Now()
	if err := drv.Prepare(ctx, log); err != nil {
		return nil, nil, err
	}
	tm.done(PhaseAssets, t0)
	if err := l.phase(ctx, d, "set up the step network"); err != nil {
		return nil, nil, err
	}
	t0 = time.Now()
	netw, closeNet, err := l.planNetwork(ctx, s, d, log)
	if err != nil {
		return nil, nil, err
	}
	tm.done(PhaseNetwork, t0)
	// The VMM holds its own descriptors once started; the host objects
	// stay until stop (or gc) removes them by their recorded names.
	defer closeNet()
	if err := l.phase(ctx, d, "boot"); err != nil {
		return nil, nil, err
	}
	log.Info("booting", "driver", drv.Name(), "vcpus", cpus, "memory_mib", memMiB)
	tm.resolved(d, inventory.Resolved{ImageDigest: img.Digest, Driver: drv.Name(), VCPUs: cpus, MemoryMiB: memMiB})
	if err := fault.At(s.ID.Job, fault.VMM); err != nil {
		return nil, nil, fmt.Errorf("start the VMM: %w", err)
	}
	t0 = time.Now()
	sb, err := drv.Start(ctx, driver.SandboxConfig{
		ID: s.ID.String(), StateDir: d.Path(),
		CPUs: cpus, MemoryMiB: memMiB, HostCPUs: hostCPUs, MemoryNodes: memNodes,
		RootFS:   driver.RootFS{Image: img.Disk, OverlayMiB: OverlayMiB(memMiB, c.Resources)},
		ImageEnv: img.Config.Env, ImageWorkdir: img.Config.WorkingDir,
		User: s.User, UID: s.UID, GID: s.GID, Groups: s.Groups,
		Hostname: s.Hostname, Debug: s.Debug, Logger: log,
		Devices: devices, PCIHole64: hole64,
		Shares: sharesForVM, GPUDriver: gpuDriver, Network: netw,
		OnFirstExec: func() { tm.firstExec(d) },
	})
	if err != nil {
		return nil, nil, err
	}
	if err := fault.At(s.ID.Job, fault.Agent); err != nil {
		// As a boot whose agent never became ready: the VMM goes first.
		_ = sb.Stop(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("boot sandbox %s: wait for the guest agent: %w", s.ID, err)
	}
	tm.done(PhaseBoot, t0)
	started = true
	return sb, done, nil
}

// Stop ends the step's sandbox and removes its state. It first marks the
// step stopped (state.Dir.MarkStopped), so that a prepare or a supervisor
// that has not recorded itself yet never begins; then asks a recorded
// supervisor to stop (SIGTERM: graceful poweroff), kills it and the VMM by
// their recorded pids if they outlive the grace period, and removes the
// state directory. A step with no state is not an error.
func (l *Launcher) Stop(ctx context.Context, id state.StepID) error {
	d := state.Dir{Root: l.Config.RuntimeDir, ID: id}
	markErr := d.MarkStopped()
	if markErr != nil {
		l.log().Error("mark stop", "step", id.String(), "err", markErr)
	}
	_ = state.PruneStopRecords(d.Root, 0, "", time.Now())
	if _, err := os.Stat(d.Path()); errors.Is(err, os.ErrNotExist) {
		return markErr
	}
	grace := l.Config.Timeouts.StopGrace.Duration
	sup, supErr := state.ReadProc(d.File(state.SupervisorFile))
	if l.afterStopMark != nil {
		l.afterStopMark()
	}
	if supErr == nil && sup.Alive() {
		_ = sup.Signal(unix.SIGTERM)
		if !waitGone(ctx, sup, grace+2*time.Second) {
			l.log().Warn("supervisor did not stop in time; killing it", "pid", sup.Pid)
			_ = sup.Signal(unix.SIGKILL)
			waitGone(ctx, sup, 2*time.Second)
		}
	}
	// The sandbox's host side (a VMM, a shim), by the driver that started
	// it, from its records in the state directory.
	drv, err := runtime.ForState(l.Config, d.Path())
	if err != nil {
		return fmt.Errorf("stop step %s: %w", id, err)
	}
	if err := drv.Cleanup(ctx, d.Path()); err != nil {
		// Keep the state (and its records) for the epilog's gc to retry.
		l.log().Error("sandbox not cleaned up", "step", id.String(), "driver", drv.Name(), "err", err)
		return fmt.Errorf("stop step %s: %w", id, err)
	}
	if err := releaseGPUs(ctx, d); err != nil {
		// Keep the state (and its plan) for the epilog's gc to retry.
		l.log().Error("GPUs not released", "step", id.String(), "err", err)
		return fmt.Errorf("stop step %s: %w", id, err)
	}
	if err := teardownNetwork(ctx, d); err != nil {
		// Keep the state (and its record) for the epilog's gc to retry.
		l.log().Error("step network not removed", "step", id.String(), "err", err)
		return fmt.Errorf("stop step %s: %w", id, err)
	}
	if err := l.Config.Mounts.RemoveScratch(id.String()); err != nil {
		return fmt.Errorf("stop step %s: %w", id, err)
	}
	if fault.On(id.Job, fault.LeakState) {
		l.log().Warn("fault injected: step state left in place", "step", id.String(), "dir", d.Path(), "fault", fault.LeakState)
		return markErr
	}
	if err := os.RemoveAll(d.Path()); err != nil {
		return fmt.Errorf("remove step state %s: %w", d.Path(), err)
	}
	return markErr
}

// waitGone polls until p is gone or timeout passes; true when gone.
func waitGone(ctx context.Context, p state.Proc, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for p.Alive() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// jobDirsWait bounds how long gc waits for the job's cgroup directories
// to be free of the processes of the steps it stopped.
const jobDirsWait = 5 * time.Second

// GC stops every step of job that still has state on node (after a
// crash, a requeue, or a missed stop); the steps of other nodes that share
// the runtime root (multiple-slurmd) are theirs. It returns every error met.
func (l *Launcher) GC(ctx context.Context, job uint32, node string) error {
	entries, err := os.ReadDir(l.Config.RuntimeDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gc job %d: %w", job, err)
	}
	var errs []error
	for _, e := range entries {
		id, err := state.ParseStepID(e.Name())
		if err != nil || id.Job != job || id.Node != node {
			continue
		}
		if err := l.Stop(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	// Network objects of steps whose state is already gone (a crashed
	// stop, a supervisor killed while it set them up): found by name.
	if os.Geteuid() == 0 {
		if removed, err := network.GC(ctx, node, job); err != nil {
			errs = append(errs, err)
		} else if len(removed) > 0 {
			l.log().Warn("removed leftover step network objects", "job", job, "node", node, "objects", removed)
		}
	}
	// Cgroup directories a killed slurmstepd left (only empty ones; its
	// tasks end a moment after the supervisor this gc stopped).
	if os.Geteuid() == 0 {
		removed, left, err := cgroup.RemoveJobDirsWait(ctx, "/sys/fs/cgroup", job, jobDirsWait)
		if err != nil {
			errs = append(errs, err)
		}
		if len(removed) > 0 {
			l.log().Warn("removed leftover cgroup directories of the job", "job", job, "dirs", removed)
		}
		if len(left) > 0 {
			l.log().Warn("cgroup directories of the job still busy", "job", job, "dirs", left)
		}
	}
	// Scratch of steps whose state is already gone (a crashed stop).
	if err := l.Config.Mounts.RemoveJobScratch(job, node); err != nil {
		errs = append(errs, err)
	}
	// The epilog: no step of the job starts any more.
	if err := state.PruneStopRecords(l.Config.RuntimeDir, job, node, time.Now()); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
