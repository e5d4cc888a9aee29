// Package fault is fault injection for tests and `slurm-microvm poc`:
// points in the supervisor where a step's start can be made to fail at a
// named stage, and behaviours a deliberately broken build shows, so that
// every poc check is seen to FAIL against one.
//
// Only a launcher built with the tag smv_faults has them (fault_on.go);
// the default build's At is a constant nil and its On a constant false
// (fault_off.go), so nothing a tenant or an admin writes can switch a
// fault on in a production binary. In an smv_faults build a fault is
// switched on by root only: a file in Dir named after the job id, or
// "all", holding stage names, one per line (blanks around a name are
// ignored; a line naming no stage is ignored).
//
// What is honoured: Dir and the file must be root's, not writable by
// group or others, and not symlinks (the file a regular file); anything
// else is off, silently, as is any error reading them. Start stages are
// read by the supervisor (root); a behaviour read by the exec entry
// (LogEnv: the task's own process, as the job's user) needs Dir
// searchable and the file readable by that user (0755 and 0644).
//
// The stages, where the supervisor (launcher/lifecycle.go boot) fails:
//
//	shares  after the host shares are opened (before the image: the
//	        supervisor opens the shares first)
//	image   before the image is resolved and converted
//	disk    after the image's disk was made
//	vmm     instead of spawning the VMM (as a failed spawn)
//	agent   after the VMM started: the sandbox is stopped, as when the
//	        agent never becomes ready
//
// Each returns an error wrapping *Injected, which names the stage, and
// goes through the same error path (and so the same teardown) as a real
// failure there.
//
// Design decisions:
//
//   - A build tag plus a root-owned file per job id. The tag keeps the
//     code that reads Dir out of the installed binary (make build refuses
//     a binary built with it: hack/no-test-tags.sh), so a production node
//     cannot be switched into a broken mode at all. The file, inside that
//     test build, lets one process (the poc, an e2e test) break one job
//     while the other jobs of the same cluster run normally, with no
//     restart of slurmd and no change to the job's own input.
//     Alternatives: an environment variable of the job (SMV_FAULT=vmm),
//     or a key in microvm.toml. A variable is set by the tenant (srun
//     passes the user's environment through), so any user could make the
//     supervisor skip read-only or leak its environment; a config key
//     lives in the production binary, where one edited file (or a config
//     management mistake) silently turns an isolation promise off on
//     every node. Both would put the switch in the binary sites run.
//   - Ownership and mode are checked on the opened descriptors (fstat,
//     O_NOFOLLOW), not on the paths: a user who could plant or swap a
//     switch (a symlink into a file it controls, a world-writable Dir)
//     switches nothing on.
package fault
