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
# those cgroups; remove the /dev/fakegpuN nodes up.sh created; with NODES=2,
# delete the network namespaces STATE_DIR/net records (by name: their veth
# pairs and bridge go with them); remove the dir (with the accounting
# database: its datadir is STATE_DIR/db).
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

# The slurmd records: slurmd (one node) or slurmd@<node> (NODES=2).
SLURMDS=$(awk '$1 == "slurmd" || $1 ~ /^slurmd@/ {print $1}' "$STATE/pids" 2>/dev/null | sort -u | tr '\n' ' ')
any_slurmd() {
	local d
	for d in $SLURMDS; do recorded "$d" >/dev/null && return 0; done
	return 1
}
# NODES=2: clients reach slurmctld from the controller's namespace only.
IN_CTL=()
CTL_NS=$(awk '$1 == "ctl" {print $2}' "$STATE/net" 2>/dev/null)
[[ -n $CTL_NS && -e /run/netns/$CTL_NS ]] && IN_CTL=(nsenter "--net=/run/netns/$CTL_NS" --)

# 1. Cancel this cluster's jobs while its slurmctld still answers, so that
# slurmstepd cleans up steps (cgroups, SPANK exit/epilog callbacks) itself.
if [[ -f $STATE/etc/slurm.conf ]] && recorded slurmctld >/dev/null && any_slurmd; then
	export SLURM_CONF=$STATE/etc/slurm.conf
	jobs=$(timeout 10 ${IN_CTL[@]+"${IN_CTL[@]}"} squeue -h -o %A 2>/dev/null | tr '\n' ' ')
	if [[ -n ${jobs// /} ]]; then
		log "cancelling jobs: $jobs"
		# shellcheck disable=SC2086
		timeout 10 ${IN_CTL[@]+"${IN_CTL[@]}"} scancel $jobs 2>/dev/null
		for ((i = 0; i < 200; i++)); do # KillWait=5 s, plus epilog
			[[ -z $(timeout 10 ${IN_CTL[@]+"${IN_CTL[@]}"} squeue -h -o %A 2>/dev/null) ]] && break
			sleep 0.1
		done
	fi
fi

# 2. Daemons, the node daemons first; slurmctld sends what it still holds
# for accounting to slurmdbd as it stops, slurmdbd to MariaDB; munged
# (which slurmdbd needs to the end) last.
for d in $SLURMDS slurmctld slurmdbd mariadbd munged; do
	stop "$d"
done

# 3. Backstop: leftovers in this cluster's job cgroups (a crashed test, a
# stuck step). Only under slurm_<node>/uid_*/job_* (v1) or
# system.slice/<node>_slurmstepd.scope/job_* (v2), for each node of
# STATE_DIR/node (one name a line).
mapfile -t NODE_LIST < <(grep -v '^$' "$STATE/node" 2>/dev/null)
for NODE in ${NODE_LIST[@]+"${NODE_LIST[@]}"}; do
	# Another live cluster of up.sh with the same node name shares those cgroups.
	for other in /run/slurm-microvm-test/*/; do
		other=${other%/}
		[[ $other != "$STATE" && -f $other/node && -f $other/pids ]] || continue
		grep -qxF -- "$NODE" "$other/node" || continue
		while read -r n pid st _; do
			if [[ ($n == slurmd || $n == "slurmd@$NODE") && $(starttime "$pid") == "$st" ]]; then
				log "cluster in $other (same node $NODE) is up: leaving the job cgroups of $NODE alone"
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
			# NODES=2 made these node names' slurm_<node> roots (v1):
			# remove them once empty (rmdir refuses otherwise).
			[[ -f $STATE/net ]] && rmdir "$r" 2>/dev/null
		done
	fi

	# cgroup v2: the cgroup up.sh made for slurmd (slurmd made .../slurmd in it).
	if [[ -n $NODE && -d /sys/fs/cgroup/system.slice/slurm-microvm-test-$NODE-slurmd.scope ]]; then
		find "/sys/fs/cgroup/system.slice/slurm-microvm-test-$NODE-slurmd.scope" -depth -type d -exec rmdir {} + 2>/dev/null
	fi
done

# 4. Fake GPU device nodes up.sh created.
if [[ -f $STATE/fakegpus ]]; then
	while read -r d; do
		[[ $d == /dev/fakegpu* && -c $d ]] && rm -f -- "$d"
	done <"$STATE/fakegpus"
fi

# 4b. OCI_CONF: the cgroup v1 hierarchies and the user run directories
# up.sh made (each path as it recorded it, checked again here). A
# hierarchy still holding a cgroup stays mounted (umount would only hide
# it): it is logged.
if [[ -f $STATE/oci-cgmounts ]]; then
	while read -r d; do
		[[ $d =~ ^/sys/fs/cgroup/[a-z_]+$ ]] || { log "warning: $STATE/oci-cgmounts: not a path up.sh makes: $d"; continue; }
		if [[ -n $(find "$d" -mindepth 1 -maxdepth 1 -type d 2>/dev/null) ]]; then
			log "warning: $d holds cgroups: leaving it mounted"
			continue
		fi
		umount "$d" 2>/dev/null || log "warning: cannot unmount $d"
		rmdir "$d" 2>/dev/null
	done <"$STATE/oci-cgmounts"
fi
if [[ -f $STATE/oci-rundirs ]]; then
	while read -r d; do
		[[ $d =~ ^/run/user/[0-9]+$ && -d $d && ! -L $d ]] && rm -rf -- "$d"
	done <"$STATE/oci-rundirs"
fi

# 5. NODES=2: the network namespaces up.sh recorded (it refuses to start
# when one of those names exists already, so each is this dir's own).
# Deleting a namespace's name drops the last reference once its daemons
# are gone: the kernel then destroys its interfaces, the veth pairs (both
# ends) and the bridge with them. Nodes and controller first, the fabric
# last.
if [[ -f $STATE/net ]]; then
	while read -r kind ns _; do
		[[ $kind == fabric || $kind == ctl || $kind == node ]] || continue
		[[ $ns =~ ^smv-[0-9a-f]{6}-[a-z0-9]+$ ]] || { log "warning: $STATE/net: not a name up.sh makes: $ns"; continue; }
		if [[ -e /run/netns/$ns ]]; then
			ip netns delete "$ns" || log "warning: cannot delete network namespace $ns"
		fi
	done < <(grep -v '^fabric ' "$STATE/net"; grep '^fabric ' "$STATE/net")
fi

# 6. The state dir.
# Two-node mode's TmpFS root under /tmp (up.sh records it).
if [[ -f $STATE/tmproot ]]; then
	t=$(cat "$STATE/tmproot")
	[[ $t == /tmp/smv-test-* && -d $t && ! -L $t ]] && rm -rf -- "$t"
fi
rm -rf -- "$STATE"
log "cluster in $STATE is down"
