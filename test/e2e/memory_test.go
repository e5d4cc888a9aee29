package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// vmmOverheadMiB is resources.vmm_overhead_mib of the e2e microvm.toml
// (test/harness), minMemoryMiB the default min_memory_mib.
const (
	vmmOverheadMiB = 192
	minMemoryMiB   = 128
)

var guestSize = regexp.MustCompile(`CPUS=(\d+) MEMTOTAL=(\d+) JOB=(\d+)`)

// guestMiB parses the guest's vCPUs and MemTotal (MiB) from out.
func guestMiB(t *testing.T, out string) (cpus int, mib uint64, job int) {
	t.Helper()
	m := guestSize.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no CPUS=/MEMTOTAL= line in %q", out)
	}
	cpus, _ = strconv.Atoi(m[1])
	kb, _ := strconv.ParseUint(m[2], 10, 64)
	job, _ = strconv.Atoi(m[3])
	return cpus, kb / 1024, job
}

// checkSize: the guest's MemTotal is its memory less what the guest kernel
// keeps for itself (well under 128 MiB), never more.
func checkSize(t *testing.T, what string, gotMiB, wantMiB uint64) {
	t.Helper()
	t.Logf("%s: guest MemTotal %d MiB, sized %d MiB", what, gotMiB, wantMiB)
	if gotMiB > wantMiB || gotMiB+128 < wantMiB {
		t.Errorf("%s: guest MemTotal %d MiB, want a %d MiB guest (the request minus the VMM's %d MiB)", what, gotMiB, wantMiB, vmmOverheadMiB)
	}
}

const sizeScript = `echo CPUS=$(nproc) MEMTOTAL=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo) JOB=$SLURM_JOB_ID`

// With SelectTypeParameters=CR_Core Slurm allocates no memory: the guest
// is sized from the job's own --mem / --mem-per-cpu, and a request the
// guest cannot fit is refused before boot.
func TestGuestSizeWithoutMemoryAllocation(t *testing.T) {
	e := harness.Setup(t, "SELECT_TYPE_PARAMETERS=CR_Core")
	img := "--microvm=" + e.Image

	t.Run("srun --mem", func(t *testing.T) {
		out, errOut, code := e.Srun(t, "", "--mem=1500", img, "sh", "-c", sizeScript)
		if code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		_, mib, job := guestMiB(t, out)
		checkSize(t, "--mem=1500", mib, 1500-vmmOverheadMiB)
		e.WaitClean(t, job)
	})

	t.Run("srun --mem-per-cpu", func(t *testing.T) {
		out, errOut, code := e.Srun(t, "", "--mem-per-cpu=1200", img, "sh", "-c", sizeScript)
		if code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		cpus, mib, job := guestMiB(t, out)
		checkSize(t, fmt.Sprintf("--mem-per-cpu=1200 with %d vCPUs", cpus), mib, uint64(1200*cpus-vmmOverheadMiB))
		e.WaitClean(t, job)
	})

	t.Run("srun --mem too small", func(t *testing.T) {
		out, errOut, code := e.Srun(t, "", "--mem=300", img, "sh", "-c", "echo RAN")
		want := fmt.Sprintf("ask for --mem=%dM or more", minMemoryMiB+vmmOverheadMiB)
		if code == 0 || strings.Contains(out, "RAN") || !strings.Contains(errOut, want) {
			t.Fatalf("exit %d, stdout %q, stderr %q: want refused with %q", code, out, errOut, want)
		}
	})

	t.Run("sbatch --mem", func(t *testing.T) {
		dir := t.TempDir()
		_ = os.Chmod(dir, 0o755)
		outFile := dir + "/out"
		script := fmt.Sprintf("#!/bin/sh\n#SBATCH --microvm=%s\n#SBATCH --mem=1000\n#SBATCH --output=%s\nsrun sh -c '%s'\n", e.Image, outFile, strings.ReplaceAll(sizeScript, "'", `'\''`))
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		job, err := e.C.Sbatch(ctx, "", script)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.C.WaitJob(ctx, job); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(outFile)
		_, mib, _ := guestMiB(t, string(b))
		checkSize(t, "sbatch --mem=1000", mib, 1000-vmmOverheadMiB)
		e.WaitClean(t, job)
	})
}
