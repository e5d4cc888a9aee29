package pkg

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

const (
	pkgName = "slurm-microvm"
	conf    = "/etc/slurm/microvm.toml"
	// savedSuffix names a path moved aside for the test.
	savedSuffix = ".smv-pkg-test-saved"
)

// stateDirs are the directories the launcher creates at the package
// config's defaults; postrm removes them (hack/mkdeb/doc.go): the first
// two at remove, scratchBase (kept scratch is the users' data) and logDir
// at purge only.
var (
	stateDirs   = []string{"/var/cache/slurm-microvm", "/run/slurm-microvm", "/var/lib/slurm-microvm"}
	scratchBase = "/var/lib/slurm-microvm"
	logDir      = "/var/log/slurm-microvm"
)

func run(t *testing.T, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// installed reports whether dpkg knows the package in any state but
// not-installed (config-files included: a removed, unpurged package).
func installed(t *testing.T) bool {
	t.Helper()
	out, err := exec.Command("dpkg-query", "-W", "-f=${db:Status-Status}", pkgName).Output()
	return err == nil && strings.TrimSpace(string(out)) != "not-installed" && strings.TrimSpace(string(out)) != ""
}

// TestPackageInstallStepPurge: make deb, dpkg -i, one srun --microvm step
// through the package's plugin and config, dpkg -r (only the conffile and
// logs stay), dpkg -P (nothing stays).
func TestPackageInstallStepPurge(t *testing.T) {
	if testing.Short() {
		prereq.OptIn(t, "-short: installs a package and boots a microVM")
	}
	prereq.Root(t, "dpkg -i into the system")
	prereq.Tools(t, "dpkg", "dpkg-deb", "dpkg-query", "make", "cc", "qemu-system-x86_64", "mkfs.erofs", "busybox", "srun", "slurmd")
	if installed(t) {
		t.Fatalf("%s is installed on this machine already: the test installs and purges it (dpkg -P %s first)", pkgName, pkgName)
	}
	repo := fixture.RepoRoot()
	t0 := time.Now()
	phase := func(name string) {
		t.Logf("%s: %.1f s", name, time.Since(t0).Seconds())
		t0 = time.Now()
	}

	// Build it.
	version := "0~pkgtest"
	deb := filepath.Join(repo, "bin", pkgName+"_"+version+"_amd64.deb")
	if out, err := run(t, nil, "make", "-C", repo, "deb", "DEB_VERSION="+version); err != nil {
		t.Fatalf("make deb: %v", err)
	} else if _, err := os.Stat(deb); err != nil {
		t.Fatalf("make deb wrote no %s: %v\n%s", deb, err, out)
	}
	t.Cleanup(func() { os.Remove(deb) })
	phase("make deb")
	contents, err := exec.Command("dpkg-deb", "-c", deb).Output()
	if err != nil {
		t.Fatalf("dpkg-deb -c: %v", err)
	}
	var files []string
	for _, line := range strings.Split(string(contents), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || strings.HasPrefix(f[0], "d") {
			continue
		}
		files = append(files, strings.TrimPrefix(f[5], "."))
	}
	if len(files) < 5 {
		t.Fatalf("dpkg-deb -c lists %d files:\n%s", len(files), contents)
	}

	// Move aside what is there (make install's plugin and config, a cache),
	// purge and restore at the end, failed or not.
	var saved []string
	for _, p := range append(append(append([]string{}, files...), stateDirs...), logDir) {
		if _, err := os.Lstat(p); err == nil {
			if err := os.Rename(p, p+savedSuffix); err != nil {
				t.Fatalf("move %s aside: %v", p, err)
			}
			saved = append(saved, p)
		}
	}
	t.Cleanup(func() {
		if installed(t) {
			if _, err := run(t, []string{"SLURM_MICROVM_REMOVE_RUNNING=1"}, "dpkg", "--purge", pkgName); err != nil {
				t.Errorf("restore: purge: %v", err)
			}
		}
		for _, p := range saved {
			if err := os.RemoveAll(p); err != nil {
				t.Errorf("restore %s: %v", p, err)
			}
			if err := os.Rename(p+savedSuffix, p); err != nil {
				t.Errorf("restore %s: %v", p, err)
			}
		}
	})
	existed := map[string]bool{}
	for _, p := range append(append([]string{}, files...), stateDirs...) {
		for d := p; d != "/"; d = filepath.Dir(d) {
			if _, err := os.Lstat(d); err == nil {
				existed[d] = true
			}
		}
	}

	// Install: dependencies are there (hack/setup-debian.sh), so dpkg -i
	// alone must succeed, and postinst prints the plugstack.conf line.
	out, err := run(t, []string{"DEBIAN_FRONTEND=noninteractive"}, "dpkg", "-i", deb)
	if err != nil {
		t.Fatalf("install: %v", err)
	}
	var plug string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "required ") {
			plug = strings.TrimSpace(line)
		}
	}
	if plug == "" {
		t.Fatalf("dpkg -i printed no plugstack.conf line (\"required ...\"):\n%s", out)
	}
	dpkgL, err := run(t, nil, "dpkg", "-L", pkgName)
	if err != nil {
		t.Fatal(err)
	}
	var owned []string
	for _, p := range strings.Split(strings.TrimSpace(dpkgL), "\n") {
		if p = strings.TrimSpace(p); p != "" && p != "/." {
			owned = append(owned, p)
		}
	}
	phase("dpkg -i")
	if _, err := run(t, nil, "/usr/bin/slurm-microvm", "config", "check"); err != nil {
		t.Fatalf("the package's config: %v", err)
	}
	if _, err := run(t, nil, "/usr/bin/slurm-microvm", "assets"); err != nil {
		t.Fatalf("assets: %v", err)
	}

	phase("config check, assets")

	// One step through the package's plugin, launcher, agent and config.
	imgDir := filepath.Join(cluster.BaseDir, "pkg")
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(imgDir) })
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	name := "Microvm Package Busybox"
	fixture.BusyboxRootfs(t, rootfs, name)
	img := filepath.Join(imgDir, "busybox.tar")
	fixture.OCIArchive(t, rootfs, img, "microvm-pkg/busybox:1", v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, WorkingDir: "/"})
	if err := os.Chmod(img, 0o644); err != nil {
		t.Fatal(err)
	}
	c := cluster.Up(t, cluster.Options{PlugstackLine: plug, StartTimeout: 90 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	stdout, stderr, code, err := c.Srun(ctx, cluster.TestUser, "-n1", "--mem=768M", "--microvm="+img, "cat", "/etc/os-release")
	if err != nil || code != 0 || !strings.Contains(stdout, name) {
		t.Fatalf("srun --microvm through the package: exit %d, err %v\nstdout: %s\nstderr: %s\nslurmd: %s", code, err, stdout, stderr, c.LogTail("slurmd", 30))
	}
	phase("cluster up, srun --microvm step")
	if err := c.Down(); err != nil {
		t.Fatalf("cluster down: %v", err)
	}

	// Remove: only the conffile (and the step logs) stay.
	// A step's kept scratch (keep_scratch) is the user's data: remove
	// keeps it, purge does not.
	if err := os.MkdirAll(filepath.Join(scratchBase, "scratch", "kept"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, nil, "dpkg", "--remove", pkgName); err != nil {
		t.Fatalf("remove: %v", err)
	}
	for _, p := range owned {
		if _, err := os.Lstat(p); err == nil && !existed[p] && p != conf {
			t.Errorf("after dpkg --remove: %s remains", p)
		}
	}
	if _, err := os.Stat(conf); err != nil {
		t.Errorf("after dpkg --remove: the admin's %s is gone: %v", conf, err)
	}
	for _, d := range stateDirs {
		if _, err := os.Lstat(d); err == nil && d != scratchBase {
			t.Errorf("after dpkg --remove: %s remains", d)
		}
	}
	if _, err := os.Stat(filepath.Join(scratchBase, "scratch", "kept")); err != nil {
		t.Errorf("after dpkg --remove: a kept scratch directory is gone (users' data): %v", err)
	}

	// Purge: nothing stays.
	if _, err := run(t, nil, "dpkg", "--purge", pkgName); err != nil {
		t.Fatalf("purge: %v", err)
	}
	for _, p := range append(append(owned, stateDirs...), logDir) {
		if _, err := os.Lstat(p); err == nil && !existed[p] {
			t.Errorf("after dpkg --purge: %s remains", p)
		}
	}
	if installed(t) {
		t.Errorf("dpkg still lists %s after the purge", pkgName)
	}
	phase("cluster down, dpkg -r, dpkg -P")
}

// prerm is the package's prerm script.
func prerm() string {
	return filepath.Join(fixture.RepoRoot(), "hack", "mkdeb", "scripts", "prerm")
}

// TestPrermRefusesRunningSteps: removal is refused while a step's
// supervisor (pid and start time as launcher/state records them) is
// alive, allowed once it is gone or its pid was reused, on upgrade, and
// with SLURM_MICROVM_REMOVE_RUNNING=1.
func TestPrermRefusesRunningSteps(t *testing.T) {
	prereq.Tools(t, "sh", "awk", "sed", "sleep")
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleep.Process.Kill(); sleep.Wait() })
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", sleep.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	start := fields[19]
	for _, tc := range []struct {
		name       string
		supervisor string // "" for no step directory
		arg        string
		env        []string
		refuse     bool
		literal    bool // runtime_dir as a TOML literal string ('...')
	}{
		{"running step", fmt.Sprintf("%d %s\n", sleep.Process.Pid, start), "remove", nil, true, false},
		{"running step, runtime_dir a literal string", fmt.Sprintf("%d %s\n", sleep.Process.Pid, start), "remove", nil, true, true},
		{"pid reused", fmt.Sprintf("%d %s1\n", sleep.Process.Pid, start), "remove", nil, false, false},
		{"supervisor gone", "999999999 1\n", "remove", nil, false, false},
		{"no steps", "", "remove", nil, false, false},
		{"upgrade", fmt.Sprintf("%d %s\n", sleep.Process.Pid, start), "upgrade", nil, false, false},
		{"forced", fmt.Sprintf("%d %s\n", sleep.Process.Pid, start), "remove", []string{"SLURM_MICROVM_REMOVE_RUNNING=1"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rt := filepath.Join(dir, "run")
			if err := os.MkdirAll(filepath.Join(rt, "stopped"), 0o700); err != nil {
				t.Fatal(err)
			}
			if tc.supervisor != "" {
				step := filepath.Join(rt, "7.0.0.node1")
				if err := os.Mkdir(step, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(step, "supervisor"), []byte(tc.supervisor), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cfg := filepath.Join(dir, "microvm.toml")
			value := strconv.Quote(rt)
			if tc.literal {
				value = "'" + rt + "'"
			}
			if err := os.WriteFile(cfg, []byte("runtime_dir = "+value+"\n[qemu]\nruntime_dir = \"/elsewhere\"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("sh", prerm(), tc.arg)
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "SLURM_MICROVM_CONFIG=" + cfg}, tc.env...)
			out, err := cmd.CombinedOutput()
			if tc.refuse {
				if err == nil || !strings.Contains(string(out), "7.0.0.node1") {
					t.Fatalf("prerm %s: want refusal naming the step, got err %v:\n%s", tc.arg, err, out)
				}
				return
			}
			if err != nil {
				t.Fatalf("prerm %s: %v\n%s", tc.arg, err, out)
			}
		})
	}
}

// TestDemoDownRemovesOnlyRecorded: `hack/demo.sh down` (make demo-down)
// stops nothing it did not start (no cluster state: down.sh has nothing to
// stop), removes its own record directory, and leaves alone a recorded
// path that is not one the demo makes.
func TestDemoDownRemovesOnlyRecorded(t *testing.T) {
	prereq.Root(t, "hack/demo.sh runs as root")
	prereq.Tools(t, "bash", "awk")
	dir := t.TempDir()
	demo := filepath.Join(dir, "demo")
	if err := os.Mkdir(demo, 0o755); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(demo, "installed"), []byte("path "+victim+"\ngo /opt/not-the-demos-go\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", filepath.Join(fixture.RepoRoot(), "hack", "demo.sh"), "down")
	cmd.Env = append(os.Environ(), "SMV_DEMO_DIR="+demo, "SMV_DEMO_STATE="+filepath.Join(dir, "state"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo.sh down: %v\n%s", err, out)
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("demo.sh down removed %s, a path it does not make: %v\n%s", victim, err, out)
	}
	if _, err := os.Stat(demo); err == nil {
		t.Errorf("demo.sh down left its record directory %s\n%s", demo, out)
	}
	if !strings.Contains(string(out), "left alone") {
		t.Errorf("demo.sh down did not say it left %s alone:\n%s", victim, out)
	}
}
