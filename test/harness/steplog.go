package harness

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// stepLogProblemLines bounds what a failed test prints of the step logs.
const stepLogProblemLines = 80

// StepLogProblems returns the last max lines at level WARN or ERROR of the
// supervisor logs in dir (harness LogDir), each prefixed with its file's
// name, oldest first by their timestamps: what went wrong in the steps of
// a failed test (a hung guest with its VMM's threads, a slow agent, a
// start that failed), which srun's output does not carry. A dir that
// cannot be read is said in the text.
func StepLogProblems(dir string, max int) string {
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(files) == 0 {
		return fmt.Sprintf("(no step logs in %s: %v)", dir, err)
	}
	var lines []string
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			lines = append(lines, fmt.Sprintf("%s: %v", filepath.Base(f), err))
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			if strings.Contains(l, " level=WARN ") || strings.Contains(l, " level=ERROR ") {
				// "time=..." first: sorting the lines sorts by time.
				lines = append(lines, l+"  ["+filepath.Base(f)+"]")
			}
		}
		fh.Close()
	}
	if len(lines) == 0 {
		return "(none)"
	}
	sort.Strings(lines)
	if len(lines) > max {
		lines = append([]string{fmt.Sprintf("(%d earlier lines left out)", len(lines)-max)}, lines[len(lines)-max:]...)
	}
	return strings.Join(lines, "\n")
}
