// Package poc runs `slurm-microvm poc` against the local test cluster
// (`make poc`): every check must pass there, the HTML report must render,
// and each kind of check must FAIL against a deliberately broken build.
package poc

import (
	"context"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

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
		"--image", e.Image, "--gres", "gpu:standin:2", "--report", report}, args...)
	cmd := exec.CommandContext(ctx, e.Launcher, argv...)
	cmd.Env = append(e.C.Env(), "SMV_RESIDUE_TMP_IGNORE="+os.Getenv("SMV_RESIDUE_TMP_IGNORE"))
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("poc: %v\n%s", err, out)
	}
	t.Logf("poc %s:\n%s", strings.Join(args, " "), out)
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
