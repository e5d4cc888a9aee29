// Package cluster brings up a real one-node Slurm cluster on this host for
// end-to-end tests, and runs Slurm commands against it as root or as an
// unprivileged test user.
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
// Only one cluster runs at a time per host: Up holds an exclusive flock on
// LockFile for the cluster's life, so test binaries of different packages
// (which `go test ./...` runs in parallel) take turns, and the fixed default
// state directory lets a later run stop daemons a killed test binary left.
package cluster
