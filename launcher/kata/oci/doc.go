// Package oci builds the OCI runtime spec (config.json) of a step's sandbox
// container: the one container the Kata driver creates per step and node,
// whose init process the driver starts and into which it execs the tasks.
//
//	s, err := oci.Spec(oci.Input{
//		RootfsPath: "/run/slurm-microvm/12.0/rootfs", UID: 1000, GID: 1000,
//		Init:        oci.Process{Args: []string{"/.smv/init"}},
//		Mounts:      []oci.Mount{{Source: "/run/slurm-microvm/12.0/shares/0", Destination: "/data", ReadOnly: true}},
//		CgroupsPath: "/slurm/uid_1000/job_12/step_0/smv-kata",
//		Devices:     []oci.Device{{Path: "/dev/vfio/vfio", Major: 10, Minor: 196}, {Path: "/dev/vfio/17", Major: 243, Minor: 0}},
//		Annotations: ann, // katacfg.Annotations: the VM's size
//	})
//
// Spec is pure: it reads no file and validates its input (errors name the
// field, the value and the rule). testdata/*.json are its output for a
// plain step, a step with shares and a GPU step (go test -update rewrites
// them); TestSpecUnderRunc runs the spec with runc, the runtime behind the
// runc shim that stands in for Kata's in the tests.
//
// What the spec holds, and where from: containerd's default Unix spec
// (pkg/oci populateDefaultUnixSpec: namespaces pid, ipc, uts, mount,
// network; /proc, /dev, /dev/pts, /dev/shm, /dev/mqueue, /sys read-only,
// /run; its masked and read-only paths; a deny-all device rule), with:
// the job's uid, gid and groups; empty capability sets (the capabilities
// object present and empty, so the runtime sets no capability rather than
// its defaults) and no_new_privs; no rlimits (the process keeps the
// shim's, which the launcher inherited from slurmstepd); the writable root
// filesystem the caller mounted; the shares as bind mounts; the VFIO
// devices with an allow rule each; linux.cgroupsPath as given.
//
// # Design decisions (each with the alternative and why not)
//
// No seccomp profile. Under Kata the guest kernel is the boundary: the
// container runs in the VM, and a profile would only filter calls to the
// guest's kernel (Kata's disable_guest_seccomp defaults to true and drops
// a spec's profile anyway). containerd's default profile would also refuse
// calls HPC tools make (perf_event_open, for one). With the runc
// shim the tests run the container on the host without one; runc stands in
// for the API path only, not for the isolation.
//
// No linux.resources limits from the allocation. The VM is sized by the
// annotations default_vcpus and default_memory (katacfg.Annotations), and
// Kata adds a container's CPU quota and memory limit on top of them (the
// Go runtime: SandboxConfig with static_sandbox_resource_mgmt, hot-plug in
// updateResources otherwise): limits in the spec would give the guest
// twice the allocation, and the VMM would exceed --mem. The step's cgroup,
// the parent of linux.cgroupsPath, already bounds the whole sandbox (with
// sandbox_cgroup_only: shim, VMM, virtiofsd). linux.resources is present
// all the same (the device rules): Kata's shim dereferences it.
//
// Shares are bind mounts of a path, not of a /proc/<pid>/fd/<n> name. A
// directory the launcher holds open belongs to the launcher's mount
// namespace; runc mounts after unsharing its own, and the kernel refuses a
// bind from another namespace (EINVAL, measured with runc 1.1.5 in
// TestSpecUnderRunc). So the launcher opens the user's directory with the
// user's credentials, bind-mounts the fd onto a root-owned staging path,
// read-only there for a read-only share (the host-side enforcement), and
// names that path; Spec refuses sources in /proc with this fix.
//
// Share options. rbind (submounts of a share stay visible, as with the
// built-in driver), rprivate (no mount event propagates back to the host),
// nosuid and nodev on every share, ro on read-only ones. With rbind, ro
// covers the top mount only in runc; submounts are as read-only as the
// staging bind makes them (mount_setattr AT_RECURSIVE on the host), which
// is where the promise is kept. Alternative: runc's rro (recursive
// read-only): not an option Kata's shim documents, and an option the
// runtime does not know fails the step.
//
// Order of shares. Sorted by depth (stable), so /data is mounted before
// /data/sub whatever order the caller gives; the other order would hide
// the inner share. Destinations inside /proc, /sys and /dev are refused:
// the runtime mounts those itself, and a share over /proc/sys or /dev
// would undo the masked and read-only paths.
//
// /dev/shm without containerd's 64 MiB. The built-in driver's guest mounts
// /dev/shm as tmpfs with its default size (half the RAM), and MPI (shared
// memory transports) and NCCL keep their segments there; 64 MiB would
// fail them. (Kata's Go runtime sizes the sandbox's /dev/shm itself,
// DefaultShmSize, unless the mount is a bind of a host directory: a limit
// of Kata's to know about, not changed here.)
//
// VFIO devices only. Devices must be /dev/vfio/<group> or /dev/vfio/vfio
// (the cold-plugged GPUs): Kata finds the host device, and the group's PCI
// devices, from the major:minor given. Group nodes are the job's (0600, uid and gid of the job),
// as the built-in driver gives them to QEMU running as the job;
// /dev/vfio/vfio is 0666 as on hosts.
//
// Network. A new network namespace (loopback only) unless NetNS names
// one; Kata then attaches the namespace's interfaces to the VM (tcfilter).
// No user namespace: Kata's guest and the runtimes run the container as
// the job's real uid, which file ownership in the shares needs.
//
// cgroupsPath verbatim. The caller passes a cgroupfs path; Spec checks
// that it is absolute, clean, not / and not systemd's slice:prefix:name
// form (a relative path would be placed under the runtime's own parent,
// outside the step's cgroup). Which path is the driver's choice, with this
// measured here (Slurm 22.05, proctrack/cgroup, cgroup v1): a process in a
// child of the step's freezer cgroup survives scancel, and the job stays
// COMPLETING, because Slurm signals the pids of the step cgroup's own
// cgroup.procs only (common_cgroup_get_pids), not its children's. A
// sandbox in .../step_S/<child> is still counted by --mem (memory limits
// are hierarchical) but not killed by scancel: the driver either uses the
// step's cgroup itself or kills the sandbox on its own at the step's end.
package oci
