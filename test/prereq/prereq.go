// Package prereq is the one place where a test decides what to do when
// something it needs is not here. Every skip of the repository goes
// through it, so that CI (CI=true, where hack/setup-debian.sh installs
// every tool, library and mirror the tests use) cannot pass by skipping:
//
//   - Missing: a prerequisite CI installs (a tool, root, a host library,
//     Debian's mirror). Under CI=true the test fails; elsewhere it skips,
//     naming what is missing.
//   - Hardware: the test depends on hardware a CI machine may lack or
//     have (NVIDIA GPUs, NVML, KVM, a calibrated TSC). It skips everywhere.
//   - OptIn: the test runs only when asked (-short excludes it, an
//     environment variable opts in, a helper process re-executes the
//     binary). It skips everywhere.
//
// Design decision: one package with three verbs rather than a flag per
// call site. The alternative, t.Skip at each site with an `if CI` beside
// it, is what let helpers skip silently under CI before; TestNoBareSkip
// keeps any new bare skip out.
package prereq

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// CI reports whether the tests run under CI (CI=true), where every
// prerequisite that hack/setup-debian.sh installs must be present.
func CI() bool { return os.Getenv("CI") == "true" }

// Missing stops t because something CI installs is not here: it fails t
// under CI=true and skips it otherwise. The message names what is missing
// and how to get it.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("%s (CI=true: hack/setup-debian.sh installs it, so this fails instead of skipping)", msg)
	}
	t.Skip(msg)
}

// Tools stops t (see Missing) when any of tools is not on PATH.
func Tools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			Missing(t, "%s is missing (install it with hack/setup-debian.sh)", tool)
		}
	}
}

// Root stops t (see Missing) unless it runs as root; why says what needs
// it. CI runs the tests as root.
func Root(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root: %s", why)
	}
}

// Hardware skips t, under CI too: it depends on hardware this machine
// lacks or has (GPUs, NVML, KVM, TSC), which no setup script installs.
func Hardware(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Skipf("hardware: "+format, args...)
}

// OptIn skips t, under CI too: the test runs only when asked for (not
// under -short, an environment variable set, a helper re-execution).
func OptIn(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Skipf("opt-in: "+format, args...)
}
