#!/bin/sh
# hack/install.sh — install one file by writing a new file next to the
# destination and renaming it over the destination (rename(2) is atomic).
#
#   sh hack/install.sh [-m MODE] SRC DEST    DEST gets a copy of SRC
#   sh hack/install.sh -l TARGET DEST        DEST becomes a symlink to TARGET
#
# A process that has the old DEST open or mapped (slurmd and slurmstepd map
# spank_microvm.so; a running launcher maps its binary) keeps the old
# inode, unchanged: writing in place (cp, os.WriteFile) truncates it under
# them, and `install`/`ln -sf` unlink it first, so for a moment DEST does not
# exist and a job starting then fails to load a `required` plugin.
set -eu

mode=0644
link=
while [ $# -gt 2 ]; do
	case "$1" in
	-m) mode=$2; shift 2 ;;
	-l) link=1; shift ;;
	*) break ;;
	esac
done
if [ $# -ne 2 ]; then
	echo "usage: install.sh [-m MODE] SRC DEST | install.sh -l TARGET DEST" >&2
	exit 2
fi
src=$1
dest=$2
tmp=$(dirname -- "$dest")/.$(basename -- "$dest").tmp.$$
trap 'rm -f -- "$tmp"' EXIT
rm -f -- "$tmp"
if [ -n "$link" ]; then
	ln -s -- "$src" "$tmp"
else
	install -m "$mode" -- "$src" "$tmp"
fi
mv -Tf -- "$tmp" "$dest"
trap - EXIT
