// Package ctrd reaches a Kata sandbox through a containerd daemon the
// site already runs ([kata] mode = "containerd"): the containerd Go
// client (github.com/containerd/containerd/v2/client) creates one
// container per step with the runtime handler from the configuration
// (io.containerd.kata.v2 in production; io.containerd.runc.v2 stands in
// for it in the tests, over the same task API), and Service maps
// taskapi.Service onto the client's Task and Process calls. Cleanup
// deletes what a crashed launcher left, from another process (`stop`,
// `gc`).
//
// # Design decisions
//
//   - This path is optional; the daemonless one (launcher/kata/shim: the
//     driver starts containerd-shim-kata-v2 itself and speaks the task
//     API over ttrpc) is the default on HPC nodes. An HPC node has no
//     container daemon, and the step's processes must stay in the step's
//     cgroup: a shim the launcher starts is its child, in the step's
//     freezer and memory cgroups from its first instruction, so `scancel`
//     (SIGKILL to every process of the step's cgroup) and `--mem` reach
//     the shim and the VMM, and the launcher reaps them. Under containerd
//     the daemon starts the shim: it begins in containerd's cgroup and is
//     the daemon's, not the step's; only the container's processes follow
//     linux.cgroupsPath (the runc shim itself stays in containerd's
//     cgroup), and Kata moves its shim and VMM into the sandbox's cgroup
//     only with sandbox_cgroup_only = true. What escapes the step's
//     cgroup outlives a killed step until `stop` or `gc` deletes the
//     container. The alternative, containerd as the default, would add a
//     node daemon to every compute node and put the sandbox's overhead
//     outside Slurm's accounting; it stays for sites that run containerd
//     for Kata already.
//   - No image, no snapshotter: Spec.Root.Path is an absolute rootfs the
//     Kata driver mounted already (the cached erofs with its overlay), so
//     the container record has no snapshot key and the task no rootfs
//     mounts; the runc shim uses the path as it is, Kata's shares it into
//     the VM. The alternative, importing the image into containerd's
//     content store and a snapshotter, would keep a second copy of every
//     image per node and tie the image cache to the daemon.
//     containerd writes its own bundle (config.json from the spec) under
//     its state directory: taskapi.CreateOptions.Bundle is not read here.
//   - Stdio is the caller's FIFOs by path (fifoIO), not the client's own
//     FIFO sets (cio.NewCreator): those make FIFOs in a directory of their
//     own and copy them to Go streams in this process, a second hop for
//     an exec path that relays its own ends already. The FIFOs belong to
//     the caller: Close removes nothing. Without a terminal, stdout and
//     stderr are both FIFOs or neither (checkIO): containerd's runc shim
//     opens both once one is set (containerd pkg/process/io.go), so the
//     stand-in in the tests behaves as the shim in production.
//   - Kata's configuration.toml travels as the container's runtime options
//     runtimeoptions.v1.Options{ConfigPath}: that is how containerd's CRI
//     plugin names a runtime's config and what Kata's shim reads
//     (containerd-shim-v2 loadRuntimeConfig: annotation
//     io.katacontainers.config_path, then these options, then
//     KATA_CONF_FILE). KATA_CONF_FILE does not work here: the shim gets
//     containerd's environment, not the launcher's.
//   - Shutdown closes the connection and deletes nothing; Delete("")
//     deletes the task and then the container, and Cleanup (SIGKILL to
//     all, wait, delete task, delete container; not-found is success)
//     is the path after a crash. The alternative, deleting on Shutdown,
//     would make a launcher that only reconnects (the watchdog's Ping,
//     `exec` attaching) tear the sandbox down.
//   - One client connection per Service, with the namespace and the
//     runtime handler as the client's defaults (WithDefaultRuntime: the
//     client otherwise reads a namespace label for each container create
//     and task delete). Errors keep containerd's text and errdefs kind
//     (errors.Is(err, errdefs.ErrNotFound) works through the wrapping).
//
// # What the runc shim under a daemon leaves outside the daemon's dirs
//
// Measured with Debian's containerd 1.6.20 and with containerd 2.4.2
// built from the module (with its own runc shim: a 2.x daemon cannot
// start the 1.6 shim, "type with url <id>: not found"): whatever root
// and state the daemon's config names, its runc shim serves on
// /run/containerd/s/<sha256(daemon address/namespace/id)> and keeps
// runc's state in /run/containerd/runc/<namespace>/<id>; both go when
// the task is deleted (the namespace directory stays). test/fixture's
// StartContainerd removes what its daemon's shims created there, and the
// tests check both are gone, with the shim process, the rootfs's mounts
// and the container's cgroup, after Delete and after Cleanup.
//
// # Cost (TestService's log, runc shim, 2 cores under load)
//
// From Connect to a running exec (create the container and its task,
// start init, exec, start it): 113-208 ms with containerd 1.6.20,
// 132-194 ms with 2.4.2. The daemon's RSS with one container: about 38
// MB (1.6.20) and 45 MB (2.4.2), on every node, besides one shim per
// sandbox.
package ctrd
