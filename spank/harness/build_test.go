package harness

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
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

// The plugin runs inside slurmstepd as root: it is built with full RELRO
// and immediate binding (the GOT is read-only once loaded), a stack
// protector and fortified libc calls. Read from the built .so itself.
func TestHardenedBuild(t *testing.T) {
	so := buildPlugin(t)
	f, err := elf.Open(so)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	if f.Type != elf.ET_DYN {
		t.Errorf("%s is %v, want a shared object", so, f.Type)
	}
	relro := false
	for _, p := range f.Progs {
		if p.Type == elf.PT_GNU_RELRO {
			relro = true
		}
	}
	if !relro {
		t.Error("no PT_GNU_RELRO segment: link with -Wl,-z,relro")
	}
	flags, err := f.DynValue(elf.DT_FLAGS)
	if err != nil {
		t.Fatal(err)
	}
	flags1, err := f.DynValue(elf.DT_FLAGS_1)
	if err != nil {
		t.Fatal(err)
	}
	now := false
	for _, v := range flags {
		now = now || v&uint64(elf.DF_BIND_NOW) != 0
	}
	for _, v := range flags1 {
		now = now || v&uint64(elf.DF_1_NOW) != 0
	}
	if !now {
		t.Errorf("neither DT_FLAGS BIND_NOW nor DT_FLAGS_1 NOW (DT_FLAGS %#x, DT_FLAGS_1 %#x): link with -Wl,-z,now", flags, flags1)
	}
	if textrel, _ := f.DynValue(elf.DT_TEXTREL); len(textrel) > 0 {
		t.Error("DT_TEXTREL: the plugin is not position-independent")
	}

	syms, err := f.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var chk []string
	stackChk := false
	for _, s := range syms {
		switch {
		case s.Name == "__stack_chk_fail":
			stackChk = true
		case strings.HasPrefix(s.Name, "__") && strings.HasSuffix(s.Name, "_chk"):
			chk = append(chk, s.Name)
		}
	}
	// remote.c keeps char buffers on the stack (spank_getenv), so a
	// -fstack-protector-strong build imports __stack_chk_fail.
	if !stackChk {
		t.Error("no __stack_chk_fail import: build with -fstack-protector-strong")
	}
	// snprintf/vasprintf into fixed buffers are fortified by
	// _FORTIFY_SOURCE=2 (-O2) into __*_chk variants.
	if len(chk) == 0 {
		t.Error("no __*_chk import: build with -D_FORTIFY_SOURCE=2 -O2")
	}
	t.Logf("fortified imports: %q", chk)
}

// makeVars evaluates variables of ../../dirs.mk, the one definition of
// every install location.
func makeVars(t *testing.T, names ...string) map[string]string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		prereq.Tools(t, "make")
	}
	var rule strings.Builder
	rule.WriteString("show:\n")
	for _, n := range names {
		fmt.Fprintf(&rule, "\t@echo '%s=$(%s)'\n", n, n)
	}
	cmd := exec.Command("make", "--no-print-directory", "-s", "-f", filepath.Join(spankDir, "..", "dirs.mk"), "-f", "-", "show")
	cmd.Stdin = strings.NewReader(rule.String())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make dirs.mk: %v", err)
	}
	vars := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(l, "=")
		vars[k] = v
	}
	return vars
}

// Every place that names an install location agrees with dirs.mk: both
// Makefiles' install targets, etc/plugstack.conf, spank/README.md, the
// plugin's built-in defaults and the launcher's default agent path.
func TestInstallPathsAgree(t *testing.T) {
	v := makeVars(t, "SPANKDIR", "BINDIR", "LIBEXECDIR", "SYSCONFDIR")
	plugin := v["SPANKDIR"] + "/spank_microvm.so"
	launcherPath := v["BINDIR"] + "/slurm-microvm"
	configPath := v["SYSCONFDIR"] + "/microvm.toml"
	agentPath := v["LIBEXECDIR"] + "/slurm-microvm-agent"

	dest := t.TempDir()
	for _, mk := range []struct{ dir, target string }{{spankDir, "install"}, {filepath.Join(spankDir, ".."), "install"}} {
		out, err := exec.Command("make", "--no-print-directory", "-n", "-C", mk.dir, "DESTDIR="+dest, mk.target).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n -C %s %s: %v\n%s", mk.dir, mk.target, err, out)
		}
		if !strings.Contains(string(out), " "+dest+plugin) {
			t.Errorf("make -C %s install does not install the plugin as %s:\n%s", mk.dir, plugin, out)
		}
	}

	so, line, _ := plugstackConf(t)
	if so != plugin {
		t.Errorf("etc/plugstack.conf loads %s, make install puts the plugin at %s", so, plugin)
	}
	if want := []string{"launcher=" + launcherPath, "config=" + configPath}; !slices.Equal(line, want) {
		t.Errorf("etc/plugstack.conf arguments %q, want %q", line, want)
	}
	readme, err := os.ReadFile(filepath.Join(spankDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	confLine := "required " + so + " " + strings.Join(line, " ")
	if !strings.Contains(string(readme), confLine+"\n") {
		t.Errorf("spank/README.md does not show etc/plugstack.conf's line %q", confLine)
	}

	h := NewHost(Job{Context: CtxLocal})
	h.Call(HookInit, -1)
	c := h.Config()
	if c.Launcher != launcherPath || c.Exec != launcherPath+"-exec" || c.Config != configPath {
		t.Errorf("plugin defaults %+v, want launcher %s, exec %s-exec, config %s (dirs.mk)", c, launcherPath, launcherPath, configPath)
	}
	if got := config.Defaults().QEMU.Agent; got != agentPath {
		t.Errorf("launcher's default agent %s, make install puts it at %s", got, agentPath)
	}
}
