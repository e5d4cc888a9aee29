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
