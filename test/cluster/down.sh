#!/usr/bin/env bash
# down.sh [STATE_DIR] — stop the cluster that up.sh started in STATE_DIR
# (default $STATE_DIR or /run/slurm-microvm-test/cluster) and remove STATE_DIR.
# Idempotent: a missing STATE_DIR is success.
#
# Order: cancel this cluster's jobs through its own slurmctld; stop slurmd,
# slurmctld, slurmdbd and mariadbd (ACCOUNTING=1), munged — each by the pid
# up.sh recorded, only if that pid still
# has the recorded start time (no pid reuse accidents): TERM, wait, KILL;
# then, as a backstop, KILL what is still inside this cluster's job cgroups
# (slurm_<node>/uid_*/job_*: processes of jobs this cluster ran) and remove
# those cgroups; remove the /dev/fakegpuN nodes up.sh created; remove the dir
# (with the accounting database: its datadir is STATE_DIR/db).
# Never kills by name.
set -uo pipefail

die() { echo "down.sh: error: $*" >&2; exit 1; }
log() { echo "down.sh: $*"; }

[[ $(id -u) -eq 0 ]] || die "must run as root"
STATE=${1:-${STATE_DIR:-/run/slurm-microvm-test/cluster}}
STATE=$(realpath -m -- "$STATE")
if [[ ! -d $STATE ]]; then
	log "$STATE does not exist: nothing to stop"
	exit 0
fi
[[ $STATE != / && $STATE == /*/* ]] || die "refusing state dir $STATE"
if [[ ! -e $STATE/pids && ! -e $STATE/env && ! -e $STATE/etc/slurm.conf ]]; then
	rmdir "$STATE" 2>/dev/null && exit 0
	die "$STATE does not look like an up.sh state dir (no pids, env or etc/slurm.conf): not touching it"
fi

starttime() { awk '{print $22}' "/proc/$1/stat" 2>/dev/null; }

# recorded NAME -> "pid starttime" of the recorded daemon if it still runs.
recorded() {
	local n pid st
	[[ -f $STATE/pids ]] || return 1
	while read -r n pid st _; do
		[[ $n == "$1" ]] || continue
		# Same pid, same start time, not a zombie: still our daemon.
		if [[ $(starttime "$pid") == "$st" && $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]]; then
			echo "$pid $st"
			return 0
		fi
	done <"$STATE/pids"
	return 1
}

# stop NAME: TERM the recorded daemon, wait up to 10 s, then KILL.
stop() {
	local pid st i
	read -r pid st < <(recorded "$1") || return 0
	log "stopping $1 (pid $pid)"
	kill -TERM "$pid" 2>/dev/null
	for ((i = 0; i < 100; i++)); do
		[[ $(starttime "$pid") == "$st" ]] || return 0
		# A zombie child of ours (the daemon was started by this shell's
		# parent up.sh, so normally it is init's) counts as gone.
		[[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && return 0
		sleep 0.1
	done
	log "$1 (pid $pid) ignored TERM for 10 s: KILL"
	kill -KILL "$pid" 2>/dev/null
	for ((i = 0; i < 50; i++)); do
		[[ $(starttime "$pid") == "$st" ]] || return 0
		sleep 0.1
	done
	log "warning: $1 (pid $pid) still there after KILL"
}

# 1. Cancel this cluster's jobs while its slurmctld still answers, so that
# slurmstepd cleans up steps (cgroups, SPANK exit/epilog callbacks) itself.
if [[ -f $STATE/etc/slurm.conf ]] && recorded slurmctld >/dev/null && recorded slurmd >/dev/null; then
	export SLURM_CONF=$STATE/etc/slurm.conf
	jobs=$(timeout 10 squeue -h -o %A 2>/dev/null | tr '\n' ' ')
	if [[ -n ${jobs// /} ]]; then
		log "cancelling jobs: $jobs"
		# shellcheck disable=SC2086
		timeout 10 scancel $jobs 2>/dev/null
		for ((i = 0; i < 200; i++)); do # KillWait=5 s, plus epilog
			[[ -z $(timeout 10 squeue -h -o %A 2>/dev/null) ]] && break
			sleep 0.1
		done
	fi
fi

# 2. Daemons, the node daemon first; slurmctld sends what it still holds
# for accounting to slurmdbd as it stops, slurmdbd to MariaDB; munged
# (which slurmdbd needs to the end) last.
for d in slurmd slurmctld slurmdbd mariadbd munged; do
	stop "$d"
done

# 3. Backstop: leftovers in this cluster's job cgroups (a crashed test, a
# stuck step). Only under slurm_<node>/uid_*/job_* (v1) or
# system.slice/<node>_slurmstepd.scope/job_* (v2).
NODE=$(cat "$STATE/node" 2>/dev/null || true)
# Another live cluster of up.sh with the same node name shares those cgroups.
for other in /run/slurm-microvm-test/*/; do
	other=${other%/}
	[[ $other != "$STATE" && -f $other/node && $(cat "$other/node") == "$NODE" && -f $other/pids ]] || continue
	while read -r n pid st _; do
		if [[ $n == slurmd && $(starttime "$pid") == "$st" ]]; then
			log "cluster in $other (same node $NODE) is up: leaving the job cgroups alone"
			NODE=""
		fi
	done <"$other/pids"
done
if [[ -n $NODE ]]; then
	roots=()
	if [[ $(stat -fc %T /sys/fs/cgroup) == tmpfs ]]; then
		for c in /sys/fs/cgroup/*/; do
			[[ -d ${c}slurm_$NODE ]] && roots+=("${c}slurm_$NODE")
		done
	else
		[[ -d /sys/fs/cgroup/system.slice/${NODE}_slurmstepd.scope ]] &&
			roots+=("/sys/fs/cgroup/system.slice/${NODE}_slurmstepd.scope")
	fi
	for r in ${roots[@]+"${roots[@]}"}; do
		while read -r f; do
			echo THAWED >"$f" 2>/dev/null
		done < <(find "$r" -path '*job_*' -name freezer.state 2>/dev/null)
		while read -r procs; do
			while read -r pid; do
				[[ -n $pid ]] || continue
				log "killing leftover job process $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-80)) in ${procs%/cgroup.procs}"
				kill -KILL "$pid" 2>/dev/null
			done <"$procs"
		done < <(find "$r" -path '*job_*' -name cgroup.procs 2>/dev/null)
	done
	for r in ${roots[@]+"${roots[@]}"}; do
		for ((i = 0; i < 30; i++)); do
			find "$r" -depth -mindepth 1 -type d \( -path '*job_*' -o -name 'uid_*' \) -exec rmdir {} + 2>/dev/null
			[[ -z $(find "$r" -path '*job_*' -type d 2>/dev/null) ]] && break
			sleep 0.1
		done
	done
fi

# cgroup v2: the cgroup up.sh made for slurmd (slurmd made .../slurmd in it).
if [[ -n $NODE && -d /sys/fs/cgroup/system.slice/slurm-microvm-test-$NODE-slurmd.scope ]]; then
	find "/sys/fs/cgroup/system.slice/slurm-microvm-test-$NODE-slurmd.scope" -depth -type d -exec rmdir {} + 2>/dev/null
fi

# 4. Fake GPU device nodes up.sh created.
if [[ -f $STATE/fakegpus ]]; then
	while read -r d; do
		[[ $d == /dev/fakegpu* && -c $d ]] && rm -f -- "$d"
	done <"$STATE/fakegpus"
fi

# 5. The state dir.
rm -rf -- "$STATE"
log "cluster in $STATE is down"
