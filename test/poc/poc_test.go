// Package poc runs `slurm-microvm poc` against the local test cluster
// (`make poc`): every check must pass there, the HTML report must render,
// and each kind of check must FAIL against a deliberately broken build.
package poc

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/fault"
	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// SecondUser is the poc's tenant B on the local cluster (tenant A is
// cluster.TestUser).
const SecondUser = "microvmtest2"

// setup starts the one-node cluster with the stand-in GPUs' driver, a
// second test account, and a mount policy that lets each account mount
// its home and write its poc tree (what a site's policy would allow).
func setup(t *testing.T) *harness.Env {
	t.Helper()
	e := harness.Setup(t)
	harness.InstallStandinDriver(t, e)
	ensureUser(t, SecondUser)
	b, err := os.ReadFile(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	conf := regexp.MustCompile(`(?m)^allowed = \[(.*)\]$`).ReplaceAllString(string(b), `allowed = [$1, "$$HOME"]`)
	conf = regexp.MustCompile(`(?m)^writable = \[(.*)\]$`).ReplaceAllString(conf, `writable = [$1, "$$HOME/.slurm-microvm-poc"]`)
	if err := os.WriteFile(e.Config, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return e
}

func ensureUser(t *testing.T, name string) {
	t.Helper()
	if _, err := user.Lookup(name); err == nil {
		return
	}
	if out, err := exec.Command("useradd", "-m", "-s", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("userdel", "-r", name).Run() })
}

// runPOC runs the installed launcher's poc as root with the cluster's
// environment and returns its stdout+stderr and exit code.
func runPOC(t *testing.T, e *harness.Env, report string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	argv := append([]string{"--config", e.Config, "poc", "--users", cluster.TestUser + "," + SecondUser,
		"--image", e.Image, "--gres", "gpu:standin:2", "--report", report, "--tmp-ignore", os.Getenv("SMV_RESIDUE_TMP_IGNORE")}, args...)
	cmd := exec.CommandContext(ctx, e.Launcher, argv...)
	cmd.Env = e.C.Env()
	// Streamed as it runs (a whole poc takes minutes) and kept.
	var buf bytes.Buffer
	cmd.Stdout = io.MultiWriter(&buf, os.Stderr)
	cmd.Stderr = cmd.Stdout
	err := cmd.Run()
	out := buf.Bytes()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("poc: %v\n%s", err, out)
	}

	return string(out), code
}

var checkLine = regexp.MustCompile(`(?m)^(PASS|FAIL|SKIP) (\S+): `)

// verdicts maps each check id in out to its verdict.
func verdicts(out string) map[string]string {
	v := map[string]string{}
	for _, m := range checkLine.FindAllStringSubmatch(out, -1) {
		v[m[2]] = m[1]
	}
	return v
}

// TestPOC is `make poc`: the whole proof on the local one-node cluster,
// every check PASS (GPU checks on the stand-in GRES), nothing left.
func TestPOC(t *testing.T) {
	e := setup(t)
	e.NothingLeft(t)
	dir := t.TempDir()
	// SMV_POC_REPORT=DIR keeps the report there (make poc).
	if d := os.Getenv("SMV_POC_REPORT"); d != "" {
		dir = d
	}
	// SMV_POC_CHECKS=PREFIX,... runs only those checks (to work on one).
	var args []string
	only := os.Getenv("SMV_POC_CHECKS")
	if only != "" {
		args = append(args, "--checks", only)
	}
	out, code := runPOC(t, e, dir, args...)
	ids, _ := exec.Command(e.Launcher, "poc", "--list").Output()
	v := verdicts(out)
	for _, id := range strings.Fields(string(ids)) {
		if only != "" && !hasPrefix(id, strings.Split(only, ",")) {
			continue
		}
		if v[id] != "PASS" {
			t.Errorf("check %s: %q, want PASS", id, v[id])
		}
	}
	if code != 0 {
		t.Errorf("poc exited %d, want 0", code)
	}
	if !regexp.MustCompile(`(?m)^\d+ passed, 0 failed, 0 skipped$`).MatchString(out) {
		t.Errorf("no closing line 'N passed, 0 failed, 0 skipped'")
	}
	for _, f := range []string{"report.json", "report.html"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	for _, u := range []string{cluster.TestUser, SecondUser} {
		pu, _ := user.Lookup(u)
		if pu != nil {
			if _, err := os.Stat(filepath.Join(pu.HomeDir, ".slurm-microvm-poc")); err == nil {
				t.Errorf("%s: the poc's tree is left in %s's home", u, u)
			}
		}
	}
}

func hasPrefix(id string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(id, p) {
			return true
		}
	}
	return false
}

// switchOn turns smv_faults behaviours on for every job (fault.Dir/all)
// until the test ends. The directory and file are readable by all (still
// root's, written by no one else): log-env is read by the exec entry,
// which runs as the job's user.
func switchOn(t *testing.T, stages ...fault.Stage) {
	t.Helper()
	if err := os.MkdirAll(fault.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(fault.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, s := range stages {
		b.WriteString(string(s) + "\n")
	}
	all := filepath.Join(fault.Dir, "all")
	if err := os.WriteFile(all, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.Remove(all)
		_ = os.Remove(fault.Dir)
	})
}

// whenJobRuns calls f once a job of the poc is running (squeue lists
// one), in the background; it returns a function that waits for it.
func whenJobRuns(t *testing.T, e *harness.Env, f func()) func() {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		deadline := time.Now().Add(5 * time.Minute)
		for time.Now().Before(deadline) {
			out, _ := e.C.Squeue(context.Background(), "-h", "-t", "RUNNING", "-o", "%j")
			if strings.Contains(out, "smv-poc-") {
				f()
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return func() { <-done }
}

// TestPOCCanFail: against deliberately broken builds and a broken node
// (smv_faults behaviours; a leftover process the test plants; a drained
// node), the checks that must see it FAIL, and the poc exits 1.
func TestPOCCanFail(t *testing.T) {
	e := setup(t)
	for _, tc := range []struct {
		name   string
		checks string
		on     []fault.Stage
		during func(t *testing.T) func() // started once a poc job runs; returns its undo
		fail   []string
	}{
		{name: "shares exported read-write", checks: "isolation.files", on: []fault.Stage{fault.ShareRW}, fail: []string{"isolation.files"}},
		{name: "the environment leaked", checks: "isolation.credentials,diagnosis.no-tenant-data", on: []fault.Stage{fault.LogEnv},
			fail: []string{"isolation.credentials", "diagnosis.no-tenant-data"}},
		{name: "state left at stop", checks: "fault.exit-0", on: []fault.Stage{fault.LeakState}, fail: []string{"fault.exit-0"}},
		{name: "a leftover process", checks: "fault.exit-n", fail: []string{"fault.exit-n"}, during: func(t *testing.T) func() {
			// A process of a program the residue check watches, new
			// since the check's snapshot.
			fake := filepath.Join(t.TempDir(), "qemu-system-x86_64")
			if err := exec.Command("cp", "/bin/sleep", fake).Run(); err != nil {
				t.Error(err)
				return func() {}
			}
			p := exec.Command(fake, "300")
			if err := p.Start(); err != nil {
				t.Error(err)
				return func() {}
			}
			return func() { _ = p.Process.Kill(); _ = p.Wait() }
		}},
		{name: "a drained node", checks: "fault.exit-0", fail: []string{"fault.exit-0"}, during: func(t *testing.T) func() {
			node := e.Nodes()[0]
			if _, _, _, err := e.C.Run(context.Background(), "", "scontrol", "update", "nodename="+node, "state=drain", "reason=poc-can-fail"); err != nil {
				t.Error(err)
			}
			return func() {
				_, _, _, _ = e.C.Run(context.Background(), "", "scontrol", "update", "nodename="+node, "state=resume")
			}
		}},
	} {
		e.Run(t, tc.name, func(t *testing.T) {
			if len(tc.on) > 0 {
				switchOn(t, tc.on...)
			}
			var undo func()
			wait := func() {}
			if tc.during != nil {
				wait = whenJobRuns(t, e, func() { undo = tc.during(t) })
			}
			out, code := runPOC(t, e, t.TempDir(), "--checks", tc.checks)
			wait()
			if undo != nil {
				undo()
			}
			v := verdicts(out)
			for _, id := range tc.fail {
				if v[id] != "FAIL" {
					t.Errorf("check %s: %q against %s, want FAIL", id, v[id], tc.name)
				}
			}
			if code != 1 {
				t.Errorf("poc exited %d, want 1", code)
			}
			cleanBroken(t, e)
		})
	}
}

// cleanBroken removes what the broken builds left on purpose (state
// directories kept by leak-state, the environment files of log-env), so
// that the residue check of e.Run sees only what the poc itself left.
func cleanBroken(t *testing.T, e *harness.Env) {
	t.Helper()
	left, _ := filepath.Glob("/tmp/slurm-microvm-env-*")
	for _, p := range left {
		_ = os.Remove(p)
	}
	entries, _ := os.ReadDir(harness.RuntimeDir)
	for _, en := range entries {
		if en.Name() != "stopped" {
			_ = os.RemoveAll(filepath.Join(harness.RuntimeDir, en.Name()))
		}
	}
}

// TestPOCInterrupted: a poc stopped with SIGINT while its job runs
// cancels its jobs and removes its files, and says it was interrupted
// (exit 130); nothing is left on the node (e.Run).
func TestPOCInterrupted(t *testing.T) {
	e := setup(t)
	e.Run(t, "interrupted mid-check", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, e.Launcher, "--config", e.Config, "poc", "--users", cluster.TestUser+","+SecondUser,
			"--image", e.Image, "--report", t.TempDir(), "--checks", "fault.agent-hung")
		cmd.Env = e.C.Env()
		var buf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &buf, &buf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var job string
		for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline) && job == ""; time.Sleep(200 * time.Millisecond) {
			out, _ := e.C.Squeue(context.Background(), "-h", "-t", "RUNNING", "-o", "%i %j")
			for _, l := range strings.Split(out, "\n") {
				if f := strings.Fields(l); len(f) == 2 && strings.HasPrefix(f[1], "smv-poc-") {
					job = f[0]
				}
			}
		}
		if job == "" {
			t.Fatalf("no poc job ran:\n%s", buf.String())
		}
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		t.Logf("poc:\n%s", buf.String())
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
			t.Errorf("poc interrupted: %v, want exit 130", err)
		}
		if out, _ := e.C.Squeue(context.Background(), "-h", "-j", job, "-o", "%T"); strings.TrimSpace(out) != "" {
			t.Errorf("job %s is still %s after the poc ended", job, out)
		}
		for _, u := range []string{cluster.TestUser, SecondUser} {
			if pu, _ := user.Lookup(u); pu != nil {
				if _, err := os.Stat(filepath.Join(pu.HomeDir, ".slurm-microvm-poc")); err == nil {
					t.Errorf("the poc's files are left in %s's home", u)
				}
			}
		}
	})
}
