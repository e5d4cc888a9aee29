package poc

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestSpecificationLinks: every poc check, test and benchmark that
// SPECIFICATION.md names exists, and every poc check is named there, so
// a promise never points at nothing.
func TestSpecificationLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	b, err := os.ReadFile(filepath.Join(root, "SPECIFICATION.md"))
	if err != nil {
		t.Fatal(err)
	}
	spec := string(b)
	ids := CheckIDs()
	for _, m := range regexp.MustCompile(`poc: ([a-z]+\.[a-z0-9*-]+)`).FindAllStringSubmatch(spec, -1) {
		id := m[1]
		if strings.HasSuffix(id, "*") {
			p := strings.TrimSuffix(id, "*")
			if !slices.ContainsFunc(ids, func(s string) bool { return strings.HasPrefix(s, p) }) {
				t.Errorf("SPECIFICATION.md names poc checks %s: none exists", id)
			}
		} else if !slices.Contains(ids, id) {
			t.Errorf("SPECIFICATION.md names poc check %s: no such check", id)
		}
	}
	// Backquoted check ids after a "poc:" reference: `fault.exit-n`.
	for _, id := range ids {
		if !strings.Contains(spec, id) && !strings.Contains(spec, strings.SplitN(id, ".", 2)[0]+".*") {
			t.Errorf("poc check %s is named nowhere in SPECIFICATION.md", id)
		}
	}
	out, err := exec.Command("git", "-C", root, "grep", "-h", "-o", "-E", `^func (Test|Benchmark)[A-Za-z0-9_]+`, "--", "*.go").Output()
	if err != nil {
		t.Fatalf("git grep: %v", err)
	}
	have := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		have[strings.TrimPrefix(l, "func ")] = true
	}
	for _, m := range regexp.MustCompile("`((?:Test|Benchmark)[A-Za-z0-9_]+)[`/]").FindAllStringSubmatch(spec, -1) {
		if !have[m[1]] {
			t.Errorf("SPECIFICATION.md names %s: no such test or benchmark", m[1])
		}
	}
}
