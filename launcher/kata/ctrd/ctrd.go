package ctrd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/slurm-microvm/slurm-microvm/launcher/kata/taskapi"
)

// Options say which daemon, runtime and container a Service drives.
type Options struct {
	// Address is containerd's gRPC socket, an absolute path ([kata]
	// containerd_address; /run/containerd/containerd.sock by default).
	Address string
	// Namespace is the containerd namespace of the container ([kata]
	// namespace).
	Namespace string
	// Runtime is the runtime handler containerd starts the container's
	// shim with: io.containerd.kata.v2 for Kata ([kata]
	// runtime_handler); io.containerd.runc.v2 in the tests. containerd
	// resolves it to the binary containerd-shim-<name>-<version> on its
	// own PATH (containerd-shim-kata-v2), and serves the shim's events
	// itself (its ttrpc address).
	Runtime string
	// ID is the container's id, unique in Namespace (containerd's
	// identifier rule: letters, digits, '.', '_', '-', at most 76).
	ID string
	// ConfigPath is the Kata configuration.toml the sandbox runs with
	// ([kata] configuration), handed to the shim as the runtime options
	// runtimeoptions.v1.Options{ConfigPath}, the way containerd's CRI
	// plugin names a runtime's config file (Kata's shim reads it there,
	// after the io.katacontainers.config_path annotation and before its
	// own KATA_CONF_FILE). "" hands no options: the shim's default
	// (for Kata, its search path). Only for a runtime that reads these
	// options: the runc shim rejects them.
	ConfigPath string
	// Logger receives one line per container and task operation; nil
	// discards them.
	Logger *slog.Logger
}

// Service is one container of a containerd daemon, reached through the
// containerd client (taskapi.Service). It is safe for concurrent use.
type Service struct {
	o      Options
	log    *slog.Logger
	client *containerd.Client

	mu        sync.Mutex
	container containerd.Container
	task      containerd.Task
	execs     map[string]containerd.Process
}

var _ taskapi.Service = (*Service)(nil)

// identifierRE is containerd's rule for ids and namespaces
// (pkg/identifiers): 1-76 characters, letters and digits separated by
// single '.', '_' or '-'.
var identifierRE = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$`)

func (o Options) check() error {
	switch {
	case !filepath.IsAbs(o.Address):
		return fmt.Errorf("containerd address %q: must be an absolute socket path (kata.containerd_address)", o.Address)
	case len(o.Namespace) > 76 || !identifierRE.MatchString(o.Namespace):
		return fmt.Errorf("containerd namespace %q: must be 1-76 letters, digits, '.', '_' or '-', starting and ending with a letter or digit (kata.namespace)", o.Namespace)
	case len(o.ID) > 76 || !identifierRE.MatchString(o.ID):
		return fmt.Errorf("container id %q: must be 1-76 letters, digits, '.', '_' or '-', starting and ending with a letter or digit (containerd identifiers)", o.ID)
	case o.Runtime == "":
		return errors.New("containerd runtime handler is empty: set kata.runtime_handler (io.containerd.kata.v2 for Kata)")
	case o.ConfigPath != "" && !filepath.IsAbs(o.ConfigPath):
		return fmt.Errorf("kata configuration %q: must be an absolute path (kata.configuration)", o.ConfigPath)
	}
	return nil
}

// Connect dials the containerd daemon at o.Address and checks that it
// answers (its Version), within ctx. It creates nothing: Create does.
// Errors: o invalid (naming the setting), or the daemon not answering
// (containerd's text kept).
func Connect(ctx context.Context, o Options) (*Service, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	// containerd's dialer retries a missing socket until the deadline:
	// say at once that there is none.
	if _, err := os.Stat(o.Address); err != nil {
		return nil, fmt.Errorf("connect to containerd: %w (is containerd running? kata.containerd_address)", err)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// WithDefaultRuntime: the client otherwise reads a namespace label
	// to find the runtime for each container and each task delete.
	c, err := containerd.New(o.Address,
		containerd.WithDefaultNamespace(o.Namespace),
		containerd.WithDefaultRuntime(o.Runtime))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", o.Address, err)
	}
	s := &Service{
		o:      o,
		log:    log.With("containerd", o.Address, "namespace", o.Namespace, "container", o.ID),
		client: c,
		execs:  map[string]containerd.Process{},
	}
	if err := s.Ping(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("%w (is containerd running there? kata.containerd_address)", err)
	}
	return s, nil
}

// containerOpts make the container record: the spec, the runtime
// handler and its options (runtimeoptions.v1.Options{ConfigPath} when
// o.ConfigPath is set), no image, no snapshot.
func (o Options) containerOpts(spec *specs.Spec) []containerd.NewContainerOpts {
	var ro any
	if o.ConfigPath != "" {
		ro = &runtimeoptions.Options{ConfigPath: o.ConfigPath}
	}
	return []containerd.NewContainerOpts{
		containerd.WithSpec(spec),
		containerd.WithRuntime(o.Runtime, ro),
	}
}

// Create creates the container from o.Spec with the runtime handler, and
// its task with the init process's stdio on o.IO's FIFOs. The rootfs is
// o.Spec.Root.Path, an absolute, already mounted directory: no image, no
// snapshotter. containerd writes its own bundle (under its state
// directory, from the spec): o.Bundle is not read. On an error after the
// container was created, the container is deleted again. Errors: a spec
// without process or absolute root, or containerd's (text kept).
func (s *Service) Create(ctx context.Context, o taskapi.CreateOptions) (uint32, error) {
	switch {
	case o.Spec == nil:
		return 0, fmt.Errorf("create container %s: no OCI spec", s.o.ID)
	case o.Spec.Process == nil:
		return 0, fmt.Errorf("create container %s: the OCI spec has no process (the init process)", s.o.ID)
	case o.Spec.Root == nil || !filepath.IsAbs(o.Spec.Root.Path):
		return 0, fmt.Errorf("create container %s: the OCI spec's root.path must be an absolute, mounted rootfs (no snapshotter is used)", s.o.ID)
	}
	if err := checkIO(o.IO); err != nil {
		return 0, fmt.Errorf("create container %s: init's %w", s.o.ID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.container != nil {
		return 0, fmt.Errorf("create container %s: already created by this service", s.o.ID)
	}
	c, err := s.client.NewContainer(ctx, s.o.ID, s.o.containerOpts(o.Spec)...)
	if err != nil {
		return 0, fmt.Errorf("create container %s (runtime %s) in containerd: %w", s.o.ID, s.o.Runtime, err)
	}
	t, err := c.NewTask(ctx, fifoCreator(o.IO))
	if err != nil {
		if derr := c.Delete(context.WithoutCancel(ctx)); derr != nil {
			s.log.Warn("delete the container after its task failed", "err", derr)
		}
		return 0, fmt.Errorf("create task of container %s (runtime %s): %w", s.o.ID, s.o.Runtime, err)
	}
	s.container, s.task = c, t
	s.log.Info("created", "runtime", s.o.Runtime, "pid", t.Pid())
	return t.Pid(), nil
}

// loadTask is the container's task: the one Create made, or the one
// containerd has (a Service that did not create it).
func (s *Service) loadTask(ctx context.Context) (containerd.Task, error) {
	if s.task != nil {
		return s.task, nil
	}
	if s.container == nil {
		c, err := s.client.LoadContainer(ctx, s.o.ID)
		if err != nil {
			return nil, fmt.Errorf("load container %s: %w", s.o.ID, err)
		}
		s.container = c
	}
	t, err := s.container.Task(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("load task of container %s: %w", s.o.ID, err)
	}
	s.task = t
	return t, nil
}

// process is the init process (execID "", the task) or the exec'd one.
func (s *Service) process(ctx context.Context, execID string) (containerd.Process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.loadTask(ctx)
	if err != nil {
		return nil, err
	}
	if execID == "" {
		return t, nil
	}
	if p, ok := s.execs[execID]; ok {
		return p, nil
	}
	p, err := t.LoadProcess(ctx, execID, nil)
	if err != nil {
		return nil, fmt.Errorf("load exec %s of container %s: %w", execID, s.o.ID, err)
	}
	s.execs[execID] = p
	return p, nil
}

// name says which process, for errors.
func (s *Service) name(execID string) string {
	if execID == "" {
		return "init of container " + s.o.ID
	}
	return "exec " + execID + " of container " + s.o.ID
}

// Start starts the init process (execID "") or an exec'd one and returns
// its pid (the host's view, for runc; the sandbox's, for Kata).
func (s *Service) Start(ctx context.Context, execID string) (uint32, error) {
	p, err := s.process(ctx, execID)
	if err != nil {
		return 0, err
	}
	if err := p.Start(ctx); err != nil {
		return 0, fmt.Errorf("start %s: %w", s.name(execID), err)
	}
	s.log.Debug("started", "exec", execID, "pid", p.Pid())
	return p.Pid(), nil
}

// Exec creates (does not start) process p as execID in the container,
// with its stdio on io's FIFOs. Errors: execID taken, the task gone, or
// containerd's.
func (s *Service) Exec(ctx context.Context, execID string, p *specs.Process, io taskapi.IO) error {
	if execID == "" {
		return fmt.Errorf("exec in container %s: empty exec id", s.o.ID)
	}
	if err := checkIO(io); err != nil {
		return fmt.Errorf("exec %s in container %s: %w", execID, s.o.ID, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.loadTask(ctx)
	if err != nil {
		return err
	}
	proc, err := t.Exec(ctx, execID, p, fifoCreator(io))
	if err != nil {
		return fmt.Errorf("exec %s in container %s: %w", execID, s.o.ID, err)
	}
	s.execs[execID] = proc
	return nil
}

// Wait blocks until the process ends (its exit status: the code, or
// 128+signal) or ctx is done (ctx's error).
func (s *Service) Wait(ctx context.Context, execID string) (taskapi.Exit, error) {
	p, err := s.process(ctx, execID)
	if err != nil {
		return taskapi.Exit{}, err
	}
	ch, err := p.Wait(ctx)
	if err != nil {
		return taskapi.Exit{}, fmt.Errorf("wait for %s: %w", s.name(execID), err)
	}
	select {
	case st := <-ch:
		code, at, err := st.Result()
		if err != nil {
			if ctx.Err() != nil {
				return taskapi.Exit{}, fmt.Errorf("wait for %s: %w", s.name(execID), ctx.Err())
			}
			return taskapi.Exit{}, fmt.Errorf("wait for %s: %w", s.name(execID), errgrpc.ToNative(err))
		}
		return taskapi.Exit{Status: code, At: at}, nil
	case <-ctx.Done():
		return taskapi.Exit{}, fmt.Errorf("wait for %s: %w", s.name(execID), ctx.Err())
	}
}

// Kill sends sig to the process; all (init only) to every process of the
// container.
func (s *Service) Kill(ctx context.Context, execID string, sig syscall.Signal, all bool) error {
	p, err := s.process(ctx, execID)
	if err != nil {
		return err
	}
	var opts []containerd.KillOpts
	if all {
		opts = append(opts, containerd.WithKillAll)
	}
	if err := p.Kill(ctx, sig, opts...); err != nil {
		return fmt.Errorf("send %v to %s: %w", sig, s.name(execID), err)
	}
	return nil
}

// ResizePty sets the process's terminal size (columns, rows).
func (s *Service) ResizePty(ctx context.Context, execID string, width, height uint32) error {
	p, err := s.process(ctx, execID)
	if err != nil {
		return err
	}
	if err := p.Resize(ctx, width, height); err != nil {
		return fmt.Errorf("resize the terminal of %s to %dx%d: %w", s.name(execID), width, height, err)
	}
	return nil
}

// CloseIO closes the process's stdin: the shim closes its own end of the
// stdin FIFO, so the process reads EOF once the caller closed its end
// too.
func (s *Service) CloseIO(ctx context.Context, execID string) error {
	p, err := s.process(ctx, execID)
	if err != nil {
		return err
	}
	if err := p.CloseIO(ctx, containerd.WithStdinCloser); err != nil {
		return fmt.Errorf("close stdin of %s: %w", s.name(execID), err)
	}
	return nil
}

// Delete removes an ended process and returns how it ended; execID ""
// deletes the task (its init must have ended) and then the container.
// Errors: the process still running (errdefs.ErrFailedPrecondition), or
// containerd's.
func (s *Service) Delete(ctx context.Context, execID string) (taskapi.Exit, error) {
	p, err := s.process(ctx, execID)
	if err != nil {
		return taskapi.Exit{}, err
	}
	st, err := p.Delete(ctx)
	if err != nil {
		return taskapi.Exit{}, fmt.Errorf("delete %s: %w", s.name(execID), err)
	}
	code, at, _ := st.Result()
	exit := taskapi.Exit{Status: code, At: at}
	s.mu.Lock()
	defer s.mu.Unlock()
	if execID != "" {
		delete(s.execs, execID)
		return exit, nil
	}
	s.task = nil
	clear(s.execs)
	if err := s.container.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		return exit, fmt.Errorf("delete container %s: %w", s.o.ID, err)
	}
	s.container = nil
	s.log.Info("deleted", "status", code)
	return exit, nil
}

// Ping asks the daemon its version: an error when it does not answer.
func (s *Service) Ping(ctx context.Context) error {
	if _, err := s.client.Version(ctx); err != nil {
		return fmt.Errorf("ask containerd at %s its version: %w", s.o.Address, errgrpc.ToNative(err))
	}
	return nil
}

// Shutdown closes the connection to the daemon. It deletes nothing: the
// container lives in the daemon until Delete("") or Cleanup (the shim,
// and for Kata the VM, stay with it).
func (s *Service) Shutdown(ctx context.Context) error {
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("close the connection to containerd at %s: %w", s.o.Address, err)
	}
	return nil
}
