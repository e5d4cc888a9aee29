package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/fs"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/transport"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// Options configure the driver (from microvm.toml and the guest assets).
type Options struct {
	Binary string
	Accel  string // resolved: "kvm" or "tcg"
	Kernel string // vmlinux
	Initrd string
	// Cmdline is added to the kernel command line (e.g. tsc_early_khz).
	Cmdline []string
	// RunAs runs QEMU with the job's numeric identity (uid, gid and
	// supplementary groups of the SandboxConfig) when the caller is root.
	// Off, QEMU keeps the caller's identity, and a root caller then gets
	// no host shares (see Start).
	RunAs   bool
	Seccomp bool
	// HugePageMiB is the huge page size a passthrough guest's RAM comes
	// in (config qemu.hugepages: 2 or 1024); 0: anonymous memory.
	HugePageMiB uint64
	// PinTCG pins the vCPU threads under TCG too (tests of the pinning
	// itself); the product pins under KVM only (see doc.go).
	PinTCG      bool
	BootTimeout time.Duration
	StopGrace   time.Duration
	// ConsoleMaxBytes bounds the guest console kept in the state
	// (console.log); 0 means DefaultConsoleMaxBytes.
	ConsoleMaxBytes int64
	// Trampoline is an executable that runs Trampoline when its first
	// argument is TrampolineArg (the launcher binary): QEMU is started
	// through it so that the signals Slurm sends the whole step reach
	// the workload and not the VMM. "" starts QEMU directly.
	Trampoline string
	// Assets, when Kernel is "", is where Prepare finds or builds the
	// guest kernel and initramfs (launcher/assets); Prepare then sets
	// Kernel, Initrd and Cmdline.
	Assets *assets.Options
}

// Driver is the QEMU runtime driver.
type Driver struct{ o Options }

// New returns a QEMU driver.
func New(o Options) *Driver { return &Driver{o: o} }

// Name is "qemu".
func (d *Driver) Name() string { return "qemu" }

// File names the driver keeps in the state directory.
const (
	vmmLog      = "vmm.log"          // QEMU's own stdout/stderr
	devicesFile = "vmm-devices.list" // device files given to the VMM's uid, one per line
)

type sandbox struct {
	d       *Driver
	cfg     driver.SandboxConfig
	log     *slog.Logger
	cmd     *exec.Cmd
	sess    *transport.Session
	done    chan struct{}
	waitErr error
	ep      control.Endpoint
	mounts  []*api.Mount
	// gpuDriver is the agent's GPU driver set-up (nil without one).
	gpuDriver *api.GPUDriver
	// network is the agent's network set-up (nil: loopback only).
	network *api.Network
	// vmmUID is the uid the VMM runs as (pinning acts as it).
	vmmUID uint32

	stopOnce sync.Once
	// stopping is set before Stop kills the VMM: its end is then not a
	// failure of the step.
	stopping atomic.Bool
	// oomBase is cgroup.OOMKills of the VMM's memory cgroup when it
	// started (oomKnown: it could be read).
	oomBase  uint64
	oomKnown bool
}

// Start boots the VM and returns once the agent answered and is set up.
// On any failure everything started is torn down before it returns.
//
// QEMU is executed with the job's numeric identity (see identity): every
// file it needs but that identity may not open by name is opened here and
// inherited. Host shares are refused unless QEMU runs as the job's user
// (ErrSharesNeedJobIdentity), and more shares than the machine has device
// slots for are refused before QEMU starts (*TooManySharesError).
func (d *Driver) Start(ctx context.Context, cfg driver.SandboxConfig) (driver.Sandbox, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	id, err := d.identity(cfg)
	if err != nil {
		return nil, err
	}
	// The GPU driver set is one more read-only share, mounted by the
	// agent itself rather than at a destination in the root.
	shares := cfg.Shares[:len(cfg.Shares):len(cfg.Shares)]
	if cfg.GPUDriver != nil {
		if cfg.GPUDriver.Dir == nil {
			return nil, errors.New("GPU driver set: no directory")
		}
		shares = append(shares, driver.Share{Dir: cfg.GPUDriver.Dir, ReadOnly: true})
	}
	if len(shares) > 0 && !id.asJob {
		return nil, fmt.Errorf("%w: %s; %d host share(s) refused (set qemu.runas = true, the default, in microvm.toml)", ErrSharesNeedJobIdentity, id.why, len(shares))
	}
	pciMachine := len(cfg.Devices) > 0
	if max := MaxShares(pciMachine, len(cfg.Devices)); len(shares) > max {
		return nil, &TooManySharesError{Shares: len(shares), Max: max, PCI: pciMachine, GPUs: len(cfg.Devices)}
	}
	var machineArgs, deviceFiles []string
	if pciMachine {
		if d.o.Accel != "kvm" {
			return nil, errors.New(d.noPassthrough())
		}
		var err error
		if cfg.MemoryMiB, err = WholePages(cfg.MemoryMiB, d.o.HugePageMiB); err != nil {
			return nil, err
		}
		if machineArgs, err = PCIArgs(cfg.Devices, Memory{MiB: cfg.MemoryMiB, PreallocThreads: cfg.CPUs, HugePageMiB: d.o.HugePageMiB, HostNodes: cfg.MemoryNodes}, cfg.PCIHole64); err != nil {
			return nil, err
		}
		for _, dev := range cfg.Devices {
			if dev.VFIOGroupFile != "" {
				deviceFiles = append(deviceFiles, dev.VFIOGroupFile)
			}
		}
		// VFIO pins all guest memory; QEMU, run as the job's user, has
		// no root exemption. Inherited by QEMU.
		lim := (cfg.MemoryMiB + 1024) << 20
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: lim, Max: lim}); err != nil {
			return nil, fmt.Errorf("raise RLIMIT_MEMLOCK to %d MiB for VFIO: %w", lim>>20, err)
		}
		// Given back to root by Cleanup (or when QEMU ends), even after
		// a crash of this process.
		if err := state.WriteFileAtomic(filepath.Join(cfg.StateDir, devicesFile), []byte(strings.Join(deviceFiles, "\n")+"\n"), 0o644); err != nil {
			return nil, fmt.Errorf("record the VMM's device files: %w", err)
		}
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("create control channel: %w", err)
	}
	hostEnd := os.NewFile(uintptr(fds[0]), "agent-host")
	guestEnd := os.NewFile(uintptr(fds[1]), "agent-vmm")
	// Closed right after QEMU started (it holds its own copy): while this
	// process holds it too, the channel never reaches EOF when QEMU dies
	// and a failed boot would wait on it.
	defer guestEnd.Close()
	fail := func(err error) (driver.Sandbox, error) {
		hostEnd.Close()
		return nil, err
	}

	// d.o.Cmdline (assets.KernelCmdline) carries the console, reboot and
	// timer settings; add the verbosity.
	var cmdline []string
	if !cfg.Debug {
		cmdline = append(cmdline, "quiet", "loglevel=3")
	} else {
		cmdline = append(cmdline, "slurm_microvm.debug=1")
	}
	cmdline = append(cmdline, d.o.Cmdline...)
	if pciMachine {
		// virtio-pci and the rest are not in the agent's boot set.
		cmdline = append(cmdline, "slurm_microvm.modules=all")
	}

	// The files QEMU reads or writes by name, opened here (as root where
	// the supervisor is root) and inherited: fds 4.. follow the control
	// channel (3). The kernel and initrd are taken by /proc/self/fd/N
	// (QEMU's loader reopens them; they are world-readable assets); the
	// root disk and the console log by fd set (QEMU dup()s them, so a
	// root-only image cache or state directory stays root-only).
	consolePath := filepath.Join(cfg.StateDir, state.ConsoleLog)
	var opened []*os.File
	defer func() {
		for _, f := range opened {
			f.Close()
		}
	}()
	open := func(what, path string, flag int) (*os.File, error) {
		f, err := os.OpenFile(path, flag|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s for the VMM: %w", what, err)
		}
		opened = append(opened, f)
		return f, nil
	}
	extra := []*os.File{guestEnd}
	for _, f := range []struct {
		what, path string
		flag       int
	}{
		{"kernel", d.o.Kernel, os.O_RDONLY},
		{"initrd", d.o.Initrd, os.O_RDONLY},
		{"root disk", cfg.RootFS.Image, os.O_RDONLY},
	} {
		if f.path == "" {
			return fail(fmt.Errorf("qemu: no %s given", f.what))
		}
		of, err := open(f.what, f.path, f.flag)
		if err != nil {
			return fail(err)
		}
		extra = append(extra, of)
	}
	// The console: QEMU writes a pipe that the supervisor copies into
	// console.log, bounded (console.go).
	con, err := openConsole(consolePath, d.o.ConsoleMaxBytes)
	if err != nil {
		return fail(err)
	}
	opened = append(opened, con.w) // QEMU holds its own copy once started
	extra = append(extra, con.w)
	const kernelFD, initrdFD, diskFD, consoleFD = 4, 5, 6, 7
	const diskSet, consoleSet = 1, 2
	// The network device: a tap the launcher opened (and, under KVM, the
	// vhost-net device for it) as the next fds, or QEMU's user-mode NAT.
	var netdev *NetDevice
	var netSetup *api.Network
	if n := cfg.Network; n != nil {
		if (n.Tap == nil) == !n.User {
			return fail(errors.New("network: give exactly one of a tap device and user mode"))
		}
		netdev = &NetDevice{User: n.User, MAC: n.Guest.MAC}
		if n.Tap != nil {
			netdev.TapFD = 3 + len(extra)
			extra = append(extra, n.Tap)
			vhost, err := openVhost(d.o.Accel)
			if err != nil {
				return fail(err)
			}
			if vhost != nil {
				opened = append(opened, vhost)
				netdev.VhostFD = 3 + len(extra)
				extra = append(extra, vhost)
			}
		}
		netSetup = networkSetup(n.Guest)
	}
	vm := VMConfig{
		Name:        "slurm-microvm-" + cfg.ID,
		Accel:       d.o.Accel,
		CPUs:        cfg.CPUs,
		MemoryMiB:   cfg.MemoryMiB,
		Kernel:      fs.ProcFDPath(kernelFD),
		Initrd:      fs.ProcFDPath(initrdFD),
		Cmdline:     cmdline,
		RootDisk:    FDSetPath(diskSet),
		ConsoleLog:  FDSetPath(consoleSet),
		FDSets:      []FDSet{{FD: diskFD, Set: diskSet}, {FD: consoleFD, Set: consoleSet}},
		AgentFD:     3,
		Seccomp:     d.o.Seccomp,
		PCI:         pciMachine,
		MachineArgs: machineArgs,
		Net:         netdev,
		MemoryNodes: cfg.MemoryNodes,
	}
	args, err := Args(vm)
	if err != nil {
		return fail(err)
	}
	// Host shares: QEMU's 9p server, on the directories the launcher
	// opened as the job's user, inherited as the next fds.
	var mounts []*api.Mount
	var gpuDriver *api.GPUDriver
	for i, sh := range shares {
		fd := 3 + len(extra)
		dev := fs.NinePDeviceMMIO
		if pciMachine {
			dev = fs.NinePDevicePCI
		}
		tag := fmt.Sprintf("smv%d", i)
		share := fs.NineP{ID: tag, Tag: tag, Path: fs.ProcFDPath(fd), ReadOnly: sh.ReadOnly, SecurityModel: fs.SecurityNone, Device: dev}
		sargs, err := share.Args()
		if err != nil {
			return fail(err)
		}
		args = append(args, sargs...)
		extra = append(extra, sh.Dir)
		if i == len(cfg.Shares) {
			gpuDriver = gpuDriverSetup(tag, cfg.GPUDriver)
			continue
		}
		mounts = append(mounts, &api.Mount{Tag: tag, Destination: []byte(sh.Destination), ReadOnly: sh.ReadOnly})
	}
	logf, err := state.OpenFile(filepath.Join(cfg.StateDir, vmmLog), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fail(fmt.Errorf("create VMM log: %w", err))
	}
	defer logf.Close()
	_ = os.Remove(filepath.Join(cfg.StateDir, control.VMMExitFile))
	restore, err := giveDevices(deviceFiles, id)
	if err != nil {
		return fail(err)
	}
	cmd := exec.Command(d.o.Binary, args...)
	if d.o.Trampoline != "" {
		bin, err := exec.LookPath(d.o.Binary)
		if err != nil {
			restore()
			return fail(fmt.Errorf("start VMM %s: %w", d.o.Binary, err))
		}
		cmd = exec.Command(d.o.Trampoline, append([]string{TrampolineArg, bin}, args...)...)
	}
	cmd.ExtraFiles = extra
	cmd.Stdout, cmd.Stderr = logf, logf
	// The VMM must not outlive its supervisor. Go sets the parent-death
	// signal after the credentials (a credential change clears it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: id.cred}
	var netns *os.File
	if cfg.Network != nil {
		netns = cfg.Network.NetNS
	}
	log.Info("starting VMM", "binary", d.o.Binary, "identity", id.String(), "own_netns", netns != nil, "args", strings.Join(args, " "))
	// The OOM kills of the memory cgroup the VMM starts in (the
	// supervisor's, the step's): more at its end means the kernel killed it.
	oomBase, oomErr := cgroup.OOMKills(os.Getpid(), cgroup.Roots{})
	t0 := time.Now()
	if err := startIn(cmd, netns); err != nil {
		restore()
		return fail(fmt.Errorf("start VMM %s as %s: %w", d.o.Binary, id, err))
	}
	guestEnd.Close()
	con.w.Close() // QEMU holds the console's write end now; EOF comes with it
	if err := taskOOMScore(cmd.Process.Pid); err != nil {
		log.Warn("VMM keeps slurmstepd's oom_score_adj", "err", err)
	}
	vmmUID := uint32(os.Geteuid())
	if id.cred != nil {
		vmmUID = id.cred.Uid
	}
	s := &sandbox{d: d, cfg: cfg, log: log, cmd: cmd, done: make(chan struct{}), mounts: mounts, gpuDriver: gpuDriver, network: netSetup, vmmUID: vmmUID,
		oomBase: oomBase, oomKnown: oomErr == nil,
		ep: control.Endpoint{StateDir: cfg.StateDir, UID: cfg.UID, GID: cfg.GID, OnFirstClient: cfg.OnFirstExec}}
	go func() {
		err := cmd.Wait()
		restore()
		<-con.done // the console log is complete once the VMM is gone
		s.waitErr = err
		s.recordExit(err)
		close(s.done)
	}()
	if err := state.WriteProc(filepath.Join(cfg.StateDir, state.VMMPidFile), cmd.Process.Pid); err != nil {
		log.Warn("record VMM pid", "err", err)
	}
	// Pinned while the guest boots, done by agent ready (pin.go).
	pinned := make(chan struct{})
	go func() { defer close(pinned); s.pin(ctx) }()
	defer func() { <-pinned }()
	// The first stream waits for the whole boot: its open bound is past the
	// boot timeout, so waitReady's own timeout (with its clear error) ends
	// a slow boot first.
	s.sess, err = transport.NewHostSession(hostEnd, max(transport.DefaultOpenTimeout, s.d.o.BootTimeout+30*time.Second))
	if err != nil {
		s.kill()
		return nil, err
	}
	marks, err := s.waitReady(ctx)
	if err != nil {
		s.kill()
		return nil, fmt.Errorf("boot sandbox %s: %w", cfg.ID, err)
	}
	tl := NewBootTimeline(time.Since(t0), marks)
	log.Info("agent ready", "ms", time.Since(t0).Milliseconds())
	log.Info("boot timeline", tl.LogAttrs()...)
	return s, nil
}

// WholePages rounds a guest of mib MiB down to whole huge pages of page
// MiB (0: no huge pages, mib as it is): the guest gets at most what the
// step has. Errors: less than one page.
func WholePages(mib, page uint64) (uint64, error) {
	if page == 0 {
		return mib, nil
	}
	if mib < page {
		return 0, fmt.Errorf("the guest's %d MiB is less than one %d MiB huge page (qemu.hugepages): give the step more memory (--mem)", mib, page)
	}
	return mib - mib%page, nil
}

// BootTimeline splits a boot, from the VMM's spawn to the answer of the
// guest's Setup, into the parts that add up to it: VMM is the host's share
// (QEMU's start, the kernel's load and its first steps before the guest
// clock runs, the answer's way back), the rest is read off the guest's
// CLOCK_BOOTTIME marks (api.SetupResponse). Durations in ms when logged.
type BootTimeline struct {
	Total, VMM, Kernel, Modules, AgentInit, SetupWait, Setup time.Duration
}

// NewBootTimeline lays the guest's marks beside total, the host's time
// from the VMM's spawn to Setup's answer. Marks out of order (a guest
// clock that jumped) or past total (a guest that lies) are clamped so the
// parts are never negative and still add up to total.
func NewBootTimeline(total time.Duration, m *api.SetupResponse) BootTimeline {
	// The marks are the guest's word: any uint64. Past the total they mean
	// nothing on the host's clock (and could overflow a Duration).
	us := func(v uint64) time.Duration {
		if v > uint64(total/time.Microsecond) {
			return total
		}
		return time.Duration(v) * time.Microsecond
	}
	marks := []time.Duration{us(m.GetAgentStartUs()), us(m.GetModulesDoneUs()), us(m.GetServingUs()), us(m.GetSetupStartUs()), us(m.GetSetupDoneUs())}
	for i := 1; i < len(marks); i++ {
		marks[i] = max(marks[i], marks[i-1])
	}
	end := min(marks[4], total)
	for i := range marks {
		marks[i] = min(marks[i], end)
	}
	return BootTimeline{
		Total: total, VMM: total - end, Kernel: marks[0],
		Modules: marks[1] - marks[0], AgentInit: marks[2] - marks[1],
		SetupWait: marks[3] - marks[2], Setup: marks[4] - marks[3],
	}
}

// LogAttrs is the timeline as the supervisor logs it ("boot timeline",
// one key per part, whole ms; stable keys, parsed by make bench).
func (t BootTimeline) LogAttrs() []any {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return []any{"total_ms", ms(t.Total), "vmm_ms", ms(t.VMM), "kernel_ms", ms(t.Kernel), "modules_ms", ms(t.Modules),
		"agent_init_ms", ms(t.AgentInit), "setup_wait_ms", ms(t.SetupWait), "setup_ms", ms(t.Setup)}
}

// waitReady sets the guest up as soon as its agent serves, failing when the
// VMM exits or the boot timeout passes first. It returns the guest's boot
// marks.
func (s *sandbox) waitReady(ctx context.Context) (*api.SetupResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, s.d.o.BootTimeout)
	defer cancel()
	type result struct {
		c     *agent.Client
		marks *api.SetupResponse
		err   error
	}
	ch := make(chan result, 1)
	go func() {
		conn, err := s.sess.Dial(ctx)
		if err != nil {
			ch <- result{nil, nil, err}
			return
		}
		c := agent.NewClient(conn)
		// The stream's SYN and the Setup call wait in the channel until
		// the agent opens its port: one call covers the whole boot and
		// the guest's set-up, with no extra round trip.
		marks, err := c.Setup(ctx, &api.SetupRequest{
			Uid: s.cfg.UID, Gid: s.cfg.GID, Groups: s.cfg.Groups,
			RootDevice: "/dev/vda", RootFstype: "erofs",
			OverlayMib: s.cfg.RootFS.OverlayMiB, Hostname: s.cfg.Hostname,
			ImageEnv: api.Bytes(s.cfg.ImageEnv), ImageWorkdir: []byte(s.cfg.ImageWorkdir),
			Mounts: s.mounts, GpuDriver: s.gpuDriver, Network: s.network,
		})
		ch <- result{c, marks, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-s.done:
		return nil, fmt.Errorf("VMM exited during boot (%v): %s", s.waitErr, s.tail())
	case <-ctx.Done():
		return nil, fmt.Errorf("agent did not answer within %s (accel %s); guest console: %s", s.d.o.BootTimeout, s.d.o.Accel, s.consoleTail())
	}
	if r.c != nil {
		r.c.Close()
	}
	if r.err != nil {
		return nil, fmt.Errorf("set up guest: %w; %s", r.err, s.tail())
	}
	return r.marks, nil
}

// tail returns the end of the VMM's log and console, for errors.
func (s *sandbox) tail() string {
	msg := strings.TrimSpace(lastLines(tailFile(filepath.Join(s.cfg.StateDir, vmmLog)), 5))
	if msg == "" {
		return "guest console: " + s.consoleTail()
	}
	return "qemu: " + msg
}

func (s *sandbox) consoleTail() string {
	t := strings.TrimSpace(lastLines(tailFile(filepath.Join(s.cfg.StateDir, state.ConsoleLog)), 8))
	if t == "" {
		return "(empty)"
	}
	return t
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (s *sandbox) Pid() int { return s.cmd.Process.Pid }

// Ping calls the agent's Ping on a stream of its own, so that exec
// clients' streams (blocked in Wait or ReadOutput) do not delay it. A
// stopped or frozen guest answers nothing: Ping then returns when ctx
// ends.
func (s *sandbox) Ping(ctx context.Context) error {
	select {
	case <-s.done:
		return fmt.Errorf("ping the guest agent: %w", driver.ErrSandboxExited)
	default:
	}
	conn, err := s.sess.Dial(ctx)
	if err != nil {
		return fmt.Errorf("ping the guest agent: %w", err)
	}
	c := agent.NewClient(conn)
	defer c.Close()
	type result struct{ err error }
	ch := make(chan result, 1)
	go func() {
		_, err := c.Ping(ctx, &api.PingRequest{})
		ch <- result{err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("ping the guest agent: %w", r.err)
		}
		return nil
	case <-s.done:
		return fmt.Errorf("ping the guest agent: %w", driver.ErrSandboxExited)
	}
}

func (s *sandbox) Done() <-chan struct{} { return s.done }

// kill ends the VMM (its end is then recorded as a stop, not a failure)
// and waits for it.
func (s *sandbox) kill() {
	s.stopping.Store(true)
	_ = s.cmd.Process.Kill()
	<-s.done
	if s.sess != nil {
		// QEMU is gone, so the channel is at EOF and the session's
		// reader ends: Close does not wait.
		s.sess.Close()
	}
}

// Stop asks the agent to end every process and sync, then kills the VMM:
// once the guest has synced nothing in it is worth a poweroff (the overlay
// is discarded), and the ACPI path costs tens of ms under TCG. Without an
// answer within StopGrace the VMM is killed all the same.
func (s *sandbox) Stop(ctx context.Context) error {
	s.stopOnce.Do(func() {
		select {
		case <-s.done:
			return
		default:
		}
		sctx, cancel := context.WithTimeout(ctx, s.d.o.StopGrace)
		defer cancel()
		if conn, err := s.sess.Dial(sctx); err == nil {
			c := agent.NewClient(conn)
			if _, err := c.Shutdown(sctx, &api.Empty{}); err != nil {
				s.log.Warn("guest did not shut down cleanly; killing VMM", "err", err, "grace", s.d.o.StopGrace)
			} else {
				s.log.Info("guest processes ended and synced")
			}
			c.Close()
		}
		s.kill()
	})
	return nil
}

// Listen creates the control socket (control.Endpoint).
func (s *sandbox) Listen() error { return s.ep.Listen() }

// Serve relays exec clients from the control socket (see Listen) to agent
// streams until ctx ends or the VM exits.
func (s *sandbox) Serve(ctx context.Context) error {
	return s.ep.Serve(ctx, s.done, func(l net.Listener) error {
		for {
			c, err := l.Accept()
			if err != nil {
				return fmt.Errorf("accept exec client: %w", err)
			}
			go s.relay(ctx, c.(*net.UnixConn))
		}
	})
}

// relay checks the peer's uid and copies bytes between it and a new stream.
func (s *sandbox) relay(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	uid, err := control.PeerUID(c)
	if err != nil || (uid != s.cfg.UID && uid != 0) {
		s.log.Warn("refused exec client", "uid", uid, "err", err)
		return
	}
	st, err := s.sess.Dial(ctx)
	if err != nil {
		s.log.Warn("open agent stream", "err", err)
		return
	}
	defer st.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(st, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, st); _ = c.CloseWrite(); done <- struct{}{} }()
	<-done
}

// gpuDriverSetup is the agent's description of the driver set shared as tag.
func gpuDriverSetup(tag string, g *driver.GPUDriver) *api.GPUDriver {
	out := &api.GPUDriver{
		Tag: tag, FirmwareDir: g.FirmwareDir,
		LibDir: g.LibDir, BinDir: g.BinDir, GuestLibDir: g.GuestLibDir, GuestBinDir: g.GuestBinDir,
	}
	for _, m := range g.Modules {
		out.Modules = append(out.Modules, &api.KernelModule{Name: m.Name, File: m.File, Params: m.Params})
	}
	for _, n := range g.Devices {
		out.Devices = append(out.Devices, &api.DeviceNode{Path: n.Path, MajorName: n.MajorName, FallbackMajor: n.FallbackMajor, Minor: n.Minor, Mode: n.Mode})
	}
	return out
}
