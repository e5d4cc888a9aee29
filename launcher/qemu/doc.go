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
//   - Identity: QEMU is executed with the job's numeric uid, gid and
//     supplementary groups (SysProcAttr.Credential, the ones Slurm gave the
//     step and the mount check opened the shares with), not dropped with
//     -runas: -runas takes the passwd entry's primary group and
//     initgroups(), which differ from a job's --gid or Slurm's groups, and
//     needs set*id under seccomp. Everything QEMU would open by name as
//     root is opened by the supervisor and inherited: kernel and initrd
//     as /proc/self/fd/N (QEMU's loader reopens them; they are
//     world-readable assets), root disk and console log as -add-fd fd sets
//     (/dev/fdset/N: QEMU dup()s them, so the image cache and the state
//     directory may be root-only). /dev/kvm: QEMU 7.2 opens it by name and
//     takes no descriptor, so under KVM, when the job's identity cannot
//     open it, QEMU also gets /dev/kvm's group (as libvirt runs QEMU in
//     the kvm group) — the one difference from the job's groups, logged
//     with the identity. VFIO group files (/dev/vfio/<group>, no descriptor
//     option in 7.2's vfio-pci) are given to the VMM's uid, 0600, for its
//     life and back to root at its end and at the GPU release. Not a
//     private mount namespace with a user-owned /dev/kvm node: a re-exec
//     helper for one device. The job's user can ptrace its own VMM (same
//     uid, dumpable after exec); the VMM holds only the step's own
//     resources (its guest, its shares, its GPUs, a KVM fd).
//   - Seccomp: -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,
//     resourcecontrol=deny. With -runas, elevateprivileges=deny killed QEMU
//     7.2 with SIGSYS; executed as the user it boots (TestVMMIdentity).
//   - Shares only under the job's identity: 9p security_model=none applies
//     the guest's chown, setuid bits and mknod with QEMU's credentials, so
//     a root QEMU (qemu.runas = false) would give a guest root root-owned
//     setuid files and device nodes on the host; Start refuses every share
//     then (ErrSharesNeedJobIdentity), and config refuses runas = false
//     while shares are possible. Measured (TestGuestRootInShare): as the
//     user, the guest root's chown and mknod get EPERM; chmod u+s leaves a
//     file setuid to the job's user, as the user could make one on the host.
//   - Share limit, measured with QEMU 7.2 (TestShareLimit): -M microvm has
//     24 virtio-mmio transports (the 25th device: "No 'virtio-bus' bus
//     found"), but with all 24 in use the guest (Debian 12's 6.1 kernel)
//     hangs mounting the last share; 23 work: 20 shares beside the root
//     disk, the control channel and the network device (MaxSharesMicrovm;
//     the network device's slot is kept whether or not the step has a
//     network, so the limit `validate` checks at submit holds for every
//     mode). q35 (GPU steps)
//     takes 30 devices on pcie.0 (QEMU: "PCI: no slot/function available"
//     past it; guest not booted here, no KVM): 27 less one root port per
//     GPU. Counted before QEMU starts (TooManySharesError) and at submit
//     (`validate`, the microvm limit). Not lifted: packing 9p devices as
//     PCI multifunction or behind a pcie-pci-bridge only helps q35, and
//     could not be booted here.
//   - The VMM's end is recorded by the supervisor in vmm.exit ("the
//     microVM's VMM exited: killed by signal 9 (SIGKILL)"); task clients
//     (Attach, Exec, Wait) whose connection breaks wait briefly for it and
//     return *VMMExitedError (errors.Is driver.ErrSandboxExited) instead of
//     "ttrpc: closed" (TestVMMKilled). Not a message on the channel: the
//     supervisor relays raw ttrpc bytes and cannot add one.
//   - The guest console goes to a pipe that the supervisor copies into the
//     state's console.log, root-owned 0644, up to Options.ConsoleMaxBytes
//     (4 MiB), then drained and counted (console.go, TestConsoleBounded).
//     Not a file QEMU writes directly: a guest root writes its serial port
//     without limit into the node's /run tmpfs, and a user-owned file
//     (as it was, for --microvm-debug) let the user write gigabytes that
//     root then read whole and copied into its log. Not RLIMIT_FSIZE on
//     QEMU: it would also bound the files the guest writes into shares.
//     Error messages read at most the last 64 KiB of a log (tailFile).
//   - Network (SandboxConfig.Network): one virtio-net device,
//     virtio-net-device on -M microvm, virtio-net-pci (romfile= empty: the
//     kernel boots directly, no option ROM) on the q35 machine of GPU
//     steps, with the MAC the launcher chose; the agent configures it
//     statically (launcher/agent/guest). With a tap: the launcher's open
//     tap is inherited and given as -netdev tap,fd=N, so QEMU, running as
//     the job's user under -sandbox, opens nothing and needs no
//     CAP_NET_ADMIN (TUNSETIFF was done by root; the fd's reads and writes
//     need no privilege), and spawns no ifup script (spawn=deny holds).
//     vhost-net only under KVM and when /dev/vhost-net exists: the
//     supervisor opens it and QEMU gets vhostfd=N (as libvirt does; the
//     node is 0660 root:kvm by Debian's udev rules, and the job's identity
//     has the kvm group only when /dev/kvm needed it); else vhost=off (this host has no /dev/vhost-net: the vhost
//     path is checked by TestArgs only). User mode: -netdev
//     user,ipv6=off,restrict=off with no hostfwd, smb or tftp: nothing
//     outside reaches the guest, and the guest reaches what the VMM's
//     network namespace reaches (10.0.2.2 is that namespace's loopback,
//     TestNetworkUser).
//   - The VMM is started in Network.NetNS when set: the goroutine that
//     calls cmd.Start locks its OS thread, setns(CLONE_NEWNET)s into the
//     namespace, forks (the child inherits the forking thread's
//     namespaces) and setns's back before unlocking. When the way back
//     fails the thread stays locked and dies with its goroutine, and the
//     VMM is killed and the start fails: its parent-death signal follows
//     the thread that forked it (TestStartInNetns). Alternatives:
//     ip netns exec or nsenter (a shell command and a helper binary per
//     start), a re-exec of the supervisor (a second process for one
//     syscall); SysProcAttr can create a namespace but not join one.
//   - The network device keeps a virtio slot whether or not the step has
//     a network (MaxSharesMicrovm 20), so the share limit checked at
//     submit holds in every network mode.
//   - Every option value that comes from a path is escaped for QEMU's option
//     parser (`,` doubled); nothing user-typed reaches the kernel command line.
//   - The VMM starts through a trampoline (the launcher binary run with
//     TrampolineArg) that blocks TERM, INT, HUP, QUIT and USR2 and execs
//     QEMU: Slurm signals every process of a step (scancel of the job, the
//     time limit, srun's Ctrl-C), and QEMU ends on TERM, INT and HUP, so
//     the guest died before the workload's trap could run. The signals are
//     the workload's: its task forwards them into the guest. A blocked mask
//     survives execve and QEMU unblocks none of them; an inherited SIG_IGN
//     would not do (QEMU installs handlers), and moving the VMM out of the
//     step's cgroups would take its memory off the step and out of Slurm's
//     reach. Go's os/exec resets a child's mask, hence the extra exec
//     (about 1 ms; TestTrampoline, and poc fault.scancel-job end to end).
//   - The boot is split by the guest's own marks (BootTimeline): the
//     agent's Setup answer carries its CLOCK_BOOTTIME at PID 1's start, after
//     the boot modules, when it serves, and around Setup; the host's time
//     from the spawn to that answer minus the last mark is the VMM's part
//     (QEMU's start, the kernel's load and its steps before its clock runs).
//     The parts add up to the boot by construction and are logged once per
//     step (msg="boot timeline"). The alternative, the kernel log's
//     timestamps on the console, needs a verbose console (quiet hides
//     them) and parsing text a kernel update may change.
//   - Guest memory and size: a guest without passthrough gets anonymous
//     memory that QEMU maps and the guest populates as it touches it, so a
//     large guest costs its host nothing at start. What a large guest does
//     cost at boot is the guest kernel's own memory map (struct pages, hash
//     tables sized by memory), in the "kernel boot to PID 1" part: under
//     TCG about 0.1 s per GiB (make bench, size: 2.2 s more for the node's
//     23 GiB than for 512 MiB), under KVM a small fraction of that. A
//     passthrough guest (q35, VFIO) must have all its memory present and
//     pinned when the device is realised, the phase Kata reports at 21 s to
//     over 200 s for 24 GiB: MachineArgs preallocates it with one thread per
//     vCPU (prealloc-threads), in huge pages of qemu.hugepages when the
//     site sets a size (a 1 GiB page pins in one step instead of 262144),
//     from a memfd of the VMM's own (memory-backend-memfd,hugetlb=on). Not
//     a hugetlbfs mount (memory-backend-file,mem-path): it would have to be
//     writable by every job user, and any of them, with or without a
//     microVM, could fill it with files that keep the pool's pages after
//     their job; a memfd's pages go back to the pool with the VMM. Not done: hot-plugging the memory after boot (virtio-mem),
//     which moves the memory map's cost out of the boot but not out of the
//     way of the task, which must not start before its memory is there
//     (or the guest OOM-kills what the host allocation allows).
//   - Under TCG the vCPU threads are not pinned (Options.PinTCG, for the
//     tests of the mechanism, does): on the two-node test cluster (two
//     slurmd on one 2-CPU host) two microVMs pinned vCPU for vCPU to the
//     same two CPUs, each running two busy-polling MPICH ranks, hung both
//     guests (no agent answer for 15 s, TestE2EMultiNode mpich over pmi2,
//     twice); unpinned the same test passes in 55 s. An emulated vCPU's
//     cross-vCPU work (TLB flushes, exclusive sections) waits for every
//     vCPU thread of its VM, and a pinned one cannot move off a CPU that a
//     spinning thread holds. Pinning is for KVM, where a vCPU is a CPU.
//   - Placement (SandboxConfig.HostCPUs, MemoryNodes; launcher/placement
//     decides them): the vCPU threads are found by their names, QEMU's
//     -name debug-threads=on ("CPU <n>/TCG", "CPU <n>/KVM"; "ALL CPUs/TCG"
//     for single-threaded TCG), in /proc/<pid>/task/*/comm, polled from
//     the VMM's start until all are there (QEMU creates them during
//     machine set-up, before it loads the kernel), while the guest boots;
//     Start returns only once they are pinned (pin.go). vCPU i goes on
//     placement.VCPUs' CPU with sched_setaffinity per thread id; the main
//     thread first, then every other thread, to the whole allocation
//     (later threads inherit it: QEMU's thread pool spawns its workers
//     from the main loop so that they do not take a vCPU's affinity).
//     Not QMP's query-cpus-fast (github.com/digitalocean/go-qemu): it
//     needs a second control channel into the VMM (a monitor on another
//     inherited socketpair), a handshake and a library for one list of
//     thread ids that the names already give, and pinning before the
//     first guest instruction would also need -S and a `cont`, one more
//     round trip on the boot path, for a few milliseconds of unpinned
//     boot inside the step's cpuset. Trust is the same either way: a
//     compromised VMM could rename its threads or answer QMP with lies;
//     the names are read once, before the guest has run long enough to
//     matter, and under -sandbox resourcecontrol=deny QEMU cannot call
//     sched_setaffinity itself, so it cannot undo the pinning. Pinning is
//     performance; the step's cpuset cgroup, which the VMM inherits, is
//     the boundary. A thread that cannot be pinned (the VMM died, a CPU
//     left the cpuset) is logged, not a failed start: the step would
//     otherwise lose a working sandbox for speed (TestPlacement reads the
//     affinity of every thread from the kernel).
//   - Guest memory on a NUMA node: a memory-backend-ram with
//     host-nodes=N,policy=bind (microvm takes it as
//     `-M microvm,memory-backend=ram`, QEMU 7.2; the q35 machine of GPU
//     steps puts the binding on its own backend), only when
//     SandboxConfig.MemoryNodes is set; none: plain -m RAM (TestPlacement
//     checks the binding in /proc/<pid>/numa_maps). mbind is not in
//     QEMU's seccomp deny lists, so the binding holds under -sandbox.
package qemu
