package assets

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// The boot tests need QEMU and Debian's kernel; they skip with the reason
// when either is missing. Each boot runs under a timeout: a hung TCG boot is
// a silent QEMU at 100% CPU, killed by its pid.

const bootMarker = "MICROVM-INIT-OK "

// needBootPrereqs skips the test unless QEMU and a kernel with modules exist.
func needBootPrereqs(t testing.TB) (qemu, kernel string) {
	t.Helper()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		prereq.Missing(t, "qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
	}
	kernel, err = NewestKernel(DefaultBootDir, DefaultModulesRoot)
	if err != nil {
		prereq.Missing(t, "no guest kernel: %v (apt-get install linux-image-amd64)", err)
	}
	return qemu, kernel
}

// buildTestInit builds testdata/testinit as a static binary and returns its path.
func buildTestInit(t testing.TB) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "testinit")
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "./testdata/testinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build test init: %v\n%s", err, b)
	}
	return out
}

// bootResult is what one boot showed.
type bootResult struct {
	Console   string        // everything QEMU wrote (serial console)
	FirstLine time.Duration // from QEMU's start to the first console line
	RunInit   time.Duration // from QEMU's start to the kernel's "Run /init"
	ToMarker  time.Duration // from QEMU's start to the marker line
	ToExit    time.Duration // from QEMU's start to its exit
	ExitError error         // QEMU's exit status (nil: exit 0)
}

// bootOpts is one QEMU invocation.
type bootOpts struct {
	Machine string   // -M value
	Append  []string // kernel command line
	Timeout time.Duration
}

// bootMicroVM boots kernel+initrd under TCG with the serial console on a
// pipe, returning once QEMU exits or the timeout kills it.
func bootMicroVM(t testing.TB, qemu string, a *Assets, o bootOpts) bootResult {
	t.Helper()
	if o.Machine == "" {
		o.Machine = "microvm,x-option-roms=off"
	}
	if o.Timeout == 0 {
		o.Timeout = 90 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu,
		"-M", o.Machine, "-accel", "tcg", "-m", "256", "-smp", "1",
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-serial", "stdio",
		"-kernel", a.Kernel, "-initrd", a.Initrd,
		"-append", strings.Join(o.Append, " "))
	cmd.Cancel = func() error { return cmd.Process.Kill() } // by pid, only our QEMU
	cmd.WaitDelay = 5 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	var res bootResult
	var console bytes.Buffer
	var mu sync.Mutex
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		br := bufio.NewReader(stdout)
		for {
			line, err := br.ReadString('\n')
			mu.Lock()
			console.WriteString(line)
			if res.FirstLine == 0 && line != "" {
				res.FirstLine = time.Since(start)
			}
			if res.RunInit == 0 && strings.Contains(line, "Run /init as init process") {
				res.RunInit = time.Since(start)
			}
			if res.ToMarker == 0 && strings.Contains(line, bootMarker) {
				res.ToMarker = time.Since(start)
			}
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	<-done
	res.ExitError = cmd.Wait()
	res.ToExit = time.Since(start)
	res.Console = console.String()
	if ctx.Err() != nil {
		res.ExitError = fmt.Errorf("qemu killed after %v (hung boot?): %w", o.Timeout, ctx.Err())
	}
	return res
}

// consoleLines returns the payloads of console lines starting with prefix.
func consoleLines(console, prefix string) []string {
	var out []string
	for _, l := range strings.Split(console, "\n") {
		l = strings.TrimRight(l, "\r")
		if i := strings.Index(l, prefix); i >= 0 {
			out = append(out, strings.TrimSpace(l[i+len(prefix):]))
		}
	}
	return out
}

func TestBootMicroVM(t *testing.T) {
	if testing.Short() {
		prereq.OptIn(t, "-short: boots a VM under TCG (several seconds)")
	}
	qemu, kernel := needBootPrereqs(t)
	agent := buildTestInit(t)
	cache := t.TempDir()
	for _, tc := range []struct {
		name        string
		compression InitrdCompression
		exit        string
	}{
		{"uncompressed/poweroff", InitrdUncompressed, "poweroff"},
		{"gzip/poweroff", InitrdGzip, "poweroff"},
		{"uncompressed/restart", InitrdUncompressed, "restart"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Ensure(context.Background(), Options{
				KernelImage: kernel, Agent: agent, CacheDir: cache, Compression: tc.compression,
			})
			if err != nil {
				t.Fatal(err)
			}
			res := bootMicroVM(t, qemu, a, bootOpts{
				Append: append(KernelCmdline("tcg"), "microvm_exit="+tc.exit),
			})
			if res.ExitError != nil || res.ToMarker == 0 {
				t.Fatalf("boot: exit %v, marker after %v; console:\n%s", res.ExitError, res.ToMarker, tail(res.Console, 4000))
			}
			if got := consoleLines(res.Console, bootMarker); !slices.Contains(got, a.KernelVersion) {
				t.Errorf("marker says %q, want kernel %q", got, a.KernelVersion)
			}
			if errs := consoleLines(res.Console, "MICROVM-INIT-ERROR"); len(errs) > 0 {
				t.Errorf("guest errors: %q", errs)
			}
			fss := consoleLines(res.Console, "MICROVM-FS ")
			for _, fs := range []string{"erofs", "overlay", "9p", "virtiofs"} {
				if !slices.Contains(fss, fs) {
					t.Errorf("guest /proc/filesystems lacks %s after loading modules: %q", fs, fss)
				}
			}
			t.Logf("%s: marker after %v, QEMU exited after %v", tc.name, res.ToMarker.Round(time.Millisecond), res.ToExit.Round(time.Millisecond))
		})
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// TestBootTimings measures boot-to-marker and marker-to-exit times, median
// of SLURM_MICROVM_BOOT_BENCH boots (e.g. 5) per variant. Variants are
// separated by ';' in SLURM_MICROVM_BOOT_VARIANTS, each
// "name|initrd|exit|machine|cmdline|padMB": cmdline is appended to
// KernelCmdline("tcg"), or replaces it when it starts with '='; padMB
// appends that many MiB of machine code (from the go command's binary) to
// the test init, to stand in for a full-size agent. The default compares
// gzip and uncompressed initramfs with a small and a 10 MiB /init.
func TestBootTimings(t *testing.T) {
	n := 0
	fmt.Sscan(os.Getenv("SLURM_MICROVM_BOOT_BENCH"), &n)
	if n <= 0 {
		prereq.OptIn(t, "set SLURM_MICROVM_BOOT_BENCH=5 to measure boot times")
	}
	qemu, kernel := needBootPrereqs(t)
	agent := buildTestInit(t)
	cache := t.TempDir()
	variants := os.Getenv("SLURM_MICROVM_BOOT_VARIANTS")
	if variants == "" {
		variants = "none/2.7MB-init|none|poweroff|||0;gzip/2.7MB-init|gzip|poweroff|||0;" +
			"none/10MB-init|none|poweroff|||7;gzip/10MB-init|gzip|poweroff|||7;none/restart|none|restart|||0"
	}
	type vr struct {
		name, initrd, exit, machine, extra string
		agent                              string
	}
	var vs []vr
	for _, v := range strings.Split(variants, ";") {
		f := strings.Split(v, "|")
		for len(f) < 6 {
			f = append(f, "")
		}
		pad := 0
		fmt.Sscan(f[5], &pad)
		vs = append(vs, vr{f[0], f[1], f[2], f[3], f[4], paddedAgent(t, agent, pad)})
	}
	times := map[string][][4]time.Duration{}
	// Interleave variants so that load from other work on the host spreads evenly.
	for i := 0; i < n; i++ {
		for _, v := range vs {
			a, err := Ensure(context.Background(), Options{KernelImage: kernel, Agent: v.agent, CacheDir: cache, Compression: InitrdCompression(v.initrd)})
			if err != nil {
				t.Fatal(err)
			}
			app := append(KernelCmdline("tcg"), "microvm_exit="+v.exit)
			if rest, ok := strings.CutPrefix(v.extra, "="); ok { // replace the recommended pieces
				app = append(strings.Fields(rest), "microvm_exit="+v.exit)
			} else if v.extra != "" {
				app = append(app, strings.Fields(v.extra)...)
			}
			res := bootMicroVM(t, qemu, a, bootOpts{Machine: v.machine, Append: app})
			if res.ExitError != nil || res.ToMarker == 0 {
				t.Fatalf("%s: exit %v; console:\n%s", v.name, res.ExitError, tail(res.Console, 3000))
			}
			times[v.name] = append(times[v.name], [4]time.Duration{res.ToMarker, res.ToExit - res.ToMarker, res.FirstLine, res.RunInit})
			if i == 0 {
				st, _ := os.Stat(a.Initrd)
				t.Logf("%s: initramfs %d bytes", v.name, st.Size())
			}
		}
	}
	for _, v := range vs {
		med := func(k int) time.Duration {
			var d []time.Duration
			for _, x := range times[v.name] {
				d = append(d, x[k])
			}
			slices.Sort(d)
			return d[len(d)/2].Round(time.Millisecond)
		}
		var m []time.Duration
		for _, x := range times[v.name] {
			m = append(m, x[0])
		}
		slices.Sort(m)
		t.Logf("%-20s boot-to-marker median %v (min %v max %v), marker-to-exit %v; first console line %v, Run /init %v",
			v.name, med(0), m[0].Round(time.Millisecond), m[len(m)-1].Round(time.Millisecond), med(1), med(2), med(3))
	}
}

// paddedAgent returns agent with padMB MiB of the go command's machine code
// appended (the kernel's exec ignores bytes after the ELF segments).
func paddedAgent(t testing.TB, agent string, padMB int) string {
	t.Helper()
	if padMB == 0 {
		return agent
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	code, err := os.ReadFile(goBin)
	if err != nil {
		t.Fatal(err)
	}
	base, _ := os.ReadFile(agent)
	out := filepath.Join(t.TempDir(), fmt.Sprintf("init-pad%d", padMB))
	if err := os.WriteFile(out, append(base, code[:min(len(code), padMB<<20)]...), 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}
