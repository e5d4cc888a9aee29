package kata

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/guest"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver/control"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata/ctrd"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata/katacfg"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata/oci"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata/shim"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata/taskapi"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

type sandbox struct {
	d        *Driver
	cfg      driver.SandboxConfig
	log      *slog.Logger
	svc      taskapi.Service
	sh       *shim.Shim // mode shim
	pid      int        // the shim's pid (mode shim), else the init's
	b        *broker
	ep       control.Endpoint
	done     chan struct{}
	once     sync.Once
	stopping atomic.Bool
}

// Start creates the step's Kata sandbox: it checks Kata's configuration
// for this step (katacfg.Check), mounts the root filesystem and the
// shares, writes the bundle, starts the shim (or reaches containerd),
// creates the sandbox container and starts its init. On any failure what
// was started is removed before it returns (Cleanup).
func (d *Driver) Start(ctx context.Context, cfg driver.SandboxConfig) (driver.Sandbox, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if d.cfg == nil {
		if err := d.Prepare(ctx, log); err != nil {
			return nil, err
		}
	}
	if cfg.Network != nil {
		return nil, errors.New("the kata runtime does not carry the step network ([network] of microvm.toml) yet: Kata attaches to the sandbox network namespace's interfaces; set network mode off for kata nodes, or runtime = \"qemu\"")
	}
	if cfg.GPUDriver != nil {
		log.Warn("kata: the node's GPU driver set is not injected; the GPUs get the driver of Kata's guest image (hypervisor's image/initrd)")
	}
	functions := 0
	for _, dev := range cfg.Devices {
		functions += len(dev.Functions)
	}
	if probs := katacfg.Check(d.cfg, katacfg.Need{CPUs: cfg.CPUs, MemoryMiB: cfg.MemoryMiB, GPUs: functions, FreeMiB: katacfg.StatfsFreeMiB}); len(probs) > 0 {
		errs := make([]error, len(probs))
		for i, p := range probs {
			errs[i] = p
		}
		return nil, fmt.Errorf("kata configuration does not fit this step: %w", errors.Join(errs...))
	}
	ann, err := katacfg.Annotations(d.cfg, cfg.CPUs, cfg.MemoryMiB)
	if err != nil {
		return nil, err
	}
	devs, err := vfioDevices(cfg.Devices)
	if err != nil {
		return nil, err
	}
	cgroupsPath, err := stepCgroup(cfg.ID)
	if err != nil {
		return nil, err
	}
	kdir := filepath.Join(cfg.StateDir, kataDir)
	id := sandboxID(cfg.ID)
	bundle := filepath.Join(kdir, id)
	for _, p := range []string{kdir, bundle, filepath.Join(kdir, "io")} {
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("kata bundle: %w", err)
		}
	}
	s := &sandbox{d: d, cfg: cfg, log: log, done: make(chan struct{}),
		ep: control.Endpoint{StateDir: cfg.StateDir, UID: cfg.UID, GID: cfg.GID, OnFirstClient: cfg.OnFirstExec}}
	fail := func(err error) (driver.Sandbox, error) {
		s.closeDone()
		if cerr := d.Cleanup(context.WithoutCancel(ctx), cfg.StateDir); cerr != nil {
			log.Error("clean up the failed kata sandbox", "err", cerr)
		}
		return nil, err
	}
	t := &tree{dir: filepath.Join(kdir, "mnt")}
	rootfs := filepath.Join(bundle, "rootfs")
	trees, err := cloneShares(cfg.Shares)
	if err != nil {
		return fail(err)
	}
	defer closeShares(trees)
	var ociSpec *specs.Spec
	spec := func(mounts []oci.Mount) error {
		sp, err := oci.Spec(oci.Input{
			RootfsPath: rootfs, Hostname: cfg.Hostname,
			UID: cfg.UID, GID: cfg.GID, AdditionalGids: cfg.Groups,
			Init:   oci.Process{Args: []string{guestInitDir + "/init", "pause"}, Env: []string{"PATH=" + guest.DefaultPath}, Cwd: "/"},
			Mounts: mounts, CgroupsPath: cgroupsPath, Devices: devs, Annotations: ann,
		})
		if err != nil {
			return err
		}
		ociSpec = sp
		b, err := json.MarshalIndent(sp, "", "\t")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
			return fmt.Errorf("write the bundle's config.json: %w", err)
		}
		return nil
	}
	switch d.o.Mode {
	case "shim":
		if err := shim.BecomeSubreaper(); err != nil {
			return fail(err)
		}
		var env []string
		if d.cfg.Path != "" {
			env = append(env, "KATA_CONF_FILE="+d.cfg.Path)
		}
		err := inPrivateMountNS(func() error {
			mounts, err := mountTree(t, rootfs, cfg.RootFS, trees, d.o.Init)
			if err != nil {
				return err
			}
			if err := spec(mounts); err != nil {
				return err
			}
			// Started from this thread: the shim inherits its namespace.
			sh, err := shim.Start(ctx, shim.Options{Binary: d.o.Shim, ID: id, Namespace: d.o.Namespace, Bundle: bundle, StateDir: kdir, Env: env, Logger: log})
			if err != nil {
				return err
			}
			rec := sh.Record()
			s.sh, s.svc, s.pid = sh, sh.Service(), sh.Pid()
			return writeRecord(cfg.StateDir, record{Mode: "shim", Shim: &rec})
		})
		if err != nil {
			return fail(err)
		}
	case "containerd":
		c := &ctrdRecord{Address: d.o.ContainerdAddress, Namespace: d.o.Namespace, Runtime: d.o.RuntimeHandler, ID: id}
		mounts, err := mountTree(t, rootfs, cfg.RootFS, trees, d.o.Init)
		// Recorded before anything else can fail: Cleanup unmounts them.
		if werr := writeRecord(cfg.StateDir, record{Mode: "containerd", Containerd: c, Mounts: t.mounts}); werr != nil && err == nil {
			err = werr
		}
		if err != nil {
			return fail(err)
		}
		if err := spec(mounts); err != nil {
			return fail(err)
		}
		// Kata's shim takes its configuration as the runtime options
		// (runtimeoptions.v1); another handler's shim refuses that type
		// (the runc shim: "type with url runtimeoptions.v1.Options: not
		// found"), and gets what containerd's own configuration says.
		var confPath string
		if strings.Contains(c.Runtime, "kata") {
			confPath = d.cfg.Path
		}
		svc, err := ctrd.Connect(ctx, ctrd.Options{Address: c.Address, Namespace: c.Namespace, Runtime: c.Runtime, ID: c.ID, ConfigPath: confPath, Logger: log})
		if err != nil {
			return fail(err)
		}
		s.svc = svc
	default:
		return fail(fmt.Errorf("kata.mode %q must be one of shim, containerd", d.o.Mode))
	}
	_ = os.Remove(filepath.Join(cfg.StateDir, control.VMMExitFile))
	t0 := time.Now()
	initPid, err := s.svc.Create(ctx, taskapi.CreateOptions{Bundle: bundle, Spec: ociSpec})
	if err != nil {
		return fail(fmt.Errorf("boot sandbox %s: create the kata sandbox: %w", cfg.ID, err))
	}
	if _, err := s.svc.Start(ctx, ""); err != nil {
		return fail(fmt.Errorf("boot sandbox %s: start the sandbox's init: %w", cfg.ID, err))
	}
	if s.pid == 0 {
		s.pid = int(initPid)
	}
	// The sandbox's host process, as the QEMU driver records its VMM: the
	// shim (whose children are the VMM and its helpers).
	if err := state.WriteProc(filepath.Join(cfg.StateDir, state.VMMPidFile), s.pid); err != nil {
		log.Warn("record the shim's pid", "err", err)
	}
	log.Info("kata sandbox ready", "mode", d.o.Mode, "id", id, "shim_pid", s.pid, "ms", time.Since(t0).Milliseconds())
	s.b = &broker{
		svc: s.svc, ioDir: filepath.Join(kdir, "io"), uid: cfg.UID, gid: cfg.GID, groups: cfg.Groups,
		imageEnv: cfg.ImageEnv, workdir: cfg.ImageWorkdir, log: log,
	}
	go s.watch()
	return s, nil
}

// watch closes done when the sandbox's init ends or its shim exits, and
// records how (control.VMMExitFile) for the step's tasks.
func (s *sandbox) watch() {
	initDone := make(chan error, 1)
	go func() {
		_, err := s.svc.Wait(context.Background(), "")
		initDone <- err
	}()
	var shimExited <-chan struct{}
	if s.sh != nil {
		shimExited = s.sh.Exited()
	}
	reason := ""
	select {
	case err := <-initDone:
		reason = "the kata sandbox's init ended"
		if err != nil {
			reason = "the kata sandbox is gone: " + err.Error()
		}
	case <-shimExited:
		reason = "the kata shim exited"
	}
	if s.stopping.Load() {
		reason = control.ExitReason(nil, true)
	} else {
		s.log.Error("sandbox ended", "reason", reason)
	}
	if err := state.WriteFileAtomic(filepath.Join(s.cfg.StateDir, control.VMMExitFile), []byte(reason+"\n"), 0o644); err != nil {
		s.log.Warn("record the sandbox's end", "err", err)
	}
	s.closeDone()
}

func (s *sandbox) closeDone() { s.once.Do(func() { close(s.done) }) }

func (s *sandbox) Done() <-chan struct{} { return s.done }
func (s *sandbox) Pid() int              { return s.pid }

func (s *sandbox) Ping(ctx context.Context) error {
	select {
	case <-s.done:
		return errors.New("the kata sandbox is gone")
	default:
	}
	return s.svc.Ping(ctx)
}

// Listen creates the control socket (control.Endpoint).
func (s *sandbox) Listen() error { return s.ep.Listen() }

// Serve serves the agent API (broker) on the control socket until ctx
// ends or the sandbox stops.
func (s *sandbox) Serve(ctx context.Context) error {
	srv, err := ttrpc.NewServer(ttrpc.WithServerHandshaker(s.b.handshaker()))
	if err != nil {
		return err
	}
	api.RegisterAgentService(srv, s.b)
	return s.ep.Serve(ctx, s.done, func(l net.Listener) error {
		go func() {
			select {
			case <-ctx.Done():
			case <-s.done:
			}
			_ = srv.Close()
		}()
		err := srv.Serve(ctx, l)
		if errors.Is(err, ttrpc.ErrServerClosed) {
			return nil
		}
		return err
	})
}

// Stop ends the sandbox: SIGTERM to every process of the container, SIGKILL
// after the stop grace, then the container, the shim and the bundle go
// (Cleanup). Idempotent; returns nil.
func (s *sandbox) Stop(ctx context.Context) error {
	if !s.stopping.CompareAndSwap(false, true) {
		<-s.done
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	kctx, cancel := context.WithTimeout(ctx, s.d.o.StopGrace+5*time.Second)
	defer cancel()
	_ = s.svc.Kill(kctx, "", syscall.SIGTERM, true)
	select {
	case <-s.done:
	case <-time.After(s.d.o.StopGrace):
		_ = s.svc.Kill(kctx, "", syscall.SIGKILL, true)
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
		}
	}
	if _, err := s.svc.Delete(kctx, ""); err != nil {
		s.log.Debug("delete the kata sandbox", "err", err)
	}
	if err := s.svc.Shutdown(kctx); err != nil {
		s.log.Debug("shut the shim down", "err", err)
	}
	if s.sh != nil {
		select {
		case <-s.sh.Exited():
		case <-time.After(5 * time.Second):
		}
	}
	if s.b != nil {
		s.b.closeAll()
	}
	if err := s.d.Cleanup(ctx, s.cfg.StateDir); err != nil {
		s.log.Error("clean up the kata sandbox", "err", err)
	}
	s.closeDone()
	return nil
}

// vfioDevices are the spec's devices of the step's PCI devices: each VFIO
// group file and /dev/vfio/vfio, with the host's numbers.
func vfioDevices(devs []driver.PCIDevice) ([]oci.Device, error) {
	if len(devs) == 0 {
		return nil, nil
	}
	var out []oci.Device
	seen := map[string]bool{}
	for _, p := range append([]string{"/dev/vfio/vfio"}, groupFiles(devs)...) {
		if seen[p] {
			continue
		}
		seen[p] = true
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return nil, fmt.Errorf("VFIO device %s: %w", p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			return nil, fmt.Errorf("VFIO device %s is not a character device", p)
		}
		out = append(out, oci.Device{Path: p, Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev))})
	}
	return out, nil
}

func groupFiles(devs []driver.PCIDevice) []string {
	var out []string
	for _, d := range devs {
		if d.VFIOGroupFile != "" {
			out = append(out, d.VFIOGroupFile)
		}
	}
	return out
}

// stepCgroup is linux.cgroupsPath for the sandbox: a child of this
// process's cgroup (the supervisor entered the step's: Slurm's
// .../job_J/step_S), named after the sandbox, so that its memory counts
// against the step's limit. Not the step's cgroup itself: the runtime
// removes the cgroup it was given when the sandbox is deleted, and with
// the step's own (measured with runc, which Kata's sandbox_cgroup_only
// does alike) slurmstepd found its step cgroup gone ("_cgroup_procs_check:
// failed on path .../step_0/cgroup.procs"). Slurm's proctrack/cgroup
// signals only the step cgroup's own processes (a process in a child
// cgroup survived scancel: launcher/kata/oci doc.go), so the sandbox ends
// by the supervisor's Stop and by stop/gc's Cleanup, which the step's
// end runs in every case. On cgroup v1 the memory controller's path
// counts (--mem).
func stepCgroup(id string) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("read this process's cgroup: %w", err)
	}
	var unified, memory string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			unified = f[2]
		case strings.Contains(","+f[1]+",", ",memory,"):
			memory = f[2]
		}
	}
	base := memory
	if base == "" {
		base = unified
	}
	if base == "" {
		return "", errors.New("this process is in no memory or unified cgroup: cannot place the sandbox under the step's")
	}
	return filepath.Join(base, "kata-"+identifier(id)), nil
}
