// Package mpitest builds and runs the project's MPI test program
// (mpi/testdata/mpi_hello.c: hello + allreduce + ping-pong timer) with the
// MPI implementations installed on the host, and parses its output. It is
// for tests and benchmarks (package mpi's, the VM tests, test/bench):
//
//	prog, err := mpitest.OpenMPI.BuildHello(ctx, t.TempDir())
//	out, err := mpitest.OpenMPI.RunHost(ctx, 2, prog)
//	res, err := mpitest.ParseHello(out)   // res.Size == 2, res.Sum == res.Expected
//
// Debian 12 packages: libopenmpi-dev openmpi-bin (Open MPI 4.1) and
// libmpich-dev mpich (MPICH 4.0); both install side by side, with
// mpicc.openmpi / mpicc.mpich and mpirun.openmpi / mpiexec.mpich.
package mpitest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// Impl is one MPI implementation on the host.
type Impl struct {
	// Name is "openmpi" or "mpich".
	Name string
	// CC is the compiler wrapper (mpicc of this implementation).
	CC string
	// Launcher is the host launcher argv before the task count; the
	// count follows as "-n N".
	Launcher []string
	// Env is added to the environment of host runs: Open MPI refuses root
	// without OMPI_ALLOW_RUN_AS_ROOT*; MPICH 4.0 over UCX sometimes hangs
	// in MPI_Finalize over TCP (UCX 1.13, seen on the bare host too), so UCX_TLS keeps it on
	// shared memory.
	Env []string
}

// The implementations Debian packages.
var (
	OpenMPI = Impl{
		Name: "openmpi", CC: "mpicc.openmpi",
		Launcher: []string{"mpirun.openmpi", "--oversubscribe"},
		Env:      []string{"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_btl=self,vader", "OMPI_MCA_pml=ob1"},
	}
	MPICH = Impl{
		Name: "mpich", CC: "mpicc.mpich",
		Launcher: []string{"mpiexec.mpich"},
		Env:      []string{"UCX_TLS=self,sm"},
	}
)

// Impls lists the implementations this package knows.
func Impls() []Impl { return []Impl{OpenMPI, MPICH} }

// Available fails, naming the Debian packages to install, when the
// implementation's compiler wrapper or launcher is missing.
func (i Impl) Available() error {
	for _, tool := range []string{i.CC, i.Launcher[0]} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s: %s not found (apt-get install -y libopenmpi-dev openmpi-bin libmpich-dev mpich)", i.Name, tool)
		}
	}
	return nil
}

// SourceDir is the absolute path of mpi/testdata, which holds the C
// sources.
func SourceDir() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "mpi/testdata"
	}
	return filepath.Join(filepath.Dir(filepath.Dir(file)), "testdata")
}

// Build compiles C source src (a file name in SourceDir, or a path) into
// executable out with the implementation's mpicc, passing extra flags.
func (i Impl) Build(ctx context.Context, src, out string, extra ...string) error {
	if !filepath.IsAbs(src) && !strings.Contains(src, "/") {
		src = filepath.Join(SourceDir(), src)
	}
	args := append([]string{"-O2", "-Wall", "-o", out, src}, extra...)
	cmd := exec.CommandContext(ctx, i.CC, args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", i.CC, strings.Join(args, " "), err, bytes.TrimSpace(b))
	}
	return nil
}

// BuildHello compiles mpi_hello.c into dir/mpi_hello_<name> and returns its
// path.
func (i Impl) BuildHello(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "mpi_hello_"+i.Name)
	return out, i.Build(ctx, "mpi_hello.c", out)
}

// RunHost runs prog with n ranks on the host through the implementation's
// launcher, with Env and extraEnv added to this process's environment, and
// returns stdout and stderr together.
func (i Impl) RunHost(ctx context.Context, n int, extraEnv []string, prog string, args ...string) ([]byte, error) {
	argv := append(append(append([]string{}, i.Launcher[1:]...), "-n", strconv.Itoa(n), prog), args...)
	cmd := exec.CommandContext(ctx, i.Launcher[0], argv...)
	cmd.Env = append(append(os.Environ(), i.Env...), extraEnv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w", i.Launcher[0], strings.Join(argv, " "), err)
	}
	return out, nil
}

// Rank is what one rank reported.
type Rank struct {
	LibMPI string // the file holding MPI_Init
	Host   string
}

// Result is the parsed output of mpi_hello.
type Result struct {
	// Size is N of "rank R of N" (the same on every line).
	Size  int
	Ranks map[int]Rank
	// Library is rank 0's first line of MPI_Get_library_version.
	Library string
	// Sum and Expected are the allreduce result and sum(1..N).
	Sum, Expected int
	// LatencyUS is half the 8-byte round trip in microseconds;
	// BandwidthMBps one-way bandwidth in 10^6 bytes per second. Zero
	// without a ping-pong (one rank).
	LatencyUS, BandwidthMBps float64
	// PairsChecked is the number of rank-to-rank transfers whose data
	// the receiver checked (N*(N-1): every ordered pair); PairsBad those
	// that arrived wrong. PairsChecked is -1 when the line is missing.
	PairsChecked, PairsBad int
	// Done is true when rank 0 passed the final barrier.
	Done bool
}

// ParseHello reads mpi_hello's output (other lines are ignored: launcher
// and library warnings). It fails when a rank line contradicts another or
// no rank reported.
func ParseHello(out []byte) (*Result, error) {
	r := &Result{Ranks: map[int]Rank{}, PairsChecked: -1}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 4 && f[0] == "rank" && f[2] == "of":
			rank, err1 := strconv.Atoi(f[1])
			size, err2 := strconv.Atoi(f[3])
			if err1 != nil || err2 != nil {
				continue
			}
			if r.Size != 0 && r.Size != size {
				return nil, fmt.Errorf("ranks disagree on the size: %d and %d", r.Size, size)
			}
			r.Size = size
			if _, ok := r.Ranks[rank]; !ok {
				r.Ranks[rank] = Rank{}
			}
		case len(f) >= 4 && f[0] == "rank" && (f[2] == "libmpi" || f[2] == "host"):
			rank, err := strconv.Atoi(f[1])
			if err != nil {
				continue
			}
			rk := r.Ranks[rank]
			if f[2] == "libmpi" {
				rk.LibMPI = strings.Join(f[3:], " ")
			} else {
				rk.Host = f[3]
			}
			r.Ranks[rank] = rk
		case len(f) >= 2 && f[0] == "library":
			r.Library = strings.TrimPrefix(sc.Text(), "library ")
		case len(f) == 5 && f[0] == "allreduce" && f[1] == "sum" && f[3] == "expected":
			r.Sum, _ = strconv.Atoi(f[2])
			r.Expected, _ = strconv.Atoi(f[4])
		case len(f) == 5 && f[0] == "pairs" && f[1] == "checked" && f[3] == "bad":
			r.PairsChecked, _ = strconv.Atoi(f[2])
			r.PairsBad, _ = strconv.Atoi(f[4])
		case len(f) >= 3 && f[0] == "pingpong" && f[1] == "latency_us":
			r.LatencyUS, _ = strconv.ParseFloat(f[2], 64)
		case len(f) >= 3 && f[0] == "pingpong" && f[1] == "bandwidth_MBps":
			r.BandwidthMBps, _ = strconv.ParseFloat(f[2], 64)
		case len(f) == 1 && f[0] == "done":
			r.Done = true
		}
	}
	if len(r.Ranks) == 0 {
		return nil, errors.New("no \"rank R of N\" line in the output")
	}
	return r, nil
}

// Check verifies a complete run of n ranks: every rank reported, the
// allreduce is right, every ordered pair of ranks exchanged checked data,
// rank 0 finished, and (n >= 2) the ping-pong ran.
func (r *Result) Check(n int) error {
	if r.Size != n || len(r.Ranks) != n {
		return fmt.Errorf("want %d ranks, got size %d with %d ranks reporting", n, r.Size, len(r.Ranks))
	}
	if r.Sum != r.Expected || r.Expected != n*(n+1)/2 {
		return fmt.Errorf("allreduce sum %d, expected %d", r.Sum, n*(n+1)/2)
	}
	if r.PairsChecked != n*(n-1) || r.PairsBad != 0 {
		return fmt.Errorf("every-pair exchange: %d of %d transfers checked, %d arrived wrong", r.PairsChecked, n*(n-1), r.PairsBad)
	}
	if n >= 2 && (r.LatencyUS <= 0 || r.BandwidthMBps <= 0) {
		return fmt.Errorf("ping-pong missing or zero: latency %v us, bandwidth %v MB/s", r.LatencyUS, r.BandwidthMBps)
	}
	if !r.Done {
		return errors.New("rank 0 did not print done")
	}
	return nil
}
