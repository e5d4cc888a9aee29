// Package qemu is the built-in runtime driver: one QEMU `-M microvm` per
// sandbox, booting the guest assets (launcher/assets) with the image as a
// read-only virtio-blk erofs disk, and the agent API on a virtio-serial port
// whose host end is one half of a socketpair inherited by QEMU.
//
// Design decisions:
//
//   - Control channel: virtio-serial with a socketpair host end, not a unix
//     socket path. No path exists that another process could connect to
//     first, and there is no listen/connect race at boot.
//   - No vsock, even where /dev/vhost-vsock exists: AF_VSOCK has no access
//     control on the host side (any host user may connect to any guest
//     CID, and the guest sees them all as CID 2), so an agent listening on
//     vsock would let another user run processes in this job's VM. The
//     serial channel is reachable only through the supervisor.
//   - The supervisor (the process that called Start) is the only holder of
//     the channel. Exec clients connect to a unix socket in the state
//     directory, owned by the job's uid with mode 0600 and checked with
//     SO_PEERCRED, and each connection is relayed byte for byte onto its own
//     yamux stream: ttrpc runs end to end between the task and the agent.
//   - Accelerator: KVM only when kvm_intel or kvm_amd is loaded and /dev/kvm
//     opens; any other /dev/kvm (e.g. a nested PVM device) cannot run a stock
//     kernel, so TCG is used.
//   - QEMU drops to the job's user with -runas after opening its files and
//     runs under its seccomp sandbox with obsolete, spawn and
//     resourcecontrol denied (elevateprivileges stays allowed: -runas needs
//     it, measured on QEMU 7.2).
//   - Every option value that comes from a path is escaped for QEMU's option
//     parser (`,` doubled); nothing user-typed reaches the kernel command line.
package qemu
