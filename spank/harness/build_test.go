package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// spankDir is the plugin's source directory.
const spankDir = ".."

// pluginSources lists spank/*.c.
func pluginSources(t *testing.T) []string {
	t.Helper()
	srcs, err := filepath.Glob(filepath.Join(spankDir, "*.c"))
	if err != nil || len(srcs) == 0 {
		t.Fatalf("no plugin sources in %s: %v", spankDir, err)
	}
	for i, s := range srcs {
		srcs[i] = filepath.Base(s)
	}
	return srcs
}

// The harness compiles the plugin through symlinks plugin_X.c -> ../X.c:
// the Go build cache hashes files of the package directory only, so an
// #include "../X.c" would leave tests running stale C.
func TestHarnessCompilesEveryPluginSource(t *testing.T) {
	srcs := pluginSources(t)
	for _, src := range srcs {
		link := "plugin_" + src
		target, err := os.Readlink(link)
		if err != nil {
			t.Errorf("%s: %v (add: ln -s ../%s %s)", link, err, src, link)
			continue
		}
		if target != "../"+src {
			t.Errorf("%s -> %s, want ../%s", link, target, src)
		}
	}
	wrappers, _ := filepath.Glob("plugin_*.c")
	for _, w := range wrappers {
		if !slices.Contains(srcs, strings.TrimPrefix(w, "plugin_")) {
			t.Errorf("%s has no plugin source", w)
		}
	}
	if target, err := os.Readlink("microvm.h"); err != nil || target != "../microvm.h" {
		t.Errorf("microvm.h must link to ../microvm.h: %q %v", target, err)
	}

	mk, err := os.ReadFile(filepath.Join(spankDir, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^SRCS\s*:=\s*(.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile has no SRCS := line")
	}
	mkSrcs := strings.Fields(string(m[1]))
	slices.Sort(mkSrcs)
	if !slices.Equal(mkSrcs, srcs) {
		t.Errorf("Makefile SRCS %q, want every spank/*.c %q", mkSrcs, srcs)
	}
}

// buildPlugin runs the Makefile into a temporary BUILDDIR.
func buildPlugin(t *testing.T, vars ...string) string {
	t.Helper()
	for _, tool := range []string{"make", "cc", "nm"} {
		if _, err := exec.LookPath(tool); err != nil {
			prereq.Missing(t, "%s not installed: %v", tool, err)
		}
	}
	dir := t.TempDir()
	args := append([]string{"-C", spankDir, "BUILDDIR=" + dir}, vars...)
	if out, err := exec.Command("make", args...).CombinedOutput(); err != nil {
		t.Fatalf("make %q: %v\n%s", args, err, out)
	}
	return filepath.Join(dir, "spank_microvm.so")
}

// nmSymbols runs nm -D with flag and returns the symbol names.
func nmSymbols(t *testing.T, so, flag string) []string {
	t.Helper()
	out, err := exec.Command("nm", "-D", flag, so).Output()
	if err != nil {
		t.Fatalf("nm -D %s %s: %v", flag, so, err)
	}
	var syms []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		syms = append(syms, line)
	}
	return syms
}

func TestSharedObjectExports(t *testing.T) {
	so := buildPlugin(t)

	var defined []string
	for _, line := range nmSymbols(t, so, "--defined-only") {
		f := strings.Fields(line)
		defined = append(defined, f[len(f)-1])
	}
	slices.Sort(defined)
	want := []string{
		"plugin_name", "plugin_type", "plugin_version",
		"slurm_spank_exit", "slurm_spank_init", "slurm_spank_init_post_opt",
		"slurm_spank_job_epilog", "slurm_spank_local_user_init",
		"slurm_spank_task_exit", "slurm_spank_task_init", "slurm_spank_task_post_fork",
		"spank_plugin_version",
	}
	if !slices.Equal(defined, want) {
		t.Errorf("nm -D --defined-only:\n got %q\nwant %q", defined, want)
	}

	// Anything undefined comes from glibc or from the Slurm process that
	// loads the plugin; no libslurm is linked in.
	for _, line := range nmSymbols(t, so, "--undefined-only") {
		f := strings.Fields(line)
		name := f[len(f)-1]
		switch {
		case f[0] == "w", strings.Contains(name, "@GLIBC_"):
		case strings.HasPrefix(name, "spank_"), strings.HasPrefix(name, "slurm_"):
		default:
			t.Errorf("undefined symbol %q from neither glibc nor Slurm", name)
		}
		if strings.HasPrefix(name, "spank_prepend_task_argv") {
			t.Errorf("22.05 build references %s (23.11+ only)", name)
		}
	}
	if out, err := exec.Command("make", "-C", spankDir, "BUILDDIR="+filepath.Dir(so), "check").CombinedOutput(); err != nil {
		t.Errorf("make check: %v\n%s", err, out)
	}
}

// On Slurm >= 23.11 the plugin prepends {launcher, "exec", "--"} with
// spank_prepend_task_argv instead of swapping argv[0]. Debian 12 ships
// 22.05, so the branch is compiled against a shim that claims 23.11 and
// declares the function as 23.11's spank.h does.
func TestBuildsAgainstSlurm2311API(t *testing.T) {
	shim := t.TempDir()
	if err := os.MkdirAll(filepath.Join(shim, "slurm"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"slurm/slurm_version.h": `#ifndef _SLURM_VERSION_H_
#define _SLURM_VERSION_H_
#define SLURM_VERSION_NUMBER 0x170b00
#define SLURM_VERSION_NUM(a,b,c) (((a) << 16) + ((b) << 8) + (c))
#define SLURM_VERSION_MAJOR(a)   (((a) >> 16) & 0xff)
#define SLURM_VERSION_MINOR(a)   (((a) >>  8) & 0xff)
#define SLURM_VERSION_MICRO(a)    ((a)        & 0xff)
#endif
`,
		"slurm/spank.h": `#include_next <slurm/spank.h>
extern spank_err_t spank_prepend_task_argv(spank_t spank, int argc, const char *argv[]);
`,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(shim, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	so := buildPlugin(t, "CPPFLAGS=-I"+shim)
	found := false
	for _, line := range nmSymbols(t, so, "--undefined-only") {
		if strings.HasSuffix(line, " spank_prepend_task_argv") {
			found = true
		}
	}
	if !found {
		t.Error("23.11 build does not call spank_prepend_task_argv")
	}
}
