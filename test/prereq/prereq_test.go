package prereq

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB whose Fatalf and Skipf record the outcome and
// end the goroutine, as the real ones do.
type recorder struct {
	testing.TB
	outcome, msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.outcome, r.msg = "fail", fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any) {
	r.outcome, r.msg = "skip", fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *recorder) Skipf(format string, args ...any) {
	r.outcome, r.msg = "skip", fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func outcome(t *testing.T, f func(testing.TB)) (string, string) {
	r := &recorder{TB: t, outcome: "ran"}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.outcome, r.msg
}

func TestOutcomes(t *testing.T) {
	const absent = "slurm-microvm-no-such-tool"
	tests := []struct {
		name, ci string
		f        func(testing.TB)
		want     string
	}{
		{"missing tool fails under CI", "true", func(tb testing.TB) { Tools(tb, "sh", absent) }, "fail"},
		{"missing tool skips outside CI", "", func(tb testing.TB) { Tools(tb, absent) }, "skip"},
		{"CI must be exactly true", "1", func(tb testing.TB) { Tools(tb, absent) }, "skip"},
		{"present tools run under CI", "true", func(tb testing.TB) { Tools(tb, "sh") }, "ran"},
		{"Missing fails under CI", "true", func(tb testing.TB) { Missing(tb, "libx") }, "fail"},
		{"Hardware skips under CI", "true", func(tb testing.TB) { Hardware(tb, "no GPU") }, "skip"},
		{"OptIn skips under CI", "true", func(tb testing.TB) { OptIn(tb, "set X=1") }, "skip"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			got, msg := outcome(t, tt.f)
			if got != tt.want {
				t.Fatalf("outcome %s (%q), want %s", got, msg, tt.want)
			}
			if got == "fail" && !strings.Contains(msg, absent) && !strings.Contains(msg, "libx") {
				t.Errorf("message %q does not name what is missing", msg)
			}
		})
	}
	t.Run("root", func(t *testing.T) {
		t.Setenv("CI", "true")
		got, msg := outcome(t, func(tb testing.TB) { Root(tb, "mount(2)") })
		want := "ran"
		if os.Geteuid() != 0 {
			want = "fail"
		}
		if got != want {
			t.Fatalf("Root as euid %d under CI: %s (%q), want %s", os.Geteuid(), got, msg, want)
		}
	})
}

// bareSkip matches a skip that does not go through this package.
var bareSkip = regexp.MustCompile(`\.(Skip|Skipf|SkipNow)\(`)

// TestNoBareSkip fails on any t.Skip outside this package: each skip
// decides through Missing, Hardware or OptIn whether CI may skip it.
func TestNoBareSkip(t *testing.T) {
	_, self, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(filepath.Dir(self)))
	here := filepath.Dir(self)
	var found []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p == here || (p != root && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			if line := sc.Text(); bareSkip.MatchString(line) && !strings.HasPrefix(strings.TrimSpace(line), "//") {
				rel, _ := filepath.Rel(root, p)
				found = append(found, fmt.Sprintf("%s:%d: %s", rel, n, strings.TrimSpace(line)))
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) > 0 {
		t.Errorf("skips outside test/prereq (use prereq.Missing, Tools, Root, Hardware or OptIn):\n  %s", strings.Join(found, "\n  "))
	}
}
