#!/usr/bin/env bash
# up.sh [STATE_DIR] — bring up a private one-node Slurm cluster (slurmctld +
# slurmd + munged) on this host, as root, with no systemd.
#
# Everything lives under STATE_DIR (default $STATE_DIR or
# /run/slurm-microvm-test/cluster); nothing in /etc is read or written except
# for the test user (useradd) and, with FAKE_GPUS, /dev/fakegpuN nodes.
#
#   STATE_DIR/env              `source` it: exports SLURM_CONF and friends
#   STATE_DIR/etc/             slurm.conf cgroup.conf plugstack.conf [gres.conf]
#   STATE_DIR/munge/           munge.key (0600) munge.socket munged.seed
#   STATE_DIR/log/             munged.log slurmctld.log slurmd.log (+ .out: stdio)
#   STATE_DIR/pids             "name pid starttime exe" of every daemon started
#   STATE_DIR/db/              with ACCOUNTING=1: MariaDB's datadir and socket
#   STATE_DIR/net              with NODES=2: "KIND NETNS ADDR NODE" of every
#                              network namespace up.sh created (KIND fabric,
#                              ctl or node), written before it is created
#
# Re-running up.sh on a STATE_DIR that is up stops that cluster (down.sh) and
# starts a fresh one. Stop it with down.sh STATE_DIR.
#
# Environment (all optional):
#   FAKE_GPUS=N          mknod /dev/fakegpu0..N-1 (char 195:i) and declare
#                        Gres=gpu:fake:N with a gres.conf
#   STANDIN_GPUS=M       M more such devices (/dev/fakegpuN..N+M-1), declared
#                        Type=standin: the e2e build of the launcher boots
#                        their steps without VFIO (launcher/gpu_standin.go)
#   PLUGSTACK_LINE=...   content of plugstack.conf (e.g. "required /path/x.so")
#   SLURM_CONF_EXTRA=... lines appended to slurm.conf (do not repeat keys
#                        written here, SchedulerParameters included)
#   NODE_NAME=name       node name (default: hostname -s); the cgroup prefix is
#                        slurm_<node> because Debian builds multiple-slurmd
#   NODES=1              1: one slurmd at 127.0.0.1 in this network namespace;
#                        2: two slurmd (multiple-slurmd, `slurmd -N`), each in
#                        a network namespace of its own with its own address
#                        on a private bridge, slurmctld in a third (see
#                        "two-node mode" below)
#   NODE_NAMES="n1 n2"   with NODES=2: the two node names
#   FABRIC_NET=10.250.0  with NODES=2: the private /24 of the namespaces
#   SLURMCTLD_PORT=6817 SLURMD_PORT=6818
#   REAL_MEMORY=MB       node RealMemory (default: what `slurmd -C` reports)
#   SELECT_TYPE_PARAMETERS=CR_Core_Memory  (e.g. CR_Core: Slurm allocates no
#                        memory; DefMemPerCPU is then not written)
#   SLURM_DEBUG=info     SlurmctldDebug/SlurmdDebug level
#   CONSTRAIN_DEVICES=yes  cgroup.conf's ConstrainDevices (no: the Kata driver's
#                        runc stand-in, whose own wildcard mknod device rules a
#                        Slurm-constrained devices cgroup refuses)
#   UP_TIMEOUT=60        seconds to wait for the node to become idle
#   TEST_USER=microvmtest  non-root user created for end-to-end tests
#   OCI_CONF=...         content of oci.conf (Slurm's srun --container): written
#                        next to slurm.conf, where every step's slurmstepd
#                        reads it; then also, for TEST_USER's rootless
#                        runtime, /run/user/<uid> (0700, the user's) when
#                        missing, and on a cgroup v1 host a v1 hierarchy for
#                        each controller left on the unified one (crun
#                        refuses such a hybrid host); down.sh undoes both
#   ACCOUNTING=1         also start a private MariaDB (datadir, socket and
#                        pid file under STATE_DIR/db, no TCP) and slurmdbd
#                        (SLURMDBD_PORT=6819, loopback), register the
#                        cluster, and write AccountingStorageType=
#                        accounting_storage/slurmdbd with
#                        AccountingStorageTRES=gres/gpu and
#                        AccountingStorageEnforce=associations,limits,qos:
#                        only root and users given an association with
#                        sacctmgr may then submit jobs
#
# Two-node mode (NODES=2) creates network namespaces named smv-<tag>-fab,
# -ctl, -<node> (<tag>: 6 hex digits of the state dir's md5, so two state
# dirs never share a name), records them in STATE_DIR/net, and down.sh
# deletes exactly those. The fabric namespace holds a bridge (br0); every
# other one is joined to it by a veth pair (fabric side v0, v1, v2; inside
# fab0) with an address of FABRIC_NET.0/24 (default 10.250.0): .1 the
# controller namespace (slurmctld, slurmdbd, and every client: run them
# there with `nsenter --net=/run/netns/smv-<tag>-ctl`), .11 and .12 the
# nodes. Nothing is added to the caller's namespace, and nothing routes out
# of the private ones. munged stays in the caller's namespace: its clients
# reach it by its unix socket from every namespace.
set -euo pipefail

die() { echo "up.sh: error: $*" >&2; exit 1; }
log() { echo "up.sh: $*"; }

[[ $(id -u) -eq 0 ]] || die "must run as root (slurmd, munged and cgroups need it)"

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${1:-${STATE_DIR:-/run/slurm-microvm-test/cluster}}
STATE=$(realpath -m -- "$STATE")
[[ $STATE != / && $STATE == /*/* ]] || die "refusing state dir $STATE: give a dedicated directory"

NODE=${NODE_NAME:-$(hostname -s)}
NODES=${NODES:-1}
[[ $NODES == [12] ]] || die "NODES=$NODES: want 1 or 2"
HOST=$(hostname -s)
NODE_LIST=("$NODE")
IN_CTL=()
if (( NODES == 2 )); then
	[[ -z ${NODE_NAME:-} ]] || die "NODE_NAME is for NODES=1; with NODES=2 give NODE_NAMES=\"a b\""
	read -r -a NODE_LIST <<<"${NODE_NAMES:-n1 n2}"
	(( ${#NODE_LIST[@]} == 2 )) || die "NODE_NAMES=${NODE_NAMES:-}: want two names"
	for n in "${NODE_LIST[@]}"; do
		# Part of a netns name, a cgroup name and file names.
		[[ $n =~ ^[a-z][a-z0-9]{0,15}$ ]] || die "NODE_NAMES: node name '$n': want a lower-case letter, then up to 15 lower-case letters or digits"
		[[ $n != ctl && $n != fab ]] || die "NODE_NAMES: node name '$n' is taken by the controller's or the fabric's namespace"
	done
	[[ ${NODE_LIST[0]} != "${NODE_LIST[1]}" ]] || die "NODE_NAMES: the two names must differ"
	NODE=${NODE_LIST[0]}
	FABRIC_NET=${FABRIC_NET:-10.250.0}
	[[ $FABRIC_NET =~ ^(10\.[0-9]{1,3}|192\.168|172\.(1[6-9]|2[0-9]|3[01]))\.[0-9]{1,3}$ ]] ||
		die "FABRIC_NET=$FABRIC_NET: want the first three octets of a private /24, e.g. 10.250.0"
	CTL_ADDR=$FABRIC_NET.1
	NET_TAG=$(printf '%s' "$STATE" | md5sum | cut -c1-6)
	NS_FAB=smv-$NET_TAG-fab NS_CTL=smv-$NET_TAG-ctl
	declare -A NODE_ADDR NODE_NS
	for i in 0 1; do
		NODE_ADDR[${NODE_LIST[i]}]=$FABRIC_NET.$((11 + i))
		NODE_NS[${NODE_LIST[i]}]=smv-$NET_TAG-${NODE_LIST[i]}
	done
	# IN_CTL runs a command in the controller's namespace.
	IN_CTL=(nsenter "--net=/run/netns/$NS_CTL" --)
fi
CTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
FAKE_GPUS=${FAKE_GPUS:-0}
STANDIN_GPUS=${STANDIN_GPUS:-0}
DEBUG=${SLURM_DEBUG:-info}
TIMEOUT=${UP_TIMEOUT:-60}
TEST_USER=${TEST_USER:-microvmtest}
ACCOUNTING=${ACCOUNTING:-0}
DBD_PORT=${SLURMDBD_PORT:-6819}
[[ $ACCOUNTING == [01] ]] || die "ACCOUNTING=$ACCOUNTING: want 0 or 1"
[[ $FAKE_GPUS =~ ^[0-9]+$ ]] || die "FAKE_GPUS=$FAKE_GPUS: want a number of fake GPUs (0-63)"
(( FAKE_GPUS <= 64 )) || die "FAKE_GPUS=$FAKE_GPUS: at most 64"
[[ $STANDIN_GPUS =~ ^[0-9]+$ ]] && (( FAKE_GPUS + STANDIN_GPUS <= 64 )) ||
	die "STANDIN_GPUS=$STANDIN_GPUS: want a number, with FAKE_GPUS at most 64 in all"
ALL_GPUS=$((FAKE_GPUS + STANDIN_GPUS))

MUNGE_SOCKET=$STATE/munge/munge.socket
# sun_path holds 108 bytes including the NUL.
(( ${#MUNGE_SOCKET} < 100 )) || die "state dir path too long for a unix socket: $MUNGE_SOCKET"
DB_SOCKET=$STATE/db/run/mysqld.sock

for b in munged munge unmunge slurmctld slurmd sinfo scontrol hostname useradd setsid ss; do
	command -v "$b" >/dev/null || die "$b not found: run hack/setup-debian.sh (packages slurm-wlm munge iproute2)"
done
if (( NODES == 2 )); then
	for b in ip nsenter md5sum; do
		command -v "$b" >/dev/null || die "NODES=2: $b not found: run hack/setup-debian.sh (packages iproute2 util-linux coreutils)"
	done
fi
if (( ACCOUNTING )); then
	for b in mariadbd mariadb-install-db mariadb slurmdbd sacctmgr; do
		command -v "$b" >/dev/null || die "ACCOUNTING=1: $b not found: run hack/setup-debian.sh (packages mariadb-server slurmdbd)"
	done
	id -u mysql >/dev/null 2>&1 || die "ACCOUNTING=1: no user mysql (package mariadb-server creates it)"
	(( ${#DB_SOCKET} < 100 )) || die "state dir path too long for a unix socket: $DB_SOCKET"
fi

T0=$(date +%s%N)

# --- restart: stop what a previous up.sh started in this state dir ----------
if [[ -e $STATE/pids || -e $STATE/env ]]; then
	log "state dir $STATE is in use: stopping that cluster first"
	bash "$HERE/down.sh" "$STATE"
fi

# --- ports must be free (another cluster, or a system slurmd) ---------------
# Two-node mode listens only in its own fresh namespaces.
ports=()
if (( NODES == 1 )); then
	ports+=("$CTLD_PORT" "$SLURMD_PORT")
	(( ACCOUNTING )) && ports+=("$DBD_PORT")
fi
for p in ${ports[@]+"${ports[@]}"}; do
	if [[ -n $(ss -Htln "sport = :$p") ]]; then
		others=$(find /run/slurm-microvm-test -mindepth 2 -maxdepth 2 -name pids -printf '%h ' 2>/dev/null || true)
		die "TCP port $p is already in use ($(ss -Htlnp "sport = :$p" | head -1)); another cluster? state dirs: ${others:-none}; stop it with down.sh DIR or set SLURMCTLD_PORT/SLURMD_PORT/SLURMDBD_PORT"
	fi
done

# --- cgroup flavour -----------------------------------------------------------
CG_FS=$(stat -fc %T /sys/fs/cgroup)
case $CG_FS in
tmpfs)
	CG=v1
	for c in freezer memory cpuset devices; do
		[[ -e /sys/fs/cgroup/$c/cgroup.procs ]] || die "cgroup v1 controller $c is not mounted at /sys/fs/cgroup/$c"
	done
	;;
cgroup2fs)
	CG=v2
	# Slurm 22.05's cgroup/v2 wants systemd to delegate a subtree; with
	# IgnoreSystemd=yes it makes <root>/system.slice/<node>_slurmstepd.scope
	# itself, which needs the controllers enabled on the way down.
	f=/sys/fs/cgroup/cgroup.subtree_control
	for c in cpuset cpu memory pids; do
		grep -qw "$c" "$f" || echo "+$c" >"$f" 2>/dev/null ||
			die "cgroup v2: cannot enable $c in $f (processes in a non-root cgroup? move them to a leaf cgroup first)"
	done
	mkdir -p /sys/fs/cgroup/system.slice
	for c in cpuset cpu memory pids; do
		grep -qw "$c" /sys/fs/cgroup/system.slice/cgroup.subtree_control ||
			echo "+$c" >/sys/fs/cgroup/system.slice/cgroup.subtree_control 2>/dev/null ||
			die "cgroup v2: cannot enable $c in /sys/fs/cgroup/system.slice"
	done
	# slurmd moves itself into <its cgroup>/slurmd and enables the
	# controllers in <its cgroup>, which must then hold nothing else (the
	# no-internal-processes rule): give it an empty cgroup of its own, as
	# systemd's Delegate=yes would.
	for n in "${NODE_LIST[@]}"; do
		mkdir -p "/sys/fs/cgroup/system.slice/slurm-microvm-test-$n-slurmd.scope"
	done
	;;
*) die "/sys/fs/cgroup is $CG_FS: want cgroup v1 (tmpfs of controllers) or v2 (cgroup2fs)" ;;
esac

# --- test user ----------------------------------------------------------------
if ! id -u "$TEST_USER" >/dev/null 2>&1; then
	log "creating user $TEST_USER"
	useradd -m -s /bin/bash "$TEST_USER"
fi
TEST_HOME=$(getent passwd "$TEST_USER" | cut -d: -f6)
[[ -d $TEST_HOME ]] || { mkdir -p "$TEST_HOME"; chown "$TEST_USER": "$TEST_HOME"; }

# --- state dir ------------------------------------------------------------------
# Traversable by everyone: srun run by the test user reads slurm.conf and
# connects to the munge socket.
mkdir -p "$(dirname "$STATE")"
chmod 0755 "$(dirname "$STATE")"
if [[ -d $STATE ]]; then
	rmdir "$STATE" 2>/dev/null || die "$STATE exists and is not empty but holds no cluster (no env/pids): remove it or pick another dir"
fi
mkdir -m 0755 "$STATE" || die "cannot create $STATE"
mkdir -m 0755 "$STATE/etc" "$STATE/munge" "$STATE/log" "$STATE/run" "$STATE/spool"
# SlurmdSpoolDir=.../spool/%n: slurmd opens its domain socket and hwloc cache
# there before it would create it.
for n in "${NODE_LIST[@]}"; do mkdir -m 0755 "$STATE/spool/$n"; done
mkdir -m 0700 "$STATE/ctld"
mkdir -m 1777 "$STATE/tmp"
# TmpFS=/tmp/smv-test-<tag>/%n with NODES=2: one per node (Slurm does not
# create it). With one TmpFS for both, `srun -N2 --mpi=pmix` loses a node's
# tasks' output and still exits 0 (measured): the PMIx servers of the two
# nodes collide there. Under /tmp, as Slurm's default TmpFS is: Open MPI
# ranks of a non-root job create Slurm's PMIx app directory below TmpFS
# inside the guest, which works only under a directory everyone may write
# there (README, MPI known limit). Recorded in tmproot; down.sh removes it.
TMPFS_ROOT=""
if (( NODES == 2 )); then
	TMPFS_ROOT=/tmp/smv-test-$NET_TAG
	if [[ -e $TMPFS_ROOT || -L $TMPFS_ROOT ]]; then
		[[ -d $TMPFS_ROOT && ! -L $TMPFS_ROOT && $(stat -c %u "$TMPFS_ROOT") == 0 ]] ||
			die "$TMPFS_ROOT exists and is not root's directory: remove it"
		rm -rf -- "$TMPFS_ROOT"
	fi
	echo "$TMPFS_ROOT" >"$STATE/tmproot"
	mkdir -m 0755 "$TMPFS_ROOT"
	for n in "${NODE_LIST[@]}"; do mkdir -m 1777 "$TMPFS_ROOT/$n"; done
fi
: >"$STATE/pids"

cleanup_on_error() {
	local rc=$?
	if (( rc != 0 )); then
		echo "up.sh: failed (exit $rc); logs:" >&2
		for f in "$STATE"/log/*; do
			[[ -f $f ]] || continue
			echo "----- $f (last 25 lines)" >&2
			tail -n 25 "$f" >&2 || true
		done
		bash "$HERE/down.sh" "$STATE" >&2 || true
	fi
}
trap cleanup_on_error EXIT

# start_daemon NAME CMD... : start CMD in its own session, stdio to
# log/NAME.out, no other fd of the caller's (a flock fd a daemon kept
# would block every later locker for the daemon's life), and record
# "NAME pid starttime exe" in pids.
start_daemon() {
	local name=$1; shift
	(
		for fd in /proc/$BASHPID/fd/*; do
			fd=${fd##*/}
			if (( fd > 2 )); then eval "exec $fd>&-" 2>/dev/null || true; fi
		done
		exec setsid "$@"
	) </dev/null >>"$STATE/log/$name.out" 2>&1 &
	local pid=$!
	local st
	st=$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null) || die "$name exited at once; see $STATE/log/$name.out"
	echo "$name $pid $st $(command -v "${name%@*}")" >>"$STATE/pids"
}

alive() { # alive NAME: the recorded daemon still runs
	local n pid st
	while read -r n pid st _; do
		[[ $n == "$1" ]] || continue
		[[ $(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null) == "$st" && $(awk '{print $3}' "/proc/$pid/stat") != Z ]] && return 0
	done <"$STATE/pids"
	return 1
}

# --- two-node mode: the private network -----------------------------------------
if (( NODES == 2 )); then
	# Refuse names up.sh did not make: only what STATE_DIR/net records is
	# ever deleted, and a namespace of that name is someone else's.
	for ns in "$NS_FAB" "$NS_CTL" "${NODE_NS[@]}"; do
		[[ ! -e /run/netns/$ns ]] || die "network namespace $ns exists but $STATE does not record it: remove it (ip netns delete $ns) if it is a leftover of this state dir"
	done
	: >"$STATE/net"
	echo "fabric $NS_FAB - -" >>"$STATE/net"
	ip netns add "$NS_FAB"
	ip -n "$NS_FAB" link set lo up
	ip -n "$NS_FAB" link add br0 type bridge
	ip -n "$NS_FAB" link set br0 up
	# join KIND NETNS ADDR NODE INDEX: a namespace on the bridge.
	join() {
		echo "$1 $2 $3 $4" >>"$STATE/net"
		ip netns add "$2"
		ip -n "$2" link set lo up
		ip -n "$NS_FAB" link add "v$5" type veth peer name fab0 netns "$2"
		ip -n "$NS_FAB" link set "v$5" master br0 up
		ip -n "$2" addr add "$3/24" dev fab0
		ip -n "$2" link set fab0 up
	}
	join ctl "$NS_CTL" "$CTL_ADDR" - 0
	for i in 0 1; do
		n=${NODE_LIST[i]}
		join node "${NODE_NS[$n]}" "${NODE_ADDR[$n]}" "$n" $((i + 1))
	done
fi

# --- fake GPUs ------------------------------------------------------------------
if (( ALL_GPUS > 0 )); then
	for ((i = 0; i < ALL_GPUS; i++)); do
		d=/dev/fakegpu$i
		if [[ -e $d ]]; then
			[[ -c $d && $(stat -c '%t:%T' "$d") == "c3:$(printf %x "$i")" ]] ||
				die "$d exists but is not the character device 195:$i"
		else
			mknod -m 0666 "$d" c 195 "$i"
			echo "$d" >>"$STATE/fakegpus"
		fi
	done
fi

# --- OCI containers (OCI_CONF) -----------------------------------------------------
# Slurm runs the OCI runtime as the step's user (rootless), with the
# --root=/run/user/<uid>/ of Slurm's oci.conf examples: systemd-logind makes
# that directory for a logged-in user; without it (no login on a node),
# make it as logind would and record it for down.sh.
if [[ -n ${OCI_CONF:-} ]]; then
	uid=$(id -u "$TEST_USER") gid=$(id -g "$TEST_USER")
	if [[ ! -e /run/user/$uid ]]; then
		mkdir -p -m 0755 /run/user
		mkdir -m 0700 "/run/user/$uid"
		chown "$uid:$gid" "/run/user/$uid"
		echo "/run/user/$uid" >>"$STATE/oci-rundirs"
	fi
	# crun (1.8) refuses a hybrid host (cgroup v1 with cgroup2 at
	# /sys/fs/cgroup/unified) whose unified hierarchy holds a controller:
	# "cgroups in hybrid mode not supported, drop all controllers from
	# cgroupv2". A controller no v1 hierarchy mounts sits there (hugetlb
	# on this project's test VMs); systemd's hybrid mode mounts every one
	# on v1 and leaves the unified hierarchy empty. Do the same for the
	# controllers left there, recorded for down.sh (unmounting an empty
	# v1 hierarchy gives the controller back to cgroup2).
	u=/sys/fs/cgroup/unified
	if [[ $CG == v1 && $(stat -fc %T "$u" 2>/dev/null) == cgroup2fs ]]; then
		for c in $(cat "$u/cgroup.controllers"); do
			[[ $c =~ ^[a-z_]+$ ]] || die "unexpected controller name '$c' in $u/cgroup.controllers"
			d=/sys/fs/cgroup/$c
			[[ ! -e $d ]] || die "$u holds controller $c but $d exists: mount the $c hierarchy there (mount -t cgroup -o $c cgroup $d) or remove it"
			mkdir "$d"
			echo "$d" >>"$STATE/oci-cgmounts"
			mount -t cgroup -o "$c" cgroup "$d" || die "cannot mount the cgroup v1 $c hierarchy at $d (crun needs $u without controllers)"
		done
		[[ -z $(cat "$u/cgroup.controllers") ]] || die "$u still holds controllers ($(cat "$u/cgroup.controllers")): crun refuses this hybrid host"
	fi
fi

# --- munge ------------------------------------------------------------------------
if command -v mungekey >/dev/null; then
	mungekey --create --keyfile="$STATE/munge/munge.key" >/dev/null
else
	dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
fi
chown root:root "$STATE/munge/munge.key"
chmod 0600 "$STATE/munge/munge.key"
start_daemon munged munged --foreground --force \
	--socket="$MUNGE_SOCKET" \
	--pid-file="$STATE/munge/munged.pid" \
	--log-file="$STATE/log/munged.log" \
	--key-file="$STATE/munge/munge.key" \
	--seed-file="$STATE/munge/munged.seed"
for ((i = 0; ; i++)); do
	if [[ -S $MUNGE_SOCKET ]] && munge -n --socket="$MUNGE_SOCKET" 2>/dev/null | unmunge --socket="$MUNGE_SOCKET" >/dev/null 2>&1; then
		break
	fi
	alive munged || die "munged exited; see $STATE/log/munged.log"
	(( i < 100 )) || die "munged did not answer on $MUNGE_SOCKET within 10 s"
	sleep 0.1
done

# --- node shape -------------------------------------------------------------------
# `slurmd -C` prints what slurmd will detect; configuring exactly that keeps
# the node from being drained for "Low socket*core*thread count" or memory.
HW=$(slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //')
[[ $HW == *CPUs=* && $HW == *RealMemory=* ]] || die "unexpected 'slurmd -C' output: $HW"
if [[ -n ${REAL_MEMORY:-} ]]; then
	HW=$(sed -e "s/RealMemory=[0-9]*/RealMemory=$REAL_MEMORY/" <<<"$HW")
fi
CPUS=$(grep -o 'CPUs=[0-9]*' <<<"$HW" | cut -d= -f2)
MEM=$(grep -o 'RealMemory=[0-9]*' <<<"$HW" | cut -d= -f2)
SELECT_PARAMS=${SELECT_TYPE_PARAMETERS:-CR_Core_Memory}
[[ $SELECT_PARAMS =~ ^[A-Za-z_,]+$ ]] || die "SELECT_TYPE_PARAMETERS=$SELECT_PARAMS: want e.g. CR_Core or CR_Core_Memory"
DEF_MEM=
[[ $SELECT_PARAMS == *Memory* ]] && DEF_MEM="DefMemPerCPU=$((MEM / CPUS))"
NODE_GRES="" GRES_TYPES="#GresTypes="
gres=()
(( FAKE_GPUS > 0 )) && gres+=("gpu:fake:$FAKE_GPUS")
(( STANDIN_GPUS > 0 )) && gres+=("gpu:standin:$STANDIN_GPUS")
if (( ALL_GPUS > 0 )); then NODE_GRES=" Gres=$(IFS=,; echo "${gres[*]}")" GRES_TYPES="GresTypes=gpu"; fi
NODE_HOST=""
ACCT="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
if (( ACCOUNTING )); then
	# GrpTRES=gres/gpu=N needs gres/gpu tracked; "limits" implies
	# "associations" (no job without an association) and "qos" makes
	# QOS limits count too.
	ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# With slurmdbd, the munge socket for talking to it (clients and slurmctld
# alike): AuthInfo is not used for that.
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageTRES=gres/gpu
AccountingStorageEnforce=associations,limits,qos
JobAcctGatherType=jobacct_gather/linux"
fi
if [[ $NODE != "$(hostname -s)" ]]; then NODE_HOST=" NodeHostname=$(hostname -s)"; fi
CTLD_ADDR=127.0.0.1
SLURMD_LOG=$STATE/log/slurmd.log
TMPFS=$STATE/tmp
NODE_LINES="NodeName=$NODE NodeAddr=127.0.0.1$NODE_HOST $HW$NODE_GRES State=UNKNOWN"
PART_NODES=$NODE
if (( NODES == 2 )); then
	CTLD_ADDR=$CTL_ADDR
	SLURMD_LOG=$STATE/log/slurmd-%n.log
	TMPFS=$TMPFS_ROOT/%n
	NODE_LINES=""
	for n in "${NODE_LIST[@]}"; do
		NODE_LINES+="NodeName=$n NodeAddr=${NODE_ADDR[$n]} NodeHostname=$HOST $HW$NODE_GRES State=UNKNOWN"$'\n'
	done
	NODE_LINES=${NODE_LINES%$'\n'}
	PART_NODES=$(IFS=,; echo "${NODE_LIST[*]}")
fi

CONF=$STATE/etc/slurm.conf
cat >"$CONF" <<EOF
# Written by slurm-microvm test/cluster/up.sh; private to $STATE.
ClusterName=microvm-test
SlurmctldHost=$HOST($CTLD_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$SLURMD_LOG
SlurmctldDebug=$DEBUG
SlurmdDebug=$DEBUG
TmpFS=$TMPFS
PlugStackConfig=$STATE/etc/plugstack.conf
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
SelectType=select/cons_tres
SelectTypeParameters=$SELECT_PARAMS
$DEF_MEM
MpiDefault=none
KillWait=5
ReturnToService=2
SchedulerType=sched/backfill
# Batch jobs start on the next scheduler pass (about 1 s) instead of up to 3 s.
SchedulerParameters=batch_sched_delay=0
SwitchType=switch/none
$ACCT
JobCompType=jobcomp/none
MailProg=/bin/true
$GRES_TYPES
$NODE_LINES
PartitionName=debug Nodes=$PART_NODES Default=YES MaxTime=INFINITE State=UP
${SLURM_CONF_EXTRA:-}
EOF

if [[ $CG == v1 ]]; then
	cat >"$STATE/etc/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=${CONSTRAIN_DEVICES:-yes}
EOF
else
	cat >"$STATE/etc/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v2
IgnoreSystemd=yes
ConstrainCores=yes
ConstrainRAMSpace=yes
ConstrainDevices=${CONSTRAIN_DEVICES:-yes}
EOF
fi

# gres.conf: File= names of devices first..first+n-1.
gres_files() {
	local first=$1 last=$(($1 + $2 - 1))
	if (( last > first )); then echo "/dev/fakegpu[$first-$last]"; else echo "/dev/fakegpu$first"; fi
}
if (( ALL_GPUS > 0 )); then
	{
		echo "AutoDetect=off"
		# NODES=2: each node declares the same devices (one host).
		for n in "${NODE_LIST[@]}"; do
			if (( FAKE_GPUS > 0 )); then echo "NodeName=$n Name=gpu Type=fake File=$(gres_files 0 "$FAKE_GPUS")"; fi
			if (( STANDIN_GPUS > 0 )); then echo "NodeName=$n Name=gpu Type=standin File=$(gres_files "$FAKE_GPUS" "$STANDIN_GPUS")"; fi
		done
	} >"$STATE/etc/gres.conf"
fi

printf '%s\n' "${PLUGSTACK_LINE:-}" >"$STATE/etc/plugstack.conf"
[[ -z ${OCI_CONF:-} ]] || printf '%s\n' "$OCI_CONF" >"$STATE/etc/oci.conf"
chmod 0644 "$STATE"/etc/*

if (( ACCOUNTING )); then
	# slurmdbd reads slurmdbd.conf next to $SLURM_CONF and wants it 0600,
	# owned by its SlurmUser. StorageHost=localhost makes the MariaDB
	# client library use the unix socket MYSQL_UNIX_PORT names (given to
	# slurmdbd below); root logs in by unix_socket authentication, so
	# there is no password anywhere.
	(umask 077 && cat >"$STATE/etc/slurmdbd.conf" <<EOF
# Written by slurm-microvm test/cluster/up.sh; private to $STATE.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=$(hostname -s)
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=$DEBUG
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
	)
	chown root:root "$STATE/etc/slurmdbd.conf"
fi

cat >"$STATE/env" <<EOF
# source me: private Slurm cluster from slurm-microvm test/cluster/up.sh
export SLURM_CONF=$CONF
export SLURM_MICROVM_TEST_STATE=$STATE
export SLURM_MICROVM_TEST_NODE=$NODE
export SLURM_MICROVM_TEST_USER=$TEST_USER
export SLURM_MICROVM_TEST_CGROUP=$CG
# munge clients: munge -n --socket=\$MUNGE_SOCKET | unmunge --socket=\$MUNGE_SOCKET
export MUNGE_SOCKET=$MUNGE_SOCKET
export SLURM_MICROVM_TEST_ACCOUNTING=$ACCOUNTING
EOF
if (( NODES == 2 )); then
	cat >>"$STATE/env" <<EOF
export SLURM_MICROVM_TEST_NODES="${NODE_LIST[*]}"
# Slurm clients reach slurmctld from this network namespace only:
#   nsenter --net=\$SLURM_MICROVM_TEST_CTL_NETNS srun -N2 hostname
export SLURM_MICROVM_TEST_CTL_NETNS=/run/netns/$NS_CTL
EOF
fi
chmod 0644 "$STATE/env"
printf '%s\n' "${NODE_LIST[@]}" >"$STATE/node"

# --- accounting: MariaDB, slurmdbd, the cluster's record -------------------------
export SLURM_CONF=$CONF
T1=$(date +%s%N)
DBD_DAEMONS=""
if (( ACCOUNTING )); then
	DBD_DAEMONS="mariadbd slurmdbd"
	# A server of our own: --no-defaults (no /etc/mysql, so nothing of the
	# system's /var/lib/mysql or /run/mysqld), no TCP, as user mysql.
	# Small buffers for a test of a few jobs: slurmdbd logs that they are
	# below what it recommends for a site, which is harmless here.
	mkdir -m 0755 "$STATE/db"
	mkdir -m 0700 "$STATE/db/data"
	mkdir -m 0755 "$STATE/db/run"
	chown mysql:mysql "$STATE/db/data" "$STATE/db/run"
	DB_OPTS=(--no-defaults --datadir="$STATE/db/data" --user=mysql
		--innodb-buffer-pool-size=32M --innodb-log-file-size=8M --innodb-lock-wait-timeout=900)
	mariadb-install-db "${DB_OPTS[@]}" --auth-root-authentication-method=socket \
		--skip-test-db >"$STATE/log/mariadb-install-db.log" 2>&1 ||
		die "mariadb-install-db failed; see $STATE/log/mariadb-install-db.log"
	start_daemon mariadbd mariadbd "${DB_OPTS[@]}" --skip-networking \
		--socket="$DB_SOCKET" --pid-file="$STATE/db/run/mariadbd.pid"
	for ((i = 0; ; i++)); do
		[[ -S $DB_SOCKET ]] && mariadb --no-defaults --socket="$DB_SOCKET" -e 'select 1' >/dev/null 2>&1 && break
		alive mariadbd || die "mariadbd exited; see $STATE/log/mariadbd.out"
		(( i < TIMEOUT * 10 )) || die "mariadbd did not answer on $DB_SOCKET within ${TIMEOUT}s"
		sleep 0.1
	done
	start_daemon slurmdbd ${IN_CTL[@]+"${IN_CTL[@]}"} env MYSQL_UNIX_PORT="$DB_SOCKET" slurmdbd -D
	for ((i = 0; ; i++)); do
		[[ -n $(${IN_CTL[@]+"${IN_CTL[@]}"} ss -Htln "sport = :$DBD_PORT") ]] && break
		alive slurmdbd || die "slurmdbd exited; see $STATE/log/slurmdbd.log and $STATE/log/slurmdbd.out"
		(( i < TIMEOUT * 20 )) || die "slurmdbd not listening on port $DBD_PORT after ${TIMEOUT}s"
		sleep 0.05
	done
	# Register the cluster before slurmctld starts (it then gets its
	# associations at once); this also makes account and user root.
	${IN_CTL[@]+"${IN_CTL[@]}"} sacctmgr -i add cluster microvm-test >"$STATE/log/sacctmgr.out" 2>&1 ||
		die "sacctmgr add cluster failed: $(cat "$STATE/log/sacctmgr.out")"
fi

# --- slurm daemons ----------------------------------------------------------------
T3=$(date +%s%N)
start_daemon slurmctld ${IN_CTL[@]+"${IN_CTL[@]}"} slurmctld -D -i -f "$CONF"
# Slurm clients (and slurmd's registration) sleep a whole second before
# retrying a refused connection: start them once slurmctld listens.
for ((i = 0; ; i++)); do
	[[ -n $(${IN_CTL[@]+"${IN_CTL[@]}"} ss -Htln "sport = :$CTLD_PORT") ]] && break
	alive slurmctld || die "slurmctld exited; see $STATE/log/slurmctld.log and $STATE/log/slurmctld.out"
	(( i < TIMEOUT * 20 )) || die "slurmctld not listening on port $CTLD_PORT after ${TIMEOUT}s"
	sleep 0.05
done
# One slurmd per node: recorded as slurmd (NODES=1) or slurmd@<node>
# (NODES=2: in the node's namespace; nsenter execs it, same pid).
SLURMD_DAEMONS=""
for n in "${NODE_LIST[@]}"; do
	name=slurmd in_ns=()
	if (( NODES == 2 )); then name=slurmd@$n in_ns=(nsenter "--net=/run/netns/${NODE_NS[$n]}" --); fi
	SLURMD_DAEMONS+=" $name"
	if [[ $CG == v2 ]]; then
		# Enter the delegated cgroup, then exec slurmd (same pid).
		# shellcheck disable=SC2016 # $$ and $@ are for the inner bash
		start_daemon "$name" bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "/sys/fs/cgroup/system.slice/slurm-microvm-test-$n-slurmd.scope" \
			${in_ns[@]+"${in_ns[@]}"} slurmd -D -f "$CONF" -N "$n"
	else
		start_daemon "$name" ${in_ns[@]+"${in_ns[@]}"} slurmd -D -f "$CONF" -N "$n"
	fi
done

deadline=$((SECONDS + TIMEOUT))
want=$(printf 'idle %s\n' "${NODE_LIST[@]}" | sort)
while :; do
	st=$(${IN_CTL[@]+"${IN_CTL[@]}"} sinfo -h -N -n "$PART_NODES" -o '%T %N' 2>/dev/null | sort || true)
	[[ $st == "$want" ]] && break
	for d in munged slurmctld $SLURMD_DAEMONS $DBD_DAEMONS; do
		alive "$d" || die "$d exited; see $STATE/log/${d/@/-}.log and $STATE/log/$d.out"
	done
	(( SECONDS < deadline )) || die "node${NODE_LIST[1]:+s} $PART_NODES not idle after ${TIMEOUT}s (state: ${st:-no answer})"
	sleep 0.1
done
T2=$(date +%s%N)
trap - EXIT

ms() { echo $((($2 - $1) / 1000000)); }
if (( ACCOUNTING )); then
	log "cluster microvm-test is up: node $NODE ($HW) cgroup $CG, accounting (slurmdbd on port $DBD_PORT)"
	log "startup: $(ms "$T0" "$T2") ms total, $(ms "$T1" "$T3") ms MariaDB (install-db included), slurmdbd and the cluster record, $(ms "$T3" "$T2") ms from starting slurmctld to node idle"
elif (( NODES == 2 )); then
	log "cluster microvm-test is up: nodes ${NODE_LIST[*]} at ${NODE_ADDR[${NODE_LIST[0]}]} and ${NODE_ADDR[${NODE_LIST[1]}]}, slurmctld at $CTL_ADDR ($HW each) cgroup $CG"
	log "startup: $(ms "$T0" "$T2") ms total, $(ms "$T3" "$T2") ms from starting slurmctld to nodes idle"
else
	log "cluster microvm-test is up: node $NODE ($HW) cgroup $CG"
	log "startup: $(ms "$T0" "$T2") ms total, $(ms "$T3" "$T2") ms from starting slurmctld to node idle"
fi
if (( NODES == 2 )); then
	cat <<EOF
up.sh: use it (Slurm clients run in the controller's namespace):
    source $STATE/env
    nsenter --net=\$SLURM_MICROVM_TEST_CTL_NETNS sinfo
    nsenter --net=\$SLURM_MICROVM_TEST_CTL_NETNS srun -N2 -l hostname
    nsenter --net=/run/netns/${NODE_NS[${NODE_LIST[0]}]} ip addr    # node ${NODE_LIST[0]}'s side
  logs: $STATE/log/   stop: $HERE/down.sh $STATE
EOF
	exit 0
fi
cat <<EOF
up.sh: use it:
    source $STATE/env
    sinfo; srun -n2 hostname
    runuser -u $TEST_USER -- env SLURM_CONF=\$SLURM_CONF srun id    # as the test user (cwd must be readable by it)
  logs: $STATE/log/   stop: $HERE/down.sh $STATE
EOF
