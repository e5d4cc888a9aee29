// Package taskapi is the seam between the Kata driver (launcher/kata) and
// the two ways it reaches a Kata sandbox: a containerd-shim-kata-v2 the
// driver starts itself and speaks the shim's task API to over ttrpc
// (launcher/kata/shim, the default on HPC nodes: no node daemon), or a
// containerd daemon the site already runs, through the containerd client
// with the runtime handler io.containerd.kata.v2 (launcher/kata/ctrd).
//
// A Service drives one sandbox container: its init process (Create, Start
// with ExecID "") and the processes exec'd into it (Exec, Start with the
// exec's id). The names, arguments and semantics are containerd's task API
// (containerd api/runtime/task/v2 and v3, shim.proto); only what the
// driver needs is here.
package taskapi

import (
	"context"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// IO names the FIFOs of one process's stdio. The caller creates them
// (mkfifo, mode 0600) and holds its own ends; the shim opens them by name.
// "" for a stream the process does not get. With Terminal, Stdout carries
// the terminal's output and Stderr is "".
type IO struct {
	Stdin, Stdout, Stderr string
	Terminal              bool
}

// Exit is how a process ended, as the task API reports it: Status is the
// exit code, or 128+signal for a process killed by a signal (containerd
// convention).
type Exit struct {
	Status uint32
	At     time.Time
}

// CreateOptions create the sandbox container.
type CreateOptions struct {
	// Bundle is the OCI bundle directory: Bundle/config.json (written by
	// the caller from Spec) and Spec.Root.Path (absolute).
	Bundle string
	// Spec is the container's OCI runtime spec; Spec.Process is the init
	// process, Spec.Annotations carry Kata's per-sandbox settings.
	Spec *specs.Spec
	// IO is the init process's stdio.
	IO IO
}

// Service is one sandbox container reached through the task API. Every
// method returns an error wrapped with what was being done; an error from
// the other side keeps its text (containerd errdefs), so a caller can say
// what the shim said.
type Service interface {
	// Create creates the container (and boots the sandbox's VM, for Kata)
	// with its init process created but not started. It returns the init
	// process's pid (in the sandbox's view; 0 when unknown).
	Create(ctx context.Context, o CreateOptions) (pid uint32, err error)
	// Start starts the init process (execID "") or an exec'd one.
	Start(ctx context.Context, execID string) (pid uint32, err error)
	// Exec creates (does not start) process p, named execID, in the
	// container, with its stdio.
	Exec(ctx context.Context, execID string, p *specs.Process, io IO) error
	// Wait blocks until the process ends or ctx is done.
	Wait(ctx context.Context, execID string) (Exit, error)
	// Kill sends sig to the process; all (init only) to every process
	// of the container.
	Kill(ctx context.Context, execID string, sig syscall.Signal, all bool) error
	// ResizePty sets the process's terminal size (columns, rows).
	ResizePty(ctx context.Context, execID string, width, height uint32) error
	// CloseIO closes the process's stdin (EOF in the process).
	CloseIO(ctx context.Context, execID string) error
	// Delete removes an ended process (execID "": the container itself,
	// after its init ended) and returns how it ended.
	Delete(ctx context.Context, execID string) (Exit, error)
	// Ping checks that the other side answers (the task API's Connect for
	// a shim, the daemon's Version for containerd); the supervisor's
	// watchdog calls it.
	Ping(ctx context.Context) error
	// Shutdown ends the connection; for a shim the caller started, the
	// shim exits (the task API's Shutdown) once the container is deleted.
	Shutdown(ctx context.Context) error
}
