package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/fault"
	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// Environment variables the plugin sets for the exec entry.
const (
	// EnvArgv0 holds the task's original argv[0].
	EnvArgv0 = "SLURM_MICROVM_ARGV0"
	// EnvStep names the step, "<job>.<step>.<restart>"; its state lives
	// under the configured runtime_dir.
	EnvStep = "SLURM_MICROVM_STEP"
	// EnvConfig is the plugin's config= path.
	EnvConfig = "SLURM_MICROVM_CONFIG"
	// EnvState names a state directory directly (manual use of `exec`).
	EnvState = "SLURM_MICROVM_STATE"
)

// supervisorStartTimeout bounds the wait for the detached supervisor to
// record itself; past it the start is taken as failed.
const supervisorStartTimeout = 30 * time.Second

// WaitReady waits until the sandbox of stateDir is ready, has failed, or
// timeout passes. Its error is the reason, fit for the task's stderr.
func WaitReady(ctx context.Context, stateDir string, timeout time.Duration) error {
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		if _, err := os.Stat(stateDir + "/" + state.ReadyFile); err == nil {
			return nil
		}
		if b, err := os.ReadFile(stateDir + "/" + state.ErrorFile); err == nil {
			return errors.New(strings.TrimSpace(string(b)))
		}
		if _, err := os.Stat(stateDir); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("no sandbox state at %s: the step's sandbox was never prepared or is already stopped", stateDir)
		}
		sup, err := state.ReadProc(stateDir + "/" + state.SupervisorFile)
		switch {
		case err == nil && !sup.Alive():
			// It may have written its error just before exiting.
			if b, err := os.ReadFile(stateDir + "/" + state.ErrorFile); err == nil {
				return errors.New(strings.TrimSpace(string(b)))
			}
			return errors.New("the sandbox supervisor exited before the microVM was ready (its log is launcher.log in the step's state)")
		case err != nil && time.Since(start) > supervisorStartTimeout:
			return fmt.Errorf("the sandbox supervisor did not start within %s", supervisorStartTimeout)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the microVM was not ready within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Stdio is a task's standard streams.
type Stdio struct {
	In       *os.File
	Out, Err io.Writer
}

// forwarded are the signals a task receives from Slurm (scancel, time
// limit, srun's Ctrl-C) that are passed on to the process in the guest.
var forwarded = []os.Signal{unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGALRM, unix.SIGTERM, unix.SIGCONT}

// catchSignals starts catching the forwarded signals (and SIGWINCH) into a
// channel; stop it with signal.Stop. Until then none of them is lost: Go
// would ignore SIGUSR1 and end the process on SIGTERM.
func catchSignals() chan os.Signal {
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, append(forwarded, unix.SIGWINCH)...)
	return sigs
}

// pendingSignals drains what sigs caught so far: the forwarded signals, in
// order (SIGWINCH is dropped: the size is read at the start).
func pendingSignals(sigs chan os.Signal) []syscall.Signal {
	var out []syscall.Signal
	for {
		select {
		case s := <-sigs:
			if sig := s.(syscall.Signal); sig != unix.SIGWINCH {
				out = append(out, sig)
			}
		default:
			return out
		}
	}
}

// ExecIn runs argv in the attached sandbox client c, relaying stdio, window
// size and signals, and returns the process's exit status. A terminal on
// stdin gives the process a terminal in the guest.
func ExecIn(ctx context.Context, c driver.Client, spec driver.ProcessSpec, io Stdio) (driver.ExitStatus, error) {
	sigs := catchSignals()
	defer signal.Stop(sigs)
	return execIn(ctx, c, spec, io, sigs)
}

// execIn is ExecIn with the signals caught by sigs since before the
// sandbox was ready: those that came before the process existed reach it
// as pending signals (driver.ProcessSpec.PendingSignals), the later ones
// as they come.
func execIn(ctx context.Context, c driver.Client, spec driver.ProcessSpec, io Stdio, sigs chan os.Signal) (driver.ExitStatus, error) {
	tty := io.In != nil && isTerminal(io.In)
	spec.Terminal = tty
	if tty {
		if ws, err := unix.IoctlGetWinsize(int(io.In.Fd()), unix.TIOCGWINSZ); err == nil {
			spec.Rows, spec.Cols = ws.Row, ws.Col
		}
	}
	spec.PendingSignals = append(spec.PendingSignals, pendingSignals(sigs)...)
	// No input (none, or /dev/null, which reads as end of file for
	// ever): the process starts with its stdin at end of file, sparing
	// the call that would close it after the start.
	noInput := io.In == nil || isDevNull(io.In)
	spec.StdinClosed = noInput && !tty
	p, err := c.Exec(ctx, spec)
	if err != nil {
		return driver.ExitStatus{}, err
	}
	if tty {
		restore, err := makeRaw(io.In)
		if err == nil {
			defer restore()
		}
	}
	if noInput {
		p.Relay(ctx, nil, io.Out, io.Err)
	} else {
		p.Relay(ctx, io.In, io.Out, io.Err)
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				sig := s.(syscall.Signal)
				if sig == unix.SIGWINCH {
					if ws, err := unix.IoctlGetWinsize(int(io.In.Fd()), unix.TIOCGWINSZ); err == nil && tty {
						_ = p.Resize(ctx, ws.Row, ws.Col)
					}
					continue
				}
				_ = p.Signal(ctx, sig)
			case <-done:
				return
			}
		}
	}()
	st, err := p.Wait(ctx)
	close(done)
	return st, err
}

// attach connects to the running sandbox of stateDir through its control
// socket, the same for every runtime driver (launcher/driver/control).
func (l *Launcher) attach(ctx context.Context, stateDir string) (driver.Client, error) {
	return control.Attach(ctx, stateDir)
}

// Exec is the exec entry of one task: wait for the sandbox of stateDir, run
// argv in it with env, relay everything, and return the exit status.
func (l *Launcher) Exec(ctx context.Context, stateDir string, argv, env []string, io Stdio) (driver.ExitStatus, error) {
	if len(argv) == 0 {
		return driver.ExitStatus{}, errors.New("no command given")
	}
	// A signal that comes while the microVM boots (scancel -s USR1, an
	// early --signal) waits for the process instead of being lost.
	sigs := catchSignals()
	defer signal.Stop(sigs)
	if err := WaitReady(ctx, stateDir, l.Config.Timeouts.Start.Duration); err != nil {
		return driver.ExitStatus{}, err
	}
	env = TaskEnv(env)
	cwd := ""
	var id *state.StepID
	s, serr := ReadSpec(stateDir)
	if serr == nil {
		id = &s.ID
		if s.GPUs != "" {
			env = guestGPUEnv(env, s.GPUs)
		}
		cwd = s.Workdir // "" : the image's WORKDIR, else /
		var note string
		var err error
		if env, note, err = taskMPI(stateDir, s, env); err != nil {
			return driver.ExitStatus{}, err
		}
		if note != "" && os.Getenv("SLURM_LOCALID") == "0" && io.Err != nil {
			fmt.Fprintln(io.Err, note)
		}
	}
	spec, err := withPMI(driver.ProcessSpec{Argv: argv, Env: env, Cwd: cwd})
	if err != nil {
		return driver.ExitStatus{}, err
	}
	if id != nil && fault.On(id.Job, fault.LogEnv) {
		logEnv(*id, spec.Env, io.Err)
	}
	c, err := l.attach(ctx, stateDir)
	if err != nil {
		return driver.ExitStatus{}, err
	}
	defer c.Close()
	st, err := execIn(ctx, c, spec, io, sigs)
	if err != nil {
		return st, supervisorReason(stateDir, err)
	}
	if st.OOMKilled && io.Err != nil {
		cpus := 0
		if s != nil {
			cpus = GuestCPUs(s, os.Getpid()) // the supervisor's: same step cpuset
			if lim, err := cgroup.MemoryLimit(os.Getpid(), cgroup.Roots{}); err == nil {
				s.MemLimitMiB = lim.MiB() // and the same step memory limit
			}
		}
		fmt.Fprintln(io.Err, OOMMessage(s, cpus, l.Config.Resources))
	}
	return st, nil
}

// OOMMessage is the line a task prints on its stderr when the guest's
// out-of-memory killer killed its process (or one of its children): the
// reason, the guest's memory and the request it was sized from
// (GuestMemoryMiB). s nil (no spec): without the size.
func OOMMessage(s *Spec, cpus int, r config.Resources) string {
	const msg = "slurm-microvm: the task was killed by the guest's out-of-memory killer: the step's memory is exhausted"
	if s == nil {
		return msg
	}
	mib, err := GuestMemoryMiB(s, cpus, r)
	if err != nil {
		return msg
	}
	from := "resources.default_memory_mib, no --mem given"
	switch {
	case s.MemMiB > 0:
		from = "the step's memory allocation, --mem"
	case s.MemPerNodeMiB > 0:
		from = "--mem"
	case s.MemPerCPUMiB > 0:
		from = "--mem-per-cpu"
	case s.MemLimitMiB > 0:
		from = "the step's cgroup memory limit"
	}
	return fmt.Sprintf("%s (guest %d MiB, from %s, less the VMM's %d MiB); ask for more memory", msg, mib, from, r.VMMOverheadMiB)
}

// stepFailedError is a task's error when the supervisor stopped the
// sandbox because the step failed: the supervisor's reason (the step's
// error file), wrapping what the task saw.
type stepFailedError struct {
	reason string
	err    error
}

func (e *stepFailedError) Error() string { return e.reason }
func (e *stepFailedError) Unwrap() error { return e.err }

// supervisorReason returns err, seen by a task of the sandbox of stateDir,
// as the step's failure when its supervisor stopped the VMM after it wrote
// the step's error file (a hung guest: AgentHungError); other errors, and
// a stop of a step that did not fail, are returned as they are.
func supervisorReason(stateDir string, err error) error {
	var ve *control.VMMExitedError
	if !errors.As(err, &ve) || !ve.Stopped {
		return err
	}
	b, rerr := os.ReadFile(stateDir + "/" + state.ErrorFile)
	if rerr != nil {
		return err
	}
	msg := strings.TrimSpace(string(b))
	if msg == "" {
		return err
	}
	return &stepFailedError{reason: msg, err: err}
}

// guestGPUEnv renumbers CUDA_VISIBLE_DEVICES for the guest, where the
// step's GPUs are the only ones, in Slurm's order: 0..n-1 (UUIDs are kept).
func guestGPUEnv(env []string, stepGPUs string) []string {
	idx, err := gpu.ParseStepGPUs(stepGPUs)
	if err != nil || len(idx) == 0 {
		return env
	}
	host := ""
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "CUDA_VISIBLE_DEVICES="); ok {
			host = v
			continue
		}
		out = append(out, kv)
	}
	return append(out, "CUDA_VISIBLE_DEVICES="+gpu.GuestCUDAVisibleDevices(host, len(idx)))
}

// TaskEnv is the environment a task passes into the guest: the task's own
// minus the plugin's hand-off variables (PATH is replaced by the image's in
// the guest).
func TaskEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case EnvArgv0, EnvStep, EnvConfig, EnvState:
			continue
		}
		out = append(out, kv)
	}
	return out
}

// isDevNull reports whether f is the null device (character device 1:3,
// fixed by the kernel's devices.txt), which slurmstepd gives the tasks
// that get no input.
func isDevNull(f *os.File) bool {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == unix.Mkdev(1, 3)
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// makeRaw puts the terminal f in raw mode (the guest's pty does the line
// discipline) and returns the function restoring it.
func makeRaw(f *os.File) (func(), error) {
	fd := int(f.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, err
	}
	raw := *old
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN] = 1
	raw.Cc[unix.VTIME] = 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, err
	}
	return func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil
}

// ExitLike ends the calling process the way the guest process ended: with
// its exit code, or killed by the same signal (so Slurm records 0:S and srun
// prints "Segmentation fault" or "Terminated"). It returns only if that
// signal cannot end a process (default action ignore or stop); the caller
// then exits 128+S.
//
// The Go runtime keeps handlers for every signal (it turns SIGSEGV into a
// crash dump and swallows SIGUSR1), and signal.Reset does not give the
// kernel's default back. So the disposition is reset with a raw
// rt_sigaction, the signal unblocked in this thread and sent to this
// thread only.
func ExitLike(st driver.ExitStatus) {
	if st.Signal == 0 {
		os.Exit(st.Code)
	}
	sig := st.Signal
	// No core file of the relay for a workload that dumped core.
	_ = unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
	signal.Reset(sig)
	runtime.LockOSThread()
	var sa struct {
		handler  uintptr // SIG_DFL
		flags    uint64
		restorer uintptr
		mask     uint64
	}
	_, _, _ = unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&sa)), 0, 8, 0, 0)
	var set unix.Sigset_t
	set.Val[(int(sig)-1)/64] |= 1 << ((uint(sig) - 1) % 64)
	_ = unix.PthreadSigmask(unix.SIG_UNBLOCK, &set, nil)
	_ = unix.Tgkill(os.Getpid(), unix.Gettid(), sig)
	time.Sleep(200 * time.Millisecond)
	os.Exit(128 + int(sig))
}
