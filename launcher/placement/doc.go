// Package placement finds where a step's sandbox runs on the host: the
// host CPUs of the step's allocation, which vCPU goes on which of them,
// and the NUMA node whose memory backs the guest. The lifecycle reads it
// (Of) and hands it to the driver (driver.SandboxConfig HostCPUs,
// MemoryNodes); each driver applies it in its own terms (launcher/qemu
// pins its vCPU threads and binds its memory backend).
//
// Design decisions:
//
//   - The allocation is what the kernel enforces on the supervisor once
//     it sits in the step's cgroups: its CPU affinity
//     (sched_getaffinity) within its cpuset cgroup's effective CPUs
//     (v1 cpuset.effective_cpus, v2 cpuset.cpus.effective; launcher/cgroup
//     Cpuset). Not S_STEP_ALLOC_CORES: Slurm's core numbers are its own
//     abstract ones (one per core, not per hardware thread, renumbered by
//     socket), not the host's CPU numbers. The same set counts the vCPUs
//     (launcher GuestCPUs reads the affinity too).
//   - Pinning only where the allocation is the step's own (Placement.Known:
//     the step's Slurm cpuset, or fewer CPUs than the node has): without
//     ConstrainCores every step sees the whole node, and each would pin its
//     first vCPU to CPU 0. Then nothing is pinned and the host's scheduler
//     places the vCPUs, as it does the step's tasks.
//   - vCPU i on the allocation's i-th CPU, round robin when there are more
//     vCPUs than CPUs (VCPUs). Not the emulator threads on a CPU of their
//     own: the step's cores are the workload's, and QEMU's main loop,
//     I/O and RCU threads are idle while the guest computes; they run on
//     the whole allocation.
//   - Guest memory bound to a NUMA node only when the host has more than
//     one, all the allocated CPUs sit on one of them, and that node has
//     memory (Node). A step over several nodes gets the kernel's default
//     policy (first touch, from the node of the vCPU that touches it),
//     which follows its pinned vCPUs without an interleave decision of
//     ours. Slurm's own memory binding (--mem-bind, task/affinity) applies
//     to tasks, not to the supervisor, so the node is inferred from the
//     CPUs: what task/affinity's default (--mem-bind=local) would do. The
//     node must also be among the cpuset's memory nodes (v1
//     cpuset.effective_mems, v2 cpuset.mems.effective), or QEMU's bind
//     would fail and the step would not boot: otherwise nothing is bound.
//   - Pinning is performance, not a boundary: the VMM runs as the job's
//     user inside the step's cpuset cgroup, which the kernel enforces
//     whatever the VMM does with its own affinity.
package placement
