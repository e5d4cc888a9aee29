// Package kata is the Kata Containers runtime driver (runtime = "kata" in
// microvm.toml): the step's sandbox is a Kata sandbox — Kata's guest
// kernel and agent, its hypervisor configuration (configuration.toml),
// its VFIO cold-plug and virtio-fs — reached through the containerd shim
// task API, with the same user-facing behaviour as the QEMU driver.
//
// One sandbox container per step: its init is the guest agent binary in
// pause mode (slurm-microvm-agent pause: reaps, exits on SIGTERM), run as
// the job's user; each task is a process exec'd into it. The supervisor
// serves the step's control socket (launcher/driver/control) itself and
// carries each agent API call out through the task API (broker.go): the
// tenant never reaches the shim, whose API could create a container with
// any spec.
//
// Two paths to the task API (launcher/kata/taskapi): "shim" starts
// containerd-shim-kata-v2 for the step (launcher/kata/shim; the default)
// and "containerd" goes through the node's containerd daemon
// (launcher/kata/ctrd).
//
// Design decisions:
//
//   - Daemonless by default. HPC nodes run no container daemon; a shim
//     started by the step's supervisor lands in the step's cgroup with its
//     VMM (with Kata's sandbox_cgroup_only = true), so scancel and --mem
//     reach all of it, and nothing outlives the step. Through containerd
//     the shim is containerd's child, in containerd's cgroup, outside
//     Slurm's accounting: offered for sites that already run containerd.
//   - The root filesystem is the cached erofs image mounted read-only with
//     a tmpfs overlay (overlay_mib) as the bundle's rootfs. On the shim
//     path every mount is made in a mount namespace private to the shim
//     (unshare on a locked OS thread that then starts the shim, which
//     inherits it): the mounts vanish with the shim, whatever kills it.
//     Through containerd the shim is not our child, so the mounts are made
//     on the host under the step's state and Cleanup unmounts them.
//   - linux.cgroupsPath is a child of the step's cgroup (kata-<step>), not
//     the step's own: the runtime removes the cgroup it was given when the
//     sandbox is deleted, and given the step's, slurmstepd found its step
//     cgroup gone (measured with runc; TestE2EKata checks slurmd's log).
//     Slurm signals only the step cgroup's own processes, so the sandbox
//     ends by the supervisor's Stop and stop/gc's Cleanup.
//   - Shares are attached on the host side as open_tree(2) clones of the
//     directories the launcher opened with the user's credentials
//     (read-only ones read-only, all nosuid and nodev), and the spec's
//     mounts name those: read-only holds on the host whatever the guest or
//     virtiofsd does.
//   - PMI is refused: the task API carries stdio only, so PMI-2's PMI_FD
//     and PMIx's server cannot reach the guest. A relay through the
//     sandbox's network namespace would work for PMIx (TCP) but not for
//     PMI-2's inherited fd, and it would open the host's PMIx server to
//     the guest's network; an MPI step under Kata fails at its first rank
//     with the reason, and runs with runtime = "qemu".
//   - Signals reach the exec'd process (the task API's Kill of one exec),
//     not its process group as the QEMU driver's agent does; a signal
//     that came while the sandbox booted is delivered right after the
//     process started (the agent's wait for a handler needs the guest).
//   - An exit status above 128 is read as 128+signal (containerd's
//     convention for a process killed by a signal); a process that exits
//     with such a code itself is reported as killed by that signal.
//   - The step network ([network]) is not carried yet: Kata attaches to
//     the interfaces of the sandbox's network namespace (veth), while the
//     step network gives the VMM a tap; a step with one is refused with
//     the reason. Without it the sandbox has loopback only.
//   - Placement (SandboxConfig.HostCPUs, MemoryNodes) is not applied:
//     the shim's VMM threads are Kata's, found through its own QMP, and
//     Kata pins them itself where its configuration.toml says
//     enable_vcpus_pinning = true (within the sandbox's cgroup, whose
//     cpuset is the step's). Capabilities.Placement says so; the step
//     runs unpinned inside the step's cpuset.
package kata
