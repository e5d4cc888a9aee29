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
//   - Signals are never lost: the exec entry catches the signals it
//     forwards (HUP, INT, QUIT, USR1, USR2, ALRM, TERM, CONT) before it
//     waits for the sandbox, and those that came before the process existed
//     go with the exec request as pending signals, in order; the guest
//     agent delivers each once the workload catches or ignores it (see
//     launcher/agent/guest). Every one of them is queued, the terminating
//     ones too: a workload's TERM trap (checkpoint, requeue on preemption)
//     would have run on the host. Alternative: ending the task at once as
//     the default action would, for TERM/INT/HUP/QUIT/ALRM; rejected
//     because it skips those traps, while Slurm's KillWait and SIGKILL
//     (which the exec process cannot catch) still bound a task that waits.
//   - spec.json carries the user's paths (image, mounts, workdir) byte for
//     byte: a value that is not UTF-8 is also written base64 under "raw",
//     since encoding/json would replace its bytes by U+FFFD.
package launcher
