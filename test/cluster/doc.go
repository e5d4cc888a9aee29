// Package cluster brings up a real one-node (or two-node) Slurm cluster on
// this host for end-to-end tests, and runs Slurm commands against it as root
// or as an unprivileged test user.
//
// The cluster is Debian 12's Slurm 22.05 (slurm-wlm) with munge, started as
// root with no systemd by up.sh (embedded in this package; the same script
// backs the demo: `test/cluster/up.sh [DIR]`, `source DIR/env`,
// `test/cluster/down.sh [DIR]`). Everything it writes lives under one state
// directory:
//
//	DIR/env        exports SLURM_CONF (and MUNGE_SOCKET, the node, the user)
//	DIR/etc/       slurm.conf cgroup.conf plugstack.conf [gres.conf]
//	DIR/munge/     munge.key (root 0600), munge.socket
//	DIR/log/       munged.log slurmctld.log slurmd.log, *.out (daemon stdio)
//	DIR/pids       "name pid starttime exe" of each daemon up.sh started
//	DIR/db/        with Options.Accounting: MariaDB's datadir and socket
//	DIR/net        with Options.Nodes = 2: "KIND NETNS ADDR NODE" per namespace
//	DIR/oci-*      with Options.OCIRuntime: what up.sh mounted or made for it
//	DIR/node       the node names, one a line
//
// Configuration (see up.sh): ClusterName=microvm-test,
// SlurmctldHost=$(hostname -s)(127.0.0.1), one node at 127.0.0.1 shaped as
// `slurmd -C` reports it, partition "debug", proctrack/cgroup,
// task/cgroup+task/affinity, select/cons_tres with CR_Core_Memory and
// DefMemPerCPU = RealMemory/CPUs, ConstrainCores/RAMSpace/Devices=yes,
// KillWait=5, munge with a private key and socket (AuthInfo=socket=...),
// optional fake GPUs (character devices /dev/fakegpuN, major 195, declared as
// gpu:fake:N), PlugStackConfig=DIR/etc/plugstack.conf with the caller's line.
//
// Accounting mode (Options.Accounting, ACCOUNTING=1 for up.sh) adds a
// private MariaDB and slurmdbd, for tests of what Slurm enforces from its
// accounting (per-team GPU quotas: GrpTRES=gres/gpu=N). Each is one more
// daemon in DIR/pids, started and stopped like the others, and the database
// is dropped with DIR. Decisions:
//
//   - MariaDB runs as user mysql with --no-defaults, its datadir, socket
//     and pid file under DIR/db, and --skip-networking: nothing of the
//     system's /etc/mysql, /var/lib/mysql or /run/mysqld is read or
//     written, and no TCP port can clash with a site's server. Not the
//     system's mariadb service: it would outlive the cluster and share
//     state between runs.
//   - slurmdbd reaches it with StorageHost=localhost and MYSQL_UNIX_PORT in
//     its environment (Slurm 22.05 passes no socket to mysql_real_connect;
//     libmariadb then takes MYSQL_UNIX_PORT, checked here), and logs in as
//     root by unix_socket authentication (mariadb-install-db
//     --auth-root-authentication-method=socket): no password to write or
//     leak. Not 127.0.0.1 and a port: that needs a password and a free
//     port, for nothing the test needs.
//   - slurmdbd listens on 127.0.0.1 (DbdAddr, DbdPort=6819 or
//     SLURMDBD_PORT); clients and slurmctld authenticate to it through the
//     cluster's munge socket, which slurm.conf names in
//     AccountingStoragePass (AuthInfo is not used for slurmdbd).
//   - The cluster is registered (sacctmgr add cluster, which also makes
//     account and user root) before slurmctld starts. With
//     AccountingStorageEnforce=associations,limits,qos only root, and users
//     a test gives an association, may submit jobs.
//   - JobAcctGatherType=jobacct_gather/linux: per-step usage from /proc,
//     independent of the cgroup version; the GPU records come from the
//     allocation (AccountingStorageTRES=gres/gpu), not from gathering.
//   - Cold start (mariadb-install-db included) measured on the 2-core
//     test VM: about 1.4 s more than the plain cluster, 2.7 s in all.
//
// Container mode (Options.OCIRuntime = "runc" or "crun", up.sh OCI_CONF)
// turns on Slurm's own `srun --container=BUNDLE`, the bench's container
// baselines (test/bench BenchmarkBaselines). Facts and decisions:
//
//   - DIR/etc/oci.conf is Slurm 22.05's containers guide example for the
//     runtime "using run" (recommended there over create/start, which
//     makes slurmstepd poll the runtime): rootless, RunTimeQuery, Kill,
//     Delete and Run (OCIConf). 22.05's oci.conf has ContainerPath,
//     CreateEnvFile and the RunTime* patterns only.
//   - One change to the guide, forced: it names the runtime's state root
//     /run/user/%U/, but 22.05.8's slurmstepd has no %U and dies on it
//     ("fatal: _generate_pattern: unexpected replacement character: U",
//     seen here). It is /run/user/$(id -u %u)/: each pattern runs with
//     /bin/sh -c and %u is the step user's name, so the user's RunTimeRun
//     and root's clean-up query, kill and delete name the same directory.
//     Not $(id -u) alone: root's clean-up would look in /run/user/0.
//   - slurmstepd reads oci.conf anew for every step (setup_container calls
//     get_oci_conf in each step's own slurmstepd); so SetOCIRuntime
//     switches runtimes between two steps with no slurmd restart, which
//     test/e2e TestSrunContainer checks by seeing the named runtime run.
//     The oci.conf man page's "take effect upon restart" is about the
//     daemons; no daemon holds this file.
//   - /run/user/<uid> of the test user is what systemd-logind makes at
//     login; nobody logs in here, so up.sh makes it (0700, the user's)
//     when missing, as the guide tells sites to arrange (lingering), and
//     down.sh removes what up.sh made (DIR/oci-rundirs).
//   - crun 1.8 refuses a hybrid host (cgroup v1 plus cgroup2 at
//     /sys/fs/cgroup/unified) whose unified hierarchy holds a controller:
//     "cgroups in hybrid mode not supported, drop all controllers from
//     cgroupv2", before its cgroup manager is even chosen, so
//     --cgroup-manager=disabled does not help. This project's test VMs
//     mount no v1 hugetlb hierarchy, which leaves hugetlb there; systemd's
//     hybrid mode mounts every controller on v1 and leaves the unified
//     hierarchy empty. up.sh does the same for the controllers it finds
//     there (mount -t cgroup -o C cgroup /sys/fs/cgroup/C, in
//     DIR/oci-cgmounts) and down.sh unmounts them again, which hands the
//     controller back to cgroup2 (checked). Slurm's cgroup plugin does not
//     use hugetlb; a rootless runtime cannot create cgroups in a root
//     hierarchy and ignores that, as it does in the others.
//   - runc needs nothing more: its rootless mode ignores the cgroups it
//     cannot create on v1.
//   - Without Options.OCIRuntime nothing of this happens: no oci.conf, so
//     Slurm ignores --container, and no mount or directory (TestCluster
//     "no containers by default").
//
// Two-node mode (Options.Nodes = 2, up.sh NODES=2) runs two slurmd "nodes"
// (n1, n2 unless Options.NodeNames says otherwise) on this one host, each
// in a network namespace of its own, for steps that span nodes:
//
//	namespace         holds                          address (FABRIC_NET)
//	smv-<tag>-fab     bridge br0, veth ends v0 v1 v2  none
//	smv-<tag>-ctl     slurmctld, slurmdbd, clients    10.250.0.1/24 on fab0
//	smv-<tag>-n1      slurmd -N n1, its steps         10.250.0.11/24 on fab0
//	smv-<tag>-n2      slurmd -N n2, its steps         10.250.0.12/24 on fab0
//
// <tag> is 6 hex digits of the md5 of the state directory's path, so two
// state directories never share a namespace name; interface names need
// no tag, each lives in a namespace of its own cluster. slurm.conf has
// SlurmctldHost=<host>(10.250.0.1), NodeName=n1 NodeAddr=10.250.0.11
// NodeHostname=<host> (same for n2, each shaped as `slurmd -C` reports the
// whole host, each declaring the same fake and stand-in GPUs), TmpFS,
// SlurmdSpoolDir, SlurmdLogFile and SlurmdPidFile per node (%n). Steps on
// n1 use the cgroups slurm_n1/... (v1) or n1_slurmstepd.scope (v2).
// Command runs every client in the controller's namespace; NodeCommand
// runs a command in a node's, as the step's supervisor there sees the
// network; NodeNetNS, NodeAddr and Nodes say where each node is. Facts
// and decisions:
//
//   - Daemons enter a namespace by `nsenter --net=/run/netns/X` (it execs:
//     the recorded pid is the daemon's), not `ip netns exec`: that also
//     remounts /sys in a mount namespace of its own, where the cgroup v1
//     hierarchy that slurmd needs is no longer mounted.
//   - Clients run in the controller's namespace: slurmctld is reachable
//     only there (from the host's namespace 10.250.0.1 is not routed),
//     and srun listens for the nodes' slurmd and slurmstepd to connect
//     back to it (task I/O, step completion), which they can from there. A user's command is `nsenter --net=CTL setpriv
//     --reuid --regid --groups` (nsenter needs root), with the same ids
//     the one-node cluster gives it through SysProcAttr.Credential.
//   - munged stays in the host's namespace: every daemon and client
//     reaches it by its unix socket in DIR/munge, which is not a network
//     object. With Accounting, slurmdbd listens on 127.0.0.1 in the
//     controller's namespace (slurmctld and sacct/sacctmgr are there);
//     MariaDB takes only its unix socket.
//   - One TmpFS for both nodes breaks PMIx across them: measured, `srun
//     -N2 -n2 --mpi=pmix` then loses rank 0's output and still exits 0.
//     Hence TmpFS=DIR/tmp/%n, pre-created (Slurm does not create it).
//   - Each node listens on the default ports in its own namespace, so the
//     two-node cluster needs no free port on the host and cannot clash
//     with a system slurmd or another test cluster.
//   - Nothing is added to the host's namespace (no address, route,
//     bridge or veth end: the veth pairs are created inside the fabric
//     namespace with their peers placed straight into the other), and
//     there is no route out of the private ones: a task on n1 gets
//     "network unreachable" for the host's addresses. Not the host's
//     loopback with two ports per node: a node's steps would then see,
//     and could reach, every address of the host.
//   - down.sh deletes exactly the namespaces DIR/net records (written
//     before each is created; up.sh refuses to start when a name exists
//     that the state directory does not record). Deleting a namespace's
//     name, once its daemons are gone, destroys its interfaces, veth
//     pairs and bridge with it.
//   - Inside a two-node job, a one-node step (`srun -N1 -r1`) on n2 has
//     SLURM_NODEID=0, and a SPANK plugin's S_JOB_NODEID is 0 with
//     S_JOB_NNODES 1 (measured with a test plugin in task_init): Slurm
//     counts nodes within the step, not the job.
//   - Startup measured on the 2-core test VM: about 0.5 s (up.sh's
//     "startup" line; the one-node cluster takes about as long).
//
// Step cgroups observed on cgroup v1 (Debian builds Slurm with multiple-slurmd
// support, so the prefix carries the node name):
//
//	freezer:/slurm_<node>/uid_<uid>/job_<job>/step_<step>
//	cpuset: /slurm_<node>/uid_<uid>/job_<job>/step_<step>
//	memory: /slurm_<node>/uid_<uid>/job_<job>/step_<step>/task_<n>
//	devices:/slurm_<node>/uid_<uid>/job_<job>/step_<step>/task_<n>
//
// with the --mem limit on job_<job> and step_<step> (task_<n> unlimited).
//
// Only one cluster of Up runs at a time per host: Up holds an exclusive flock on
// LockFile for the cluster's life, so test binaries of different packages
// (which `go test ./...` runs in parallel) take turns, and the fixed default
// state directory lets a later run stop daemons a killed test binary left.
package cluster
