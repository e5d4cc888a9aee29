#!/usr/bin/env bash
# hack/setup-debian.sh — prepare a Debian 12 machine (as root) to build and
# test slurm-microvm: the Debian packages the project uses, and a Go toolchain
# at least as new as go.mod asks for. Idempotent: a second run changes nothing.
#
#   sudo hack/setup-debian.sh          everything the tests use
#   sudo hack/setup-debian.sh --demo   only what hack/demo.sh needs (DEMO_PACKAGES)
#
# Before installing, it prints every package apt-get will add (those named
# and their dependencies) and where they go. The demo profile installs no
# recommended packages (--no-install-recommends: qemu-system-x86 alone would
# pull qemu-system-gui and a desktop stack).
#
# Environment (optional):
#   GOPROXY             module proxy list (default https://proxy.golang.org);
#                       the Go toolchain is fetched from it as the module
#                       golang.org/toolchain, like `go` itself does
#   GOSUMDB=off         skip checking the toolchain zip against the checksum
#                       database (looked up through the proxy)
#   GO_VERSION=1.x.y    install this Go instead of go.mod's toolchain/go line
#   GO_INSTALL_DIR=DIR  where Go goes (default /usr/local/go)
#   FORCE_GO_DOWNLOAD=1 download even when a new enough go is present
#   SKIP_APT=1          do not touch Debian packages
#   SETUP_RECORD=FILE   append to FILE what this run installed: "package NAME"
#                       for each Debian package apt-get added, "go DIR" when it
#                       installed Go (hack/demo.sh down removes exactly those)
set -euo pipefail

log() { echo "setup-debian: $*"; }
die() { echo "setup-debian: error: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (apt-get, /usr/local)"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROFILE=test
case ${1:-} in
--demo) PROFILE=demo ;;
"") ;;
*) die "unknown argument $1 (use --demo or nothing)" ;;
esac
record() { if [[ -n ${SETUP_RECORD:-} ]]; then echo "$*" >>"$SETUP_RECORD"; fi; }

# Debian packages. Why each one:
PACKAGES=(
	slurm-wlm munge libslurm-dev      # Slurm 22.05 daemons/clients, munge, <slurm/spank.h>
	libpmix2 libpmix-dev              # srun --mpi=pmix: Slurm dlopens pmix2/lib/libpmix.so (in -dev)
	libopenmpi-dev openmpi-bin libmpich-dev mpich libucx-dev libfabric-dev # MPI stacks: mpi check, test programs
	qemu-system-x86 linux-image-amd64 # the VMM and the guest kernel (/boot/vmlinuz-*)
	erofs-utils squashfs-tools cpio kmod busybox-static debootstrap # images, initramfs
	docker-registry                   # local OCI registry for image tests
	apache2-utils                     # htpasswd: the private-registry tests' basic-auth file
	protobuf-compiler                 # agent protocol
	gcc libc6-dev make pkg-config     # cgo, the SPANK plugin
	xz-utils zstd gzip                # compressed kernel modules (test/fixture/nvstandin)
	git ca-certificates curl unzip    # sources, Go toolchain download
	iproute2 procps util-linux passwd hostname # ss and ip netns, ps, setsid/setpriv/nsenter, useradd: test cluster scripts
	nftables                          # nft: the step network tests read the fence back (launcher/network)
	slurmdbd mariadb-server           # test cluster's accounting mode (ACCOUNTING=1): GPU quotas
	chromium                          # headless browser: the poc report's HTML test (launcher/poc/report)
	containerd runc                   # containerd-shim-runc-v2 and containerd: stand in for Kata's shim (launcher/kata)
	crun                              # with runc: Slurm's own srun --container, the bench's baseline (test/bench)
)

# What hack/demo.sh needs, and nothing else: build (Go's cgo, the plugin
# against <slurm/spank.h>), one local Slurm node, QEMU with a guest
# kernel, the image tools, the test cluster scripts' tools.
DEMO_PACKAGES=(
	slurmd slurmctld slurm-client munge libslurm-dev
	qemu-system-x86 linux-image-amd64
	erofs-utils squashfs-tools busybox-static
	gcc libc6-dev make pkg-config
	git ca-certificates curl unzip
	iproute2 procps util-linux passwd hostname
)
APT_OPTS=()
if [[ $PROFILE == demo ]]; then
	PACKAGES=("${DEMO_PACKAGES[@]}")
	APT_OPTS=(--no-install-recommends)
fi

if [[ -r /etc/os-release ]]; then
	# shellcheck disable=SC1091
	. /etc/os-release
	if [[ ${ID:-} != debian || ${VERSION_ID:-} != 12 ]]; then
		log "warning: this is ${PRETTY_NAME:-unknown}, not Debian 12; package names may differ"
	fi
fi

# --- Debian packages ----------------------------------------------------------
if [[ ${SKIP_APT:-} == 1 ]]; then
	log "SKIP_APT=1: not checking Debian packages"
else
	missing=()
	for p in "${PACKAGES[@]}"; do
		if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
			missing+=("$p")
		fi
	done
	if ((${#missing[@]} == 0)); then
		log "all ${#PACKAGES[@]} Debian packages are installed"
	else
		log "missing: ${missing[*]}"
		# Without systemd (containers), keep package scripts from starting
		# munge/slurm daemons with the system config: the test cluster runs
		# its own (test/cluster/up.sh).
		policy=""
		if [[ ! -e /usr/sbin/policy-rc.d && $(cat /proc/1/comm 2>/dev/null) != systemd ]]; then
			policy=/usr/sbin/policy-rc.d
			printf '#!/bin/sh\nexit 101\n' >"$policy"
			chmod 0755 "$policy"
			trap 'rm -f /usr/sbin/policy-rc.d' EXIT
			log "no systemd: $policy denies service starts during the install"
		fi
		log "apt-get update"
		apt-get update
		# What apt-get will add (named packages and their dependencies), said
		# before it does: a simulation (-s) with the same options.
		mapfile -t adds < <(apt-get install -s ${APT_OPTS[@]+"${APT_OPTS[@]}"} "${missing[@]}" | awk '$1 == "Inst" {print $2}')
		log "apt-get install ${APT_OPTS[*]} will add ${#adds[@]} Debian packages into the system (/usr, /etc, /var; services not started):"
		log "  ${adds[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get install -y ${APT_OPTS[@]+"${APT_OPTS[@]}"} "${missing[@]}"
		for p in "${adds[@]}"; do record "package $p"; done
		if [[ -n $policy ]]; then rm -f "$policy"; trap - EXIT; fi
		log "installed ${#missing[@]} packages"
	fi

	# The guest kernel's headers (the newest /boot/vmlinuz-* with
	# /lib/modules, as launcher/assets picks it): test/fixture/nvstandin
	# builds its stand-in NVIDIA kernel modules against them.
	rel=""
	[[ $PROFILE == demo ]] || rel=$(for k in /boot/vmlinuz-*; do
		r=${k#/boot/vmlinuz-}
		if [[ -f $k && -d /lib/modules/$r ]]; then echo "$r"; fi
	done | sort -V | tail -1)
	if [[ $PROFILE == demo ]]; then
		: # the stand-in GPU driver of the tests needs them; the demo does not
	elif [[ -z $rel ]]; then
		log "warning: no /boot/vmlinuz-* with /lib/modules: no kernel headers installed"
	elif ! dpkg-query -W -f='${Status}\n' "linux-headers-$rel" 2>/dev/null | grep -q '^install ok installed$'; then
		log "installing linux-headers-$rel (the guest kernel's)"
		((${#missing[@]} > 0)) || apt-get update
		DEBIAN_FRONTEND=noninteractive apt-get install -y "linux-headers-$rel"
		record "package linux-headers-$rel"
	fi
fi

# --- Go -------------------------------------------------------------------------
# The version go.mod asks for: its toolchain line if any, else its go line
# (which since Go 1.21 names a release: "1.26.0"; "1.22" means 1.22.0).
want=${GO_VERSION:-}
if [[ -z $want ]]; then
	[[ -f $REPO/go.mod ]] || die "no $REPO/go.mod to read the Go version from (set GO_VERSION)"
	want=$(sed -n 's/^toolchain go\([0-9][0-9.a-z]*\).*/\1/p' "$REPO/go.mod" | head -1)
	[[ -n $want ]] || want=$(sed -n 's/^go \([0-9][0-9.a-z]*\).*/\1/p' "$REPO/go.mod" | head -1)
	[[ -n $want ]] || die "no go line in $REPO/go.mod"
fi
if [[ $want =~ ^1\.([0-9]+)$ ]] && ((BASH_REMATCH[1] >= 21)); then want=$want.0; fi

GO_DIR=${GO_INSTALL_DIR:-/usr/local/go}

# go_version BIN: "1.26.8" for a working go binary, empty otherwise.
go_version() { { "$1" version 2>/dev/null || true; } | sed -n 's/^go version go\([0-9][0-9.a-z]*\) .*/\1/p'; }
# at_least HAVE WANT
at_least() { [[ -n $1 && $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1) == "$2" ]]; }

use_go=""
if [[ ${FORCE_GO_DOWNLOAD:-} != 1 ]]; then
	for g in "$GO_DIR/bin/go" "$(command -v go || true)"; do
		[[ -n $g && -x $g ]] || continue
		v=$(go_version "$g")
		if at_least "$v" "$want"; then
			use_go=$g
			log "Go: $g is go$v (go.mod wants $want): keeping it"
			break
		fi
		if [[ -n $v ]]; then log "Go: $g is go$v, older than $want"; else log "Go: $g does not run"; fi
	done
fi

if [[ -z $use_go ]]; then
	case $(uname -m) in
	x86_64) arch=amd64 ;;
	aarch64) arch=arm64 ;;
	*) die "no Go toolchain mapping for $(uname -m)" ;;
	esac
	proxy=""
	IFS=',|' read -r -a proxies <<<"${GOPROXY:-https://proxy.golang.org}"
	for p in "${proxies[@]}"; do
		case $p in direct | off | "") continue ;; esac
		proxy=${p%/}
		break
	done
	[[ -n $proxy ]] || die "GOPROXY=$GOPROXY names no proxy URL to download Go from"
	mod=golang.org/toolchain
	ver=v0.0.1-go$want.linux-$arch
	url=$proxy/$mod/@v/$ver.zip

	parent=$(dirname "$GO_DIR")
	mkdir -p "$parent"
	# Same file system as GO_DIR so the final rename is atomic.
	tmp=$(mktemp -d "$parent/.go-download.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	log "Go: downloading $url"
	curl -fL --retry 3 --retry-delay 2 -sS -o "$tmp/go.zip" "$url" ||
		die "download of $url failed (is go$want a released version? is the proxy reachable?)"
	unzip -q -d "$tmp/x" "$tmp/go.zip" || die "unzip $url failed"
	root=$tmp/x/$mod@$ver
	[[ -f $root/bin/go ]] || die "$url has no $mod@$ver/bin/go"

	if [[ ${GOSUMDB:-} == off ]]; then
		log "Go: GOSUMDB=off: not checking the zip against the checksum database"
	else
		# The module's h1: hash (golang.org/x/mod/sumdb/dirhash Hash1): SHA-256
		# over "<sha256hex>  <path in zip>\n" lines sorted by path, base64.
		got=h1:$(cd "$tmp/x" && find "$mod@$ver" -type f -print0 | LC_ALL=C sort -z |
			xargs -0 sha256sum | sha256sum | cut -c1-64 | tr a-f A-F | basenc -d --base16 | base64)
		lookup=$proxy/sumdb/sum.golang.org/lookup/$mod@$ver
		rec=$(curl -fsS --retry 3 "$lookup") || die "checksum lookup $lookup failed (set GOSUMDB=off to skip)"
		sum=$(awk -v m="$mod" -v v="$ver" '$1 == m && $2 == v {print $3}' <<<"$rec")
		[[ -n $sum ]] || die "no checksum for $mod@$ver in $lookup"
		[[ $got == "$sum" ]] || die "checksum mismatch for $url: got $got, checksum database says $sum"
		log "Go: checksum $got matches sum.golang.org"
	fi

	# What cmd/go does to a downloaded toolchain (cmd/go/internal/toolchain):
	# module zips cannot hold nested go.mod files, so they ship as _go.mod;
	# and make bin/ and pkg/tool/ executable.
	while IFS= read -r -d '' f; do
		cp "$f" "$(dirname "$f")/go.mod"
	done < <(find "$root" -name _go.mod -print0)
	chmod -R a+x "$root/bin" "$root/pkg/tool"
	v=$(go_version "$root/bin/go")
	[[ $v == "$want" ]] || die "downloaded toolchain reports go${v:-?}, want go$want"

	if [[ -e $GO_DIR ]]; then
		log "Go: replacing $GO_DIR (go$(go_version "$GO_DIR/bin/go" || true))"
		mv "$GO_DIR" "$tmp/old"
	fi
	mv "$root" "$GO_DIR"
	rm -rf "$tmp"
	trap - EXIT
	use_go=$GO_DIR/bin/go
	log "Go: installed go$want in $GO_DIR"
	record "go $GO_DIR"
fi

# Make the chosen go the one on PATH.
gobin=$(dirname "$use_go")
if [[ $(command -v go || true) != "$use_go" ]]; then
	if [[ $GO_DIR == /usr/local/go && $gobin == /usr/local/go/bin ]]; then
		# shellcheck disable=SC2016 # expanded by the login shell
		echo 'case ":$PATH:" in *:/usr/local/go/bin:*) ;; *) PATH=/usr/local/go/bin:$PATH ;; esac' >/etc/profile.d/slurm-microvm-go.sh
		log "Go: login shells get /usr/local/go/bin first on PATH (/etc/profile.d/slurm-microvm-go.sh)"
	fi
	if [[ -n ${GITHUB_PATH:-} ]]; then echo "$gobin" >>"$GITHUB_PATH"; fi
	log "Go: run: export PATH=$gobin:\$PATH"
fi
log "done: $("$use_go" version)"
