// Package poc is `slurm-microvm poc`: the proof of concept a site runs on
// its own cluster before it trusts the product, and CI runs on the local
// test cluster (`make poc`). It submits real jobs through the node's
// Slurm as two test accounts (tenants A and B), inspects the node as root
// after each, and reports one verdict per check (launcher/poc/report):
//
//   - isolation: files (each tenant reaches only its own paths, through
//     a direct path, a symlink it planted, '..' from its own share, and
//     a share of the other's tree; read-only shares refuse writes; the
//     other tree is byte-for-byte unchanged), credentials (a secret in
//     A's environment is in nothing B can read: state, logs, /tmp,
//     /proc, B's own guest; A's control socket refuses B), memory (a
//     step over --mem fails alone, with the reason, the other tenant's
//     concurrent step completes), CPUs, GPUs (0, 1, all), network;
//   - faults: exit 0, exit N, a signal, scancel of a step and of a job
//     (a TERM trap runs), time limit and --signal, the VMM, the
//     supervisor and the exec process killed, a hung guest, a start that
//     fails at each stage (fault injection, smv_faults builds only),
//     slurmstepd killed, a requeue, a checkpoint written while the job
//     is killed; each followed by the residue check and the teardown
//     time against UnkillableStepTimeout;
//   - load: concurrent sandboxes, a job array of tiny steps, back-to-back
//     steps of one image; steps per minute, start-time percentiles, VMM
//     memory per sandbox;
//   - diagnosis: phase durations in the debug output and the admin's log,
//     and no tenant data in any log, job output or the report.
//
// Every check's judgement is a pure function of what was observed
// (judgeFiles, judgeMemory, judgeCPUs, judgeCleanup, judgePhases,
// judgeTenantData, checkpointOK, ...), so the unit tests show each one
// FAIL on the evidence a broken build would leave, and test/poc shows the
// whole check FAIL against real broken builds (smv_faults behaviours:
// shares exported read-write, the environment leaked, state left).
//
// Design decisions (the alternative, and why not):
//
//   - Jobs go through sbatch with the poc's own output files, pinned to
//     the node the poc runs on (-w), not through srun held open by the
//     poc: a batch job survives the poc's own interruption only as long
//     as the poc lets it (cleanup scancels every job id it submitted,
//     by id, never by user or name), and the node-side checks (residue,
//     VMM pids, /proc) need the poc on the node that ran the step.
//   - The residue check is a host-wide snapshot (launcher/residue) taken
//     before each check and compared after, not a list of the names the
//     launcher uses: a leak under an unexpected name is what it exists to
//     catch. On a node shared with other jobs their sandboxes would be
//     counted; the README says to run it in a reservation.
//   - Tenant markers (random tokens in each tenant's environment and
//     files) are searched for in every log and output; the guest reports
//     file digests, never contents, so nothing of a tenant's data ever
//     reaches a report, and the guest-side search for A's secret in B's
//     guest reads its pattern from a file, not its command line.
//   - Fault injection exists only in smv_faults builds (launcher/fault),
//     switched on by a root-owned file per job id written while the job
//     is held (sbatch --hold, scontrol release): a production binary
//     cannot inject a fault, so there its start-stage checks SKIP with
//     that reason instead of pretending.
//   - A hung guest agent is simulated by stopping the VMM (SIGSTOP): from
//     the host a frozen guest and a wedged agent look the same (no
//     answer on the agent channel), and it needs no code in the guest.
package poc
