// Package guest implements the agent API inside the microVM: the service that
// cmd/slurm-microvm-agent (PID 1 of the guest) serves over ttrpc.
//
// It runs any number of concurrent processes with the identity fixed once by
// Setup (the job's uid, gid and supplementary groups; a CreateProcess request
// cannot choose another), relays their stdio through blocking ReadOutput and
// WriteStdin calls, delivers signals and reports exit statuses.
//
// Design decisions:
//
//   - A forwarded signal goes to the process's whole process group (each
//     process is a session leader), not the process alone: Slurm signals
//     every process of a step on the host, so a shell's foreground sleep
//     ends and its trap runs at once (TestSignalReachesTheTaskGroup).
//   - Shutdown sends TERM, then KILL after ShutdownTermGrace (1 s), rather
//     than KILL at once: srun in a batch script kills its step's tasks as
//     soon as scancel's TERM reaches srun, before a forwarded TERM has
//     crossed into the guest; on the host the TERM would have come first,
//     so the workload's trap (a checkpoint to a share) gets that second
//     here (TestShutdownLetsTrapsRun). It stays below the host's
//     stop_grace, which bounds the call.
//   - One reaper for every child (wait4(-1) on SIGCHLD) instead of a Wait per
//     process: as PID 1 the agent inherits every orphan of the guest and must
//     reap them all, and two waiters on the same pids race. Starting a process
//     and registering its pid happen under the reaper's lock, so an early exit
//     is never lost.
//   - Processes run chrooted into the image root prepared by Setup (erofs
//     lower, tmpfs upper, overlay) rather than switch_root-ing the agent: the
//     agent keeps the initramfs (its modules, its own binary) and the image
//     needs no init of its own.
//   - argv[0] is resolved with the image's PATH inside that root, following
//     the image's symlinks relative to the root, never the host's PATH: by
//     openat2 RESOLVE_IN_ROOT on the root (one call per search path entry,
//     the kernel's own resolution, as the chrooted process sees it), or
//     component by component (secureJoin) on a kernel before 5.6. The
//     walk by hand took 1-2 ms of an exec's start under TCG.
//   - A process's environment is the image's ENV overridden by the task's,
//     less every name the step owns (StepOwned: SLURM_*, SLURMD_*, PMI_*,
//     PMI2_*, PMIX_*, the GPU selection variables) on the image's side: an
//     image cannot plant a job id, a rank or a PMIx server address that the
//     task did not set. Alternative: dropping only the names the task sets
//     (what a plain merge does) lets the image supply the rest, e.g. a
//     PMIX_SERVER_URI* in a step without PMIx. The list is fixed in the
//     agent rather than sent by the host, so every driver applies it.
//   - argv, environment, working directory, image ENV, mount destinations
//     and the resolved path travel as protobuf bytes, not strings: Linux
//     allows any byte but NUL in them, a protobuf string must be UTF-8, and
//     one such byte used to fail the call with "string field contains
//     invalid UTF-8". Error messages stay strings (they are text for a
//     human); NewServer's interceptor writes their bytes that are not UTF-8
//     as \xNN, so an error naming such a path still reaches the host.
//     Alternative: escaping on the host and unescaping here; rejected, a
//     second encoding of the same bytes that every driver would repeat.
//   - Pending signals (CreateProcessRequest.pending_signals: they reached
//     the task while the microVM booted) are delivered in order, each once
//     the process catches or ignores it (SigCgt/SigIgn in /proc/PID/status,
//     polled every 5 ms: a shell's trap has run, a runtime's handler is
//     in), at once when its default action leaves the process running, and
//     at the latest PendingSignalGrace (10 s) after the start, when its
//     default action applies as on the host to a workload that does not
//     handle it. Signals that come while some are pending queue behind
//     them. Alternative: delivering at once after the start; rejected, the
//     workload has not installed its handler yet and dies of a signal it
//     handles (USR1's default action ends a process).
//   - The guest's CLOCK_REALTIME is set to the host's time carried by each
//     CreateProcess request (its sending time) before the process starts,
//     when the guest is behind it or more than clockSlack (10 ms) ahead: a
//     TCG guest's kernel clock starts from the RTC's whole second and
//     drifts, and timestamps on shared filesystems and build tools must
//     agree with the host's. Between starts the guest clock runs free.
//     Alternatives: setting it once at Setup, which drifts again (and the
//     Setup request is built before the boot, so its time is stale); a
//     guest NTP or PTP (ptp_kvm) client, which needs KVM and a network or
//     more kernel modules, and gives nothing at the first instruction of a
//     workload started right after the boot.
//   - Network (SetupRequest.network): static configuration from the
//     launcher, applied in Setup after the root and the shares and before
//     any process starts: the interface, its MTU, address and up, lo up,
//     the default route via the gateway and the routes, permanent neighbor
//     entries for the step's other guests, then /etc/hosts and (with name
//     servers only) /etc/resolv.conf. Alternative: DHCP in the guest (a
//     client in the agent or the image, a server per step on the host);
//     rejected: the launcher already derives every address from the node
//     and the step, a DHCP exchange adds round trips to every boot and a
//     server to every node, and an image's own client could ask for
//     something else. Every field is checked again in the guest
//     (parseNetwork: unicast MACs, host address, on-link gateway, next
//     hops and neighbors, canonical route prefixes, RFC 1123 names, at most
//     three name servers) before anything is mounted, and a bad one fails
//     Setup naming the field.
//   - The interface is the one whose MAC is network.mac (the VMM's
//     -device ...,mac=), not "eth0" or the first non-loopback link: names
//     depend on probe order and the kernel, and a GPU step's q35 machine
//     can carry passed-through NICs too. None with that MAC fails Setup
//     naming it and the interfaces seen. Its modules (virtio_net,
//     net_failover, failover: launcher/assets NetModules) load only for a
//     step with a network. Setup waits for the carrier (IFF_LOWER_UP), not
//     operstate "up", which the kernel's link watch sets up to a second
//     later while the queue already sends (about 1 s of boot measured).
//   - /etc/hosts and /etc/resolv.conf are written into the root's overlay
//     (its tmpfs upper layer, discarded with the guest), not bind-mounted
//     over the image's files: a bind mount needs a file to mount on (an
//     image may lack /etc, or ship resolv.conf as a dangling symlink into
//     /run), and a mount over a symlink would follow it. /etc is resolved
//     inside the root (guestpath: an image symlink cannot send the write
//     outside) and created when missing; each file is written beside the
//     target and renamed over it, which replaces a symlink rather than
//     following it. With a network, /etc/hosts is replaced, not merged:
//     it maps the step's node names, and an image line must not redirect
//     one; the guest's own host name maps to its interface address, not a
//     loopback one, because MPI libraries publish the address their host
//     name resolves to. Without a network the image's file is kept and
//     only localhost and the host name (127.0.1.1) are added.
//   - Out-of-memory kills are reported with the exit status
//     (WaitResponse.oom_killed). The agent mounts cgroup2 outside the
//     processes' root (MountCgroup), enables the memory controller and
//     starts each process straight into a cgroup of its own
//     (clone3 CLONE_INTO_CGROUP: SysProcAttr.UseCgroupFD, so no child can
//     fork before it is placed); at its exit the cgroup's memory.events
//     oom_kill tells whether the OOM killer killed it or any process it
//     started (the kernel counts every kill, global OOM included, before
//     it sends the SIGKILL, so the count is there when the reaper sees the
//     death). Alternative: /proc/vmstat's oom_kill rising while the
//     process ran and the process dying by SIGKILL; it is guest-wide, so
//     with several tasks in one guest it blames every task that a kill -9
//     ended at the time, and it misses a shell whose child was the victim.
//     It remains the fallback where no cgroup can be made (a guest kernel
//     without CONFIG_MEMCG, clone3 refused). The processes' cgroups carry
//     no limit: the guest's memory is the step's limit (the host enforces
//     the step's, the guest is sized below it).
//   - The next process's cgroup is made ahead (makeSpare: after Setup and
//     after each start, in the background), and a finished one is removed
//     after the exit status is out: creating and removing a memory cgroup
//     were about 3 and 2 ms of an exec of `true` under TCG, on its path.
//     Each process still gets a fresh, empty cgroup of its own; only the
//     /proc/vmstat baseline of the fallback is read when the cgroup is
//     made, not at the start. Alternative: one cgroup shared by all
//     processes (no OOM kill told apart), or reusing a finished process's
//     cgroup (a background child may still be in it, and its count).
//   - ReadOutput does not poll: a read blocked on the process's output is
//     woken by the process's exit (or the request's end) moving the
//     file's read deadline into the past, and after the exit what the
//     pipe still holds is read without waiting (drain) before the output
//     ends. The old loop woke every 200 ms to look at the exit, so a
//     process whose background child kept its output open ended up to
//     200 ms late, and bytes written in the instant of a timeout could be
//     taken for the end. Alternative: closing the pipe's read end at exit
//     (loses what is buffered), or a shorter poll (costs guest CPU for
//     every idle reader).
//   - CreateProcessRequest.stdin_closed starts a process whose task has
//     no input with its stdin at end of file (its pipe's write end closed
//     at once), which saves the CloseStdin call; a terminal never, its
//     end of input is the EOF character. The answer says it was done, so
//     a client facing an agent that does not know the field closes stdin
//     itself.
//   - CreateProcessResponse.create_ns and WaitResponse.run_ns report the
//     agent's own timings (request arrival to the process's start; start
//     to reaping) on the guest's monotonic clock, so the exec breakdown of
//     `make bench` is measured, not inferred; they cost two clock reads.
package guest
