// Package driver is the seam between the step lifecycle (package launcher)
// and a runtime that runs a sandbox: the built-in QEMU driver
// (launcher/qemu) or, on production sites, Kata Containers through
// containerd's shim API.
//
// The lifecycle splits over processes, as Slurm does: the supervisor started
// by the SPANK plugin boots the sandbox (Driver.Start) and keeps it alive;
// each task is a separate process, running as the job's user, that attaches
// to the running sandbox (Driver.Attach) with nothing but its state
// directory, runs one process in it and relays stdio, signals and status.
// The lifecycle's stop may come from yet another process (task_exit,
// spank_exit, the epilog): it works from the state directory alone, by the
// recorded pids; Sandbox.Stop is the supervisor's own, graceful path.
//
// Design decisions:
//
//   - The interface is process-level (exec, signal, wait), not VM-level
//     (serial ports, sockets), because a Kata driver reaches the guest
//     only through the shim's task API (Exec, Kill, Wait, ResizePty,
//     CloseIO).
//   - One factory (launcher/runtime) turns the configured name into a
//     Driver, as Kata's NewHypervisor does; the lifecycle and the exec path
//     never name a concrete driver (launcher/runtime TestLayering). The
//     alternative, a switch on the name in the lifecycle, let QEMU's
//     accelerator, assets and device syntax leak into it.
//   - Devices travel as typed values (PCIDevice) that each driver renders
//     in its own syntax (QEMU's -device lines live only in launcher/qemu),
//     the root filesystem as RootFS (a disk for QEMU, a bundle rootfs for
//     Kata), shares as opened directories whose ReadOnly the host side
//     enforces whatever the guest does (QEMU's 9p server refuses writes;
//     the Kata driver bind-mounts them read-only).
//   - A driver cleans up from its own records in the state directory
//     (Cleanup), so stop and gc work after a supervisor crash without
//     knowing what a driver left (a VMM pid, a shim, its bundle).
//   - What a driver cannot carry is a Capability, refused before anything
//     is prepared with the driver's reason (VFIO under TCG; PMI forwarding
//     under Kata, whose task API carries stdio only).
package driver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"syscall"
)

// ErrCommandNotFound is returned by Client.Exec when argv[0] names no
// executable in the image; the task exits 127, as a shell's would.
var ErrCommandNotFound = errors.New("command not found in the image")

// ErrSandboxExited is matched (errors.Is) by the errors a Client or Process
// returns once the sandbox's VMM is gone; their text says how it ended
// ("the microVM's VMM exited: killed by signal 9 (SIGKILL)"), not the
// closed connection that showed it.
var ErrSandboxExited = errors.New("the sandbox's VMM exited")

// SandboxConfig is what a driver needs to boot one step's sandbox.
type SandboxConfig struct {
	// ID names the sandbox, "<job>.<step>.<restart>".
	ID string
	// StateDir is the step's runtime directory (launcher/state).
	StateDir string
	// CPUs is the number of vCPUs; MemoryMiB the guest memory.
	CPUs      int
	MemoryMiB uint64
	// HostCPUs are the host CPUs of the step's allocation, ascending
	// (launcher/placement): vCPU i runs on HostCPUs[i mod len], the VMM's
	// other threads on all of them. nil: the allocation is not the step's
	// own, and nothing is pinned. Performance, not a boundary: the VMM
	// stays in the step's cpuset cgroup, which the kernel enforces.
	HostCPUs []int
	// MemoryNodes are the host NUMA nodes the guest memory is bound to
	// (the one node of all HostCPUs); nil: the kernel's default policy.
	MemoryNodes []int
	// RootFS is the image's root filesystem.
	RootFS RootFS
	// ImageEnv and ImageWorkdir come from the image config.
	ImageEnv     []string
	ImageWorkdir string
	// The job's identity: every process in the guest runs with it, and
	// so does the VMM on the host (numeric ids; User is for logs).
	User   string
	UID    uint32
	GID    uint32
	Groups []uint32
	// Hostname of the guest (the node's name).
	Hostname string
	// Shares are host directories for the guest, parents first, each
	// opened with the job user's credentials: the opened object is what
	// the driver shares (never re-resolved by name).
	Shares []Share
	// Devices are host PCI devices passed to the guest through VFIO
	// (GPUs, a NIC's VF), in guest order; none: no passthrough. Each
	// driver renders them in its own terms (QEMU: a q35 machine with one
	// root port per device; Kata: VFIO devices cold-plugged on root ports).
	Devices []PCIDevice
	// PCIHole64 is the 64-bit PCI MMIO window the devices' BARs need, in
	// bytes (launcher/gpu Plan.Hole64); 0: the VMM's default.
	PCIHole64 uint64
	// GPUDriver, for a step with GPUs, is the node's GPU driver set: the
	// guest loads it before any process starts. nil: none.
	GPUDriver *GPUDriver
	// Network attaches the guest to its step network; nil: loopback only.
	Network *Network
	Debug   bool
	Logger  *slog.Logger
	// OnFirstExec, when set, is called once, when the control socket
	// accepts its first exec client (the supervisor times first_exec).
	OnFirstExec func()
}

// RootFS is the step's root filesystem: the image converted to a
// read-only erofs file (launcher/image), under a writable layer of
// OverlayMiB that ends with the sandbox. Each driver presents it its own
// way: the QEMU driver as a read-only virtio-blk disk the guest mounts
// under a tmpfs overlay; the Kata driver mounts the erofs read-only with an
// overlay on the host, in the shim's private mount namespace, as the
// bundle's rootfs.
type RootFS struct {
	// Image is the erofs file (read-only; shared by the user's steps).
	Image string
	// OverlayMiB sizes the writable layer over the image.
	OverlayMiB uint64
}

// PCIDevice is one host PCI device, with all the functions passed along
// with it, given to the guest through VFIO on a slot of its own.
type PCIDevice struct {
	// ID names the device in the sandbox ("gpu0", "nic0"); unique.
	ID string
	// Functions are the host addresses (domain:bus:slot.function), the
	// device's function 0 first; all of them go to the guest together
	// (a GPU and its audio function).
	Functions []string
	// IOBAR: a function has an I/O BAR (its port must reserve I/O space).
	IOBAR bool
	// VFIOGroupFile is the device's /dev/vfio/<group>, opened by the VMM.
	VFIOGroupFile string
}

// Capabilities say what a driver's sandboxes carry; the lifecycle refuses
// a step that needs more, before it prepares anything, with the reason.
type Capabilities struct {
	// Passthrough is "" when the driver can pass Devices to the guest on
	// this node, else why not ("VFIO passthrough needs KVM, and QEMU runs
	// under tcg on this node").
	Passthrough string
	// Forwards is "" when a process can get ProcessSpec.FDs and
	// ProcessSpec.Listeners (PMI-2's PMI_FD, PMIx's server), else why not.
	Forwards string
	// Placement is "" when the driver pins vCPUs to
	// SandboxConfig.HostCPUs and binds guest memory to MemoryNodes, else
	// why not (the lifecycle logs it; the step still runs).
	Placement string
	// MaxShares is the most host shares (Shares plus the GPU driver set)
	// a sandbox with devices devices takes; 0: no limit.
	MaxShares func(devices int) int
}

// GPUDriver is a GPU driver set for the guest (launcher/gpu/driverset):
// one read-only directory, and what the guest does with it. Paths in the
// set are relative to Dir; guest paths are absolute in the guest's root.
type GPUDriver struct {
	// Dir is the set's directory, opened by the launcher; it counts as
	// one host share.
	Dir *os.File
	// Modules are loaded in this order, before the first process.
	Modules []KernelModule
	// FirmwareDir is searched by the guest's firmware loader while the
	// modules load; "" for none.
	FirmwareDir string
	// Devices are made in the guest's /dev after the modules loaded.
	Devices []DeviceNode
	// LibDir and BinDir appear read-only at GuestLibDir and GuestBinDir,
	// first in every process's LD_LIBRARY_PATH and PATH.
	LibDir, BinDir           string
	GuestLibDir, GuestBinDir string
}

// KernelModule is a module file of a GPU driver set.
type KernelModule struct {
	Name, File string
	// Params as insmod(8) takes them.
	Params string
}

// DeviceNode is a character device the guest makes from the major its
// driver registered: /proc/devices' entry MajorName, or FallbackMajor when
// there is none (0: then it is an error).
type DeviceNode struct {
	// Path under /dev, e.g. "nvidia0".
	Path                 string
	MajorName            string
	FallbackMajor, Minor uint32
	// Mode holds the permission bits (0666 when 0).
	Mode uint32
}

// Sandbox is a running sandbox, held by the supervisor.
type Sandbox interface {
	// Listen creates the state directory's control endpoint, usable only
	// by the job's uid, before it returns: mark the sandbox ready after.
	Listen() error
	// Serve accepts exec clients on that endpoint until ctx ends or the
	// sandbox stops.
	Serve(ctx context.Context) error
	// Done is closed when the sandbox (its VMM) has exited.
	Done() <-chan struct{}
	// Stop ends the sandbox from the process that started it: it asks the
	// guest to end its processes and sync (bounded by the driver's stop
	// grace and ctx), then kills the VMM whether or not the guest answered,
	// and returns once the VMM is gone (Done is closed). Idempotent; it
	// returns nil (a guest that does not answer is killed, not an
	// error). A stop from another process
	// (task_exit, spank_exit, the epilog) is the lifecycle's Stop, which
	// works from the state directory's recorded pids instead.
	Stop(ctx context.Context) error
	// Pid is the VMM's pid on the host.
	Pid() int
	// Ping asks the guest agent for a sign of life and returns once it
	// answered (nil), or with an error once ctx ends first or the sandbox
	// is gone. The supervisor's watchdog calls it while the step runs
	// (timeouts.agent_ping, timeouts.agent_hang): a VMM that is alive but
	// whose guest no longer answers is hung.
	Ping(ctx context.Context) error
}

// Diagnoser is a Sandbox that can describe its VMM for the supervisor's
// log when the guest stopped answering (AgentHungError): whether the
// vCPUs still ran, and the guest's last console lines. The supervisor
// asks it, when implemented, before it kills the VMM; the text goes to
// the admin's log only, never to the step's error.
type Diagnoser interface {
	Diagnose() string
}

// Share is one host directory mounted in the guest.
type Share struct {
	Dir         *os.File
	Destination string
	ReadOnly    bool
}

// ProcessSpec is one process to run in a sandbox.
type ProcessSpec struct {
	Argv     []string
	Env      []string
	Cwd      string
	Terminal bool
	Rows     uint16
	Cols     uint16
	// FDs are host byte streams the process inherits as the given fd
	// numbers (> 2): PMI-2's PMI_FD.
	FDs []FDForward
	// Listeners are loopback listeners in the guest whose connections are
	// relayed to host connections: PMIx's server URI.
	Listeners []ListenerForward
	// PendingSignals reached the task before the process existed (while
	// the sandbox booted), in arrival order: the process gets each once it
	// catches or ignores it, or after a grace (launcher/agent/guest).
	PendingSignals []syscall.Signal
	// StdinClosed: the task has no input (no stdin, or /dev/null), so the
	// process starts with its stdin at end of file, as if Relay had
	// closed it, without the call that would (not with Terminal).
	StdinClosed bool
}

// FDForward relays Host (closed when done) to fd GuestFD of the process.
type FDForward struct {
	GuestFD int
	Host    io.ReadWriteCloser
}

// ListenerForward listens on Listen ("127.0.0.1:0") in the guest, replaces
// Replace in the process's environment values by the actual address, and
// relays each accepted connection to a connection from Dial.
type ListenerForward struct {
	Listen  string
	Replace string
	Dial    func(ctx context.Context) (net.Conn, error)
}

// ExitStatus is how a process ended: Signal != 0 when killed by a signal.
type ExitStatus struct {
	Code   int
	Signal syscall.Signal
	// OOMKilled: the guest kernel's out-of-memory killer killed the
	// process or one of its children while it ran (the guest's memory,
	// sized from the step's, was exhausted).
	OOMKilled bool
}

// Process is a process running in a sandbox.
type Process interface {
	// Relay copies stdin in and stdout/stderr out until output ends.
	Relay(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer)
	Signal(ctx context.Context, sig syscall.Signal) error
	Resize(ctx context.Context, rows, cols uint16) error
	// Wait returns the exit status once the output is relayed.
	Wait(ctx context.Context) (ExitStatus, error)
	// Path is what argv[0] resolved to inside the sandbox.
	Path() string
}

// Client runs processes in an attached sandbox.
type Client interface {
	Exec(ctx context.Context, spec ProcessSpec) (Process, error)
	Close() error
}

// Driver starts sandboxes (the supervisor) and cleans up after them (any
// process). Task processes do not use it: they attach to the step's
// control socket, the same for every driver (launcher/driver/control).
type Driver interface {
	Name() string
	// Capabilities is what this driver's sandboxes carry on this node.
	Capabilities() Capabilities
	// Prepare finds or builds what every sandbox of the driver needs
	// before Start (the QEMU driver: its guest kernel and initramfs; the
	// Kata driver: its shim and Kata's configuration), and fails with
	// the reason when it cannot.
	Prepare(ctx context.Context, log *slog.Logger) error
	// Start boots the sandbox and returns once it runs processes.
	Start(ctx context.Context, cfg SandboxConfig) (Sandbox, error)
	// Cleanup ends what a sandbox of stateDir left on the host, from the
	// driver's own records there alone (a VMM by its recorded pid, device
	// files given to the job's uid, a shim, its bundle): stop and gc call
	// it from another process after the supervisor was asked to stop, or
	// after it was killed. Idempotent; nothing recorded is not an error.
	Cleanup(ctx context.Context, stateDir string) error
}

// Network attaches the guest to its step network (launcher/network).
type Network struct {
	// Tap is an open tap device (IFF_TAP|IFF_NO_PI) the VMM reads and
	// writes; nil in user mode.
	Tap *os.File
	// User selects the VMM's user-mode NAT (QEMU -netdev user) instead.
	User bool
	// NetNS, when set, is the network namespace the VMM is started in.
	NetNS *os.File
	// Guest is what the agent configures before any process starts.
	Guest GuestNetwork
}

// GuestNetwork is the guest's one interface, found by its MAC, and what
// goes with it. The guest needs no DHCP.
type GuestNetwork struct {
	MAC [6]byte
	// Addr is the interface's address and on-link prefix.
	Addr netip.Prefix
	MTU  int
	// Gateway, when valid, is the default route's next hop.
	Gateway netip.Addr
	// Routes are more routes through Gateway-like next hops.
	Routes []Route
	// Neighbors are permanent ARP entries (the step's other guests).
	Neighbors []Neighbor
	// Hosts are the lines of the guest's /etc/hosts besides localhost.
	Hosts []HostEntry
	// DNS servers for /etc/resolv.conf; none: the image's file is kept.
	DNS []netip.Addr
}

// Route is one route of the guest.
type Route struct {
	Dst netip.Prefix
	Via netip.Addr
}

// Neighbor is one permanent ARP entry of the guest.
type Neighbor struct {
	Addr netip.Addr
	MAC  [6]byte
}

// HostEntry is one /etc/hosts line.
type HostEntry struct {
	Addr  netip.Addr
	Names []string
}
