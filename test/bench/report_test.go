package bench

import (
	"fmt"
	"os"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/bench/benchreport"
)

// Figure is one result of the run (benchreport.Figure).
type Figure = benchreport.Figure

// report is the run's report. Test code only: one `go test -bench` process
// is one run.
var report = benchreport.New(rounds)

func TestMain(m *testing.M) {
	code := m.Run()
	if len(report.Figures) > 0 {
		fmt.Print("\n" + report.Text())
		if p := os.Getenv("SMV_BENCH_JSON"); p != "" {
			if err := report.Write(p); err != nil {
				fmt.Fprintln(os.Stderr, err)
				code = 1
			} else {
				fmt.Printf("\nwritten to %s\n", p)
			}
		}
	}
	os.Exit(code)
}
