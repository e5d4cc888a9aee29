// Package launcher is the lifecycle of one step's sandbox on one node:
// prepare (record the step), start (the detached supervisor: cgroup
// placement, image, assets, boot, serve), exec (one task, as the job's
// user), stop (graceful poweroff, then kill, then remove state) and gc (all
// of a job). Every call after prepare works from the state directory alone
// (launcher/state), so teardown runs from any fresh process.
//
// Design decisions:
//
//   - Tasks wait for the sandbox themselves: the plugin's task_init only
//     swaps argv[0] for the exec entry, and the exec process waits for the
//     "ready" file, the "error" file or the death of the supervisor, with a
//     timeout. The C plugin stays free of waits and the wait can report
//     why the sandbox failed on the task's own stderr.
//   - Guest memory = the step's memory allocation minus a configured VMM
//     overhead, because the VMM runs in the step's memory cgroup: an
//     oversized guest would be OOM-killed by Slurm as the task's OOM.
//   - The identity of every guest process is fixed by the supervisor at
//     Setup (uid, gid, groups from the plugin, i.e. from slurmstepd), never
//     by the exec client, which runs as the user.
package launcher
