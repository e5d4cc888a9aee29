// Package inventory lists the sandboxes of a node from their state
// directories (package launcher/state), for `slurm-microvm ps` and
// `slurm-microvm inspect`, and keeps the supervisor's record of what it
// resolved for a step (Resolved, in state.SandboxFile).
//
// A sandbox's phase is read from the files its step directory holds, in
// this order:
//
//	stopping   a stop began (the stop mark or stop record exists)
//	failed     the error file exists, or the recorded supervisor is gone
//	running    the ready mark exists
//	booting    a supervisor is recorded and alive
//	preparing  only the spec exists (prepare ran; the supervisor has not
//	           recorded itself yet)
//
// The JSON field names of Sandbox are stable (tools parse them) and carry
// their unit where they have one (memory_mib, uptime_s).
//
// Design decisions (the alternative, and why not):
//   - The phase is derived from the files the lifecycle already writes in
//     order (spec, supervisor, ready, stop), not kept in a phase file of
//     its own: a second record of the same fact could disagree with the
//     first, and a supervisor that was killed would leave a phase file
//     that says "running" forever.
//   - The supervisor writes what only it knows (the image digest, the
//     vCPUs and memory it gave the guest, its phase times) into
//     sandbox.json once, before the VMM starts, and again when the
//     sandbox is ready; ps reads it without asking the supervisor: a
//     socket to query would be one more thing a hung supervisor leaves
//     unanswered, and the state directory is already where teardown
//     looks.
//   - The uptime counts from the supervisor record's modification time
//     (written once, when the supervisor starts), falling back to the
//     spec's: no clock of the guest's is trusted.
//   - The step spec is decoded here from the fields this package needs,
//     not through launcher.Spec: package launcher writes sandbox.json
//     through this package, so this one cannot import it. The tests
//     write spec.json from a launcher.Spec, so a renamed field fails them.
//   - Reading needs root where the state is root's (the runtime root 0711,
//     each step 0700 with search only for the job's user): List says so
//     in its error instead of listing nothing.
package inventory
