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
//   - Stop wins every race with start. Stop first writes the step's stop
//     record (<runtime_dir>/stopped/<id>, which outlives the state) and,
//     under the step's flock, the stop marker; the supervisor records
//     itself under the same lock only when neither exists, and checks
//     again before each phase that leaves something on the host (GPU
//     binding, scratch, image conversion, MPI check, boot, ready).
//     So stop either finds the supervisor's record and signals it, or the
//     supervisor finds the mark and never begins; a late prepare is
//     refused too. Alternative: only signalling what the records name, as
//     before; a supervisor that had not recorded itself yet then went on
//     (recreated scratch, converted the image) until the epilog's gc.
//   - The supervisor's log goes to two files: launcher.log in the step's
//     state (the user's, for --microvm-debug; removed at stop) and
//     [log] dir/<job>.<step>.<restart>.log (root 0600, kept after the
//     step, pruned at each start by [log] keep and max_age). Alternative:
//     the system log (journald/syslog); not every node runs one that
//     slurmd's children reach, and an admin looking for one step's log
//     finds a file by job id.
//   - Where Slurm allocates no memory (SelectTypeParameters without
//     CR_*_Memory), S_STEP_ALLOC_MEM and S_JOB_ALLOC_MEM are 0 whatever the
//     job asked (measured on 22.05), so the guest is sized from the job's
//     own request instead (size.go GuestMemoryMiB): --mem, else
//     --mem-per-cpu times the guest's vCPUs, minus the same overhead; a
//     request that leaves less than min_memory_mib is refused at prepare
//     (--mem) or before boot (--mem-per-cpu, whose CPU count is known only
//     then), naming the smallest request that fits. The request arrives as
//     SLURM_MEM_PER_NODE/SLURM_MEM_PER_CPU of the step's environment: sbatch
//     and salloc jobs carry them (the job's request, also for a step that
//     asks its own --mem: Slurm keeps no step request a plugin can read);
//     for a job srun allocated itself the plugin reads the request with one
//     slurm_load_job in srun and exports the same variable. Not chosen: an
//     RPC per node from slurmstepd or the launcher (load on slurmctld at
//     scale), or the default size (the reported bug: --mem=700 gave a 1 GiB
//     guest whose VMM used 1.19 GB). --mem-per-gpu is not read. The memory
//     limit the kernel enforces on the step (launcher/cgroup MemoryLimit:
//     the smallest memory.max or v1 memory.limit_in_bytes from the step's
//     cgroup up) caps every size, the default too: the kernel kills the
//     VMM at the limit, not at the request. Not chosen: sizing a guest up
//     to the limit when nothing was requested, since with no memory
//     allocated Slurm's task/cgroup writes the node's whole RAM as the
//     limit; nor ignoring the cgroup (a site's AllowedRAMSpace below 100
//     would OOM-kill every full guest).
//   - The qemu driver sets the VMM's oom_score_adj to 0, the value
//     slurmstepd gives each task; the supervisor keeps slurmstepd's -1000
//     (it holds the clean-up). Inherited, the VMM could never be the OOM
//     killer's choice, and the kernel killed a small relay of the step
//     instead (seen on the cgroup v2 node). Not chosen: a positive value,
//     which would make the sandbox the node's first victim ahead of plain
//     Slurm tasks.
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
//   - A hung guest fails the step within a bound: while the step runs,
//     the supervisor pings the agent on a stream of its own every
//     [timeouts] agent_ping, and a guest that answers none for agent_hang
//     (a VMM stopped by a signal, a locked-up guest kernel, a dead agent)
//     fails the step (AgentHungError, in the error file first), and the
//     VMM is killed at once, with no graceful stop a hung guest would not
//     answer. Each task, blocked in its Wait, sees the connection end and
//     reports the error file's reason (the VMM's own end reads "stopped",
//     which says nothing). Alternatives: yamux's keepalive (the session
//     would close on the first missed ping, with no reason the task can
//     print, and a TCG guest under load can miss one without being hung),
//     or the VMM's process state (a stopped or livelocked VMM is alive).
//   - Each phase of a start, and the stop, is one info line of the
//     supervisor log (msg=phase phase=<name> ms=<int>; names in
//     lifecycle.go's Phase constants) with nothing of the job's in it, so
//     that --microvm-debug (which prints launcher.log on task 0's stderr
//     when the task ends) and the admin's kept log show where the start
//     time went. The stop's line comes after the task: it is in the kept
//     log only. Alternative: a metrics endpoint; a per-step line needs no
//     daemon and survives the step.
//   - A task without input (no stdin, or /dev/null, which slurmstepd gives
//     the tasks that get none) asks for its process to start with stdin
//     at end of file (driver.ProcessSpec.StdinClosed, the agent API's
//     stdin_closed) instead of reading /dev/null's end and then closing
//     the guest's stdin with a CloseStdin call: that call was a round trip
//     on every exec's path (about 3 ms of 30 under TCG). The process sees
//     the same thing, a pipe at end of file. Only /dev/null (char 1:3)
//     counts as no input: an empty regular file or a pipe may still get
//     data. An agent that does not know the field answers without it and
//     the client closes stdin itself (TestStdinClosedFallback).
//   - The exec path's waits poll only where nothing can notify: WaitReady
//     looks for the ready or error file every 10 ms while the supervisor
//     boots (files written by another process; the first look finds a
//     running sandbox ready, so an exec in one costs no poll), explain
//     (driver/control) looks for the supervisor's VMM exit record every
//     20 ms after a broken connection, and ExitLike sleeps 200 ms after it
//     re-sent the workload's signal to itself, only if that signal did not
//     end the process (a default action of ignore or stop), before it
//     exits 128+S. None is on the path of an exec that succeeds.
//   - spec.json carries the user's paths (image, mounts, workdir) byte for
//     byte: a value that is not UTF-8 is also written base64 under "raw",
//     since encoding/json would replace its bytes by U+FFFD.
package launcher
