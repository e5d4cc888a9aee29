#!/usr/bin/env bash
# hack/demo.sh — the main job on a fresh Debian 12 machine, as root:
# installs what the demo needs (hack/setup-debian.sh --demo: no recommended
# packages, each one named before it is installed), builds and installs
# slurm-microvm (make install, PREFIX=/usr/local), brings up a local
# one-node Slurm (munge, slurmctld, slurmd) with the plugin in its own
# plugstack.conf, builds a small real image (busybox-static as an OCI
# archive), and runs real `srun --microvm` steps. The cluster stays up for
# you to try.
#
#   bash hack/demo.sh        (make demo)       run it
#   bash hack/demo.sh down   (make demo-down)  stop it and remove what it installed
#
# Everything the demo adds is recorded in $DEMO/installed before it is
# added ("package NAME", "go DIR", "path PATH"), and `down` removes exactly
# that: it stops the demo's cluster by the pids up.sh recorded
# (test/cluster/down.sh, never by name), removes the paths make install
# and the demo created (not one that was there before), purges the Debian
# packages that setup-debian.sh installed for it, removes the cluster's
# user microvmtest if the demo created it, and removes Go if it installed it.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
# SMV_DEMO_DIR, SMV_DEMO_STATE: other places for the record and image, and
# for the cluster's state (test/pkg TestDemoDownRemovesOnlyRecorded).
DEMO=${SMV_DEMO_DIR:-/var/lib/slurm-microvm-demo}
RECORD=$DEMO/installed
STATE=${SMV_DEMO_STATE:-/run/slurm-microvm-demo}
DEMO_USER=microvmtest
IMG=$DEMO/busybox.tar

[[ $(id -u) -eq 0 ]] || { echo "demo: run as root" >&2; exit 1; }

# What `make install` writes (dirs.mk's defaults) and what the launcher
# creates at microvm.toml's defaults.
INSTALL_PATHS=(
	/usr/local/bin/slurm-microvm /usr/local/bin/slurm-microvm-exec
	/usr/local/libexec/slurm-microvm
	/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_microvm.so
	/etc/slurm/microvm.toml
	/var/cache/slurm-microvm /var/log/slurm-microvm /run/slurm-microvm /var/lib/slurm-microvm
)

if [[ ${1:-} == down ]]; then
	echo "== demo down: stopping the demo's cluster ($STATE)"
	bash test/cluster/down.sh "$STATE"
	if [[ ! -f $RECORD ]]; then
		echo "demo: no $RECORD: nothing the demo installed is recorded; done"
		exit 0
	fi
	mapfile -t paths < <(awk '$1 == "path" {print $2}' "$RECORD")
	mapfile -t pkgs < <(awk '$1 == "package" {print $2}' "$RECORD")
	mapfile -t gos < <(awk '$1 == "go" {print $2}' "$RECORD")
	if grep -qxF "user $DEMO_USER" "$RECORD" && id "$DEMO_USER" >/dev/null 2>&1; then
		echo "demo: removing the user $DEMO_USER (and its home) that the demo's cluster created"
		userdel -r "$DEMO_USER" 2>/dev/null || userdel "$DEMO_USER"
	fi
	for p in "${paths[@]}"; do
		case $p in /usr/local/* | /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_microvm.so | /etc/slurm/microvm.toml | /var/cache/slurm-microvm | /var/log/slurm-microvm | /run/slurm-microvm | /var/lib/slurm-microvm) ;;
		*) echo "demo: $RECORD: not a path the demo makes: $p (left alone)" >&2; continue ;;
		esac
		if [[ -e $p || -L $p ]]; then echo "demo: removing $p"; rm -rf -- "$p"; fi
	done
	if ((${#pkgs[@]} > 0)); then
		echo "demo: purging the ${#pkgs[@]} Debian packages the demo installed: ${pkgs[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get purge -y "${pkgs[@]}"
	fi
	for g in "${gos[@]}"; do
		[[ $g == /usr/local/go ]] || { echo "demo: $RECORD: not the Go the demo installs: $g (left alone)" >&2; continue; }
		echo "demo: removing Go ($g)"
		rm -rf -- "$g" /etc/profile.d/slurm-microvm-go.sh
	done
	rm -rf -- "$DEMO"
	kept=()
	for p in "${INSTALL_PATHS[@]}"; do
		[[ -e $p || -L $p ]] && kept+=("$p")
	done
	if id "$DEMO_USER" >/dev/null 2>&1; then kept+=("user $DEMO_USER"); fi
	echo "demo: down; removed what it recorded (${#paths[@]} paths, ${#pkgs[@]} packages, ${#gos[@]} Go) and its own $DEMO and $STATE"
	if ((${#kept[@]} > 0)); then
		echo "demo: left alone, as they were there before the demo: ${kept[*]}"
	fi
	exit 0
fi
[[ -z ${1:-} ]] || { echo "demo: unknown argument $1 (nothing, or down)" >&2; exit 2; }

mkdir -p "$DEMO"
chmod 0755 "$DEMO"
touch "$RECORD"
# Paths (and the cluster's test user) that are not there yet are the
# demo's: recorded before they exist.
if ! id "$DEMO_USER" >/dev/null 2>&1 && ! grep -qxF "user $DEMO_USER" "$RECORD"; then echo "user $DEMO_USER" >>"$RECORD"; fi
for p in "${INSTALL_PATHS[@]}"; do
	if [[ ! -e $p && ! -L $p ]] && ! grep -qxF "path $p" "$RECORD"; then echo "path $p" >>"$RECORD"; fi
done
echo "== packages (hack/setup-debian.sh --demo; what it adds is recorded in $RECORD)"
SETUP_RECORD=$RECORD bash hack/setup-debian.sh --demo
export PATH=/usr/local/go/bin:$PATH

echo "== build and install (PREFIX=/usr/local): /usr/local/bin/slurm-microvm{,-exec},"
echo "   /usr/local/libexec/slurm-microvm/, /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_microvm.so,"
echo "   /etc/slurm/microvm.toml if absent"
make install
echo "== guest kernel and initramfs (into /var/cache/slurm-microvm)"
slurm-microvm assets

go run ./test/mkimage -o "$IMG" -name "slurm-microvm demo" >/dev/null
echo "== image $IMG"

# The line an admin installs (etc/plugstack.conf), paths as `make install` put them.
# up.sh's progress, shown only when it fails; a private file, removed on exit.
UPLOG=$(mktemp)
trap 'rm -f "$UPLOG"' EXIT
echo "== local Slurm under $STATE (its own slurm.conf, plugstack.conf, munge key; /etc untouched but for the user microvmtest)"
PLUGSTACK_LINE="$(grep '^required ' etc/plugstack.conf)" \
	bash test/cluster/up.sh "$STATE" >"$UPLOG" || { cat "$UPLOG" >&2; exit 1; }
# shellcheck disable=SC1091
. "$STATE/env"

run() { echo; printf '$'; printf ' %q' "$@"; echo; "$@"; }
echo "== host: $(uname -r), $(. /etc/os-release; echo "$PRETTY_NAME")"
run srun --microvm="$IMG" cat /etc/os-release
run srun --microvm="$IMG" uname -r
run srun -n2 --microvm="$IMG" sh -c 'echo rank $SLURM_PROCID boot_id $(cat /proc/sys/kernel/random/boot_id)'
echo "host boot_id $(cat /proc/sys/kernel/random/boot_id)"
echo
echo "The cluster is up. Try it:"
echo "  . $STATE/env; srun --microvm=$IMG sh -c 'uname -a; id'"
echo "Stop it and remove what the demo installed: make demo-down (bash $REPO/hack/demo.sh down)"
