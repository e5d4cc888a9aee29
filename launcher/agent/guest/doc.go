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
//     the image's symlinks relative to the root, never the host's PATH.
//   - A process's environment is the image's ENV overridden by the task's,
//     less every name the step owns (StepOwned: SLURM_*, SLURMD_*, PMI_*,
//     PMI2_*, PMIX_*, the GPU selection variables) on the image's side: an
//     image cannot plant a job id, a rank or a PMIx server address that the
//     task did not set. Alternative: dropping only the names the task sets
//     (what a plain merge does) lets the image supply the rest, e.g. a
//     PMIX_SERVER_URI* in a step without PMIx. The list is fixed in the
//     agent rather than sent by the host, so every driver applies it.
package guest
