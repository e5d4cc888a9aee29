#!/usr/bin/env bash
# hack/demo.sh — the main job on a fresh Debian 12 machine, as root:
# installs what is needed, builds and installs slurm-microvm, brings up a
# local one-node Slurm (munge, slurmctld, slurmd) with the plugin in
# plugstack.conf, builds a small real image (busybox-static as an OCI
# archive), and runs real `srun --microvm` steps. The cluster stays up for
# you to try; test/cluster/down.sh stops it.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
bash hack/setup-debian.sh
export PATH=/usr/local/go/bin:$PATH

echo "== build and install (PREFIX=/usr/local)"
make install
echo "== guest kernel and initramfs"
slurm-microvm assets

IMG=/var/lib/slurm-microvm-demo/busybox.tar
mkdir -p "$(dirname "$IMG")"
chmod 0755 "$(dirname "$IMG")"
go run ./test/mkimage -o "$IMG" -name "slurm-microvm demo" >/dev/null
echo "== image $IMG"

STATE=/run/slurm-microvm-demo
# The line an admin installs (etc/plugstack.conf), paths as `make install` put them.
# up.sh's progress, shown only when it fails; a private file, removed on exit.
UPLOG=$(mktemp)
trap 'rm -f "$UPLOG"' EXIT
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
echo "Stop it with: bash $REPO/test/cluster/down.sh $STATE"
