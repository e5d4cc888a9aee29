package harness

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestBuildRefusesTestTags: `make build` checks what it built with
// hack/no-test-tags.sh, which refuses (and removes) a launcher built with
// a test-only tag, however the tag got there (-tags or GOFLAGS), and
// passes the default build.
func TestBuildRefusesTestTags(t *testing.T) {
	if testing.Short() {
		prereq.OptIn(t, "-short: builds the launcher four times")
	}
	fixture.Require(t, "make", "go")
	repo := fixture.RepoRoot()
	dry, err := exec.Command("make", "--no-print-directory", "-n", "-C", repo, "build").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, dry)
	}
	if !strings.Contains(string(dry), "hack/no-test-tags.sh bin/slurm-microvm ") {
		t.Fatalf("make build does not check bin/slurm-microvm with hack/no-test-tags.sh:\n%s", dry)
	}
	tests := []struct {
		name    string
		args    []string // to go build
		goflags string
		refused string // the tag named, "" for accepted
	}{
		{"default", nil, "-trimpath", ""},
		{"tag smv_faults", []string{"-tags", "smv_faults"}, "-trimpath", "smv_faults"},
		{"GOFLAGS smv_faults", nil, "-trimpath -tags=smv_gpu_standin,smv_faults", "smv_faults"},
		{"tag smv_gpu_standin", []string{"-tags", "smv_gpu_standin"}, "-trimpath", "smv_gpu_standin"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "slurm-microvm")
			build := exec.Command("go", append(append([]string{"build"}, tc.args...), "-o", bin, "./cmd/slurm-microvm")...)
			build.Dir = repo
			build.Env = append(os.Environ(), "GOFLAGS="+tc.goflags)
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build: %v\n%s", err, out)
			}
			check := exec.Command("sh", "hack/no-test-tags.sh", bin)
			check.Dir = repo
			out, err := check.CombinedOutput()
			_, statErr := os.Stat(bin)
			if tc.refused == "" {
				if err != nil || statErr != nil {
					t.Fatalf("default build refused: %v (%v)\n%s", err, statErr, out)
				}
				return
			}
			if err == nil || !strings.Contains(string(out), "test-only tag "+tc.refused) {
				t.Fatalf("built with %s: check %v, output %q: want it refused naming the tag", tc.refused, err, out)
			}
			if !errors.Is(statErr, os.ErrNotExist) {
				t.Fatalf("refused binary %s still there (%v)", bin, statErr)
			}
		})
	}
}
