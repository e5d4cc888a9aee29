#!/usr/bin/env bash
# hack/test.sh — every test, on a fresh Debian 12 machine as root: installs
# what the tests use (hack/setup-debian.sh), builds, and runs `make test`
# (unit, integration with real QEMU, and end to end on a real local Slurm).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
bash hack/setup-debian.sh
export PATH=/usr/local/go/bin:$PATH
go version
make test
