#!/bin/sh
# hack/no-test-tags.sh — refuse Go binaries built with a test-only tag.
#
#   sh hack/no-test-tags.sh BINARY...
#
# smv_faults (launcher/fault: fault injection) and smv_gpu_standin (GPUs
# booted without VFIO) exist for the tests and `slurm-microvm poc` only;
# `make build` must never leave such a binary in bin/ for `make install`,
# whatever GOFLAGS the caller set. The tags are read from the binary's
# own build information (`go version -m`). A binary built with one is
# removed, and the script exits 1 naming it.
set -eu

go=${GO:-go}
status=0
for b in "$@"; do
	info=$($go version -m "$b") || { echo "no-test-tags: cannot read the build information of $b" >&2; exit 1; }
	tags=$(printf '%s\n' "$info" | awk '$1 == "build" && $2 ~ /^-tags=/ { sub(/^-tags=/, "", $2); print $2 }')
	for t in smv_faults smv_gpu_standin; do
		case ",$tags," in
		*,"$t",*)
			echo "$b: built with the test-only tag $t (tags $tags); rebuild without it (check GOFLAGS)" >&2
			rm -f "$b"
			status=1
			;;
		esac
	done
done
exit $status
