# slurm-microvm — build, install, test.
#
#   make build     launcher, static guest agent, SPANK plugin into bin/
#   make install   into PREFIX (default /usr/local) and Slurm's plugin dir
#                  (dirs.mk: every install location, defined once)
#   make assets    install, then build the guest kernel+initramfs into the cache
#   make test      lint, then all tests (needs root and the packages of hack/setup-debian.sh)
#   make lint      go vet and staticcheck
#   make poc       slurm-microvm poc on the local one-node cluster (test/poc)
#   make bench     side-by-side benchmarks (test/bench)
#   make demo      one-node Slurm + a real `srun --microvm` step (hack/demo.sh)
#   make demo-down stop the demo's cluster, remove what the demo installed
#   make man       manual pages into bin/man (from --help's source)
#   make deb       the Debian package bin/slurm-microvm_$(DEB_VERSION)_amd64.deb

include dirs.mk

GO         ?= go
VERSION    ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
GOFLAGS    ?= -trimpath
TESTFLAGS  ?=
INSTALL    := sh hack/install.sh
STATICCHECK ?= $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
# LINT_REPORT_ONLY=1 prints staticcheck's findings without failing.
LINT_REPORT_ONLY ?=
# testsummary prints go test's usual lines plus, per package, what ran and
# what skipped (and why).
TESTSUM    ?= $(GO) run ./hack/testsummary --
# A Debian version starts with a digit: 0~git<commit time>.<hash> (hack/mkdeb).
DEB_VERSION ?= $(shell git log -1 --format=0~git%cd.%h --date=format:%Y%m%d%H%M%S 2>/dev/null || echo 0~dev)
# The package's file times: the commit's (reproducible builds' SOURCE_DATE_EPOCH).
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

.PHONY: all build install assets test unit e2e poc bench demo demo-down man deb clean fmt vet lint

all: build

build:
	mkdir -p bin
	$(GO) build $(GOFLAGS) -ldflags "-X main.version=$(VERSION)" -o bin/slurm-microvm ./cmd/slurm-microvm
	CGO_ENABLED=0 $(GO) build $(GOFLAGS) -o bin/slurm-microvm-agent ./cmd/slurm-microvm-agent
	GO="$(GO)" sh hack/no-test-tags.sh bin/slurm-microvm bin/slurm-microvm-agent
	$(INSTALL) -l slurm-microvm bin/slurm-microvm-exec
	$(MAKE) -C spank
	$(INSTALL) -m 0755 spank/spank_microvm.so bin/spank_microvm.so

# Every file is written next to its destination and renamed over it
# (hack/install.sh): a slurmd or slurmstepd that has the old plugin mapped
# keeps it intact, and no path is ever missing (test/harness
# TestMakeInstallRenames).
install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBEXECDIR) $(DESTDIR)$(SPANKDIR) $(DESTDIR)$(SYSCONFDIR)
	$(INSTALL) -m 0755 bin/slurm-microvm $(DESTDIR)$(BINDIR)/slurm-microvm
	$(INSTALL) -l slurm-microvm $(DESTDIR)$(BINDIR)/slurm-microvm-exec
	$(INSTALL) -m 0755 bin/slurm-microvm-agent $(DESTDIR)$(LIBEXECDIR)/slurm-microvm-agent
	$(INSTALL) -m 0755 bin/spank_microvm.so $(DESTDIR)$(SPANKDIR)/spank_microvm.so
	test -e $(DESTDIR)$(SYSCONFDIR)/microvm.toml || $(INSTALL) -m 0644 etc/microvm.toml $(DESTDIR)$(SYSCONFDIR)/microvm.toml

# Manual pages, build outputs (not committed): slurm-microvm(1) and one
# page per command from the CLI itself (urfave/cli ToMan), spank-microvm(8)
# from spank/args.c's option table (spank/manpage).
man: build
	rm -rf bin/man
	bin/slurm-microvm man --dir bin/man
	$(GO) run ./spank/manpage -args spank/args.c -o bin/man/spank-microvm.8

# The Debian package (nFPM as a library, hack/mkdeb: its own module). Paths
# are Debian's /usr, not PREFIX; see hack/mkdeb/doc.go.
deb: build man
	cd hack/mkdeb && $(GO) run . -repo $(CURDIR) -version $(DEB_VERSION) -mtime $(SOURCE_DATE_EPOCH) -o $(CURDIR)/bin/slurm-microvm_$(DEB_VERSION)_amd64.deb

assets: install
	$(DESTDIR)$(BINDIR)/slurm-microvm assets

# Unit and integration tests run in parallel packages; the Slurm end-to-end
# tests (test/e2e), the package's install/step/purge (test/pkg: it installs
# into the real system) and the proof of concept (test/poc) each start the
# local cluster and run one package after the other.
test: lint build
	$(TESTSUM) $(GO) test -json -count=1 $(TESTFLAGS) $$($(GO) list ./... | grep -v -e /test/e2e -e /test/poc -e /test/pkg -e /test/cgroupv2)
	$(TESTSUM) $(GO) test -json -count=1 -timeout 10m $(TESTFLAGS) ./test/pkg/
	$(TESTSUM) $(GO) test -json -count=1 -tags smv_faults $(TESTFLAGS) ./launcher/fault/
	$(TESTSUM) $(GO) test -json -count=1 -timeout 40m $(TESTFLAGS) ./test/e2e/
	$(TESTSUM) $(GO) test -json -count=1 -timeout 30m $(TESTFLAGS) ./test/cgroupv2/
	$(TESTSUM) $(GO) test -json -count=1 -timeout 60m $(TESTFLAGS) ./test/poc/

# The proof of concept on the local one-node cluster (test/poc TestPOC):
# `slurm-microvm poc` as two test accounts, every check must PASS (GPU
# checks on the stand-in GRES); the report is kept in $(POC_REPORT).
POC_REPORT ?= $(CURDIR)/poc-report
poc: build
	SMV_POC_REPORT=$(POC_REPORT) $(GO) test -count=1 -timeout 60m -run 'TestPOC$$' -v ./test/poc/

unit:
	$(GO) test -count=1 -short $(TESTFLAGS) ./...
	$(GO) test -count=1 -short -tags smv_faults $(TESTFLAGS) ./launcher/fault/

# Side by side in one run each: step launch vs a bare boot, MPI ping-pong
# in one VM vs on the host, and host shares (9p and virtio-fs variants) in
# the guest vs on the host (BenchmarkShares: about 15 minutes under TCG).
# The figures go to $(BENCH_JSON) too, and the README's measurements are
# regenerated from it (test/bench/benchdoc).
BENCH_JSON ?= bin/bench.json
bench: build
	SMV_BENCH_JSON=$(abspath $(BENCH_JSON)) $(GO) test -count=1 -timeout 90m -run XXX -bench . -benchtime 1x ./test/bench/ -v
	$(GO) run ./test/bench/benchdoc -report $(BENCH_JSON) -readme README.md

demo:
	bash hack/demo.sh

demo-down:
	bash hack/demo.sh down

fmt:
	gofmt -l -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...
	$(GO) vet -tags smv_faults,smv_gpu_standin ./launcher/...
	cd hack/mkdeb && $(GO) vet ./...

lint: vet
	$(STATICCHECK) ./... $(if $(filter 1,$(LINT_REPORT_ONLY)),|| echo "lint: staticcheck findings above (LINT_REPORT_ONLY=1: not failing)")

clean:
	rm -rf bin
	$(MAKE) -C spank clean
