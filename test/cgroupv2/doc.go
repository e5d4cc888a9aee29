// Package cgroupv2 proves the launcher on a real cgroup v2 node, from a
// host that runs cgroup v1 and must stay as it is.
//
// TestCgroupV2Node boots the node: a QEMU guest (TCG) of the host's Debian
// kernel with cgroup_no_v1=all, so only the unified hierarchy can be
// mounted, whose PID 1 is nodeinit (./nodeinit). Its root file system is
// the host's own tree, read-only over 9p (QEMU enforces readonly=on) with
// a tmpfs overlay for the node's writes, so the node runs the very Slurm,
// munge, QEMU and test build the host has, with nothing to install or copy.
// A second 9p share, workDir, is read-write: the host puts the harness's
// build (harness.Build) and this test binary there, the node runs the
// binary's TestInNode, and its exit status comes back in a file. The node
// has loopback and a dummy link only (Slurm's getaddrinfo needs an
// address): no packet leaves it.
//
// TestInNode starts munge, slurmctld and slurmd with CgroupPlugin=cgroup/v2
// (test/cluster up.sh, IgnoreSystemd=yes) through the e2e harness, and
// runs --microvm steps whose guests boot under TCG inside the TCG node
// (about a minute each). It asserts, inside the node: every process of the
// sandbox is in the step's cgroup with the tasks' OOM standing, the guest's
// memory is charged to the step and held to the job's --mem, a step that
// passes --mem has its VMM killed by the memory cgroup while another job's
// sandbox runs on, and scancel leaves nothing (processes, state, cgroups).
// The node's vmm_overhead_mib is 32, so that a guest can take its VMM past
// the limit; with a realistic overhead the guest's own OOM killer acts
// first, which the v1 end-to-end tests cover.
//
// Design decision: a node VM on the host's own tree rather than an image
// built for it (debootstrap with Slurm and QEMU: minutes and a mirror per
// run) or changing the host's hierarchy (forbidden: other tests and the
// machine depend on cgroup v1). The cost is nested emulation: the whole
// test takes about six minutes on two cores, so it proves the few cases
// above and the v1 end-to-end tests stay the broad ones.
package cgroupv2
