package mpitest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestHelloOnHost builds mpi_hello with each implementation and runs two
// ranks on the host.
func TestHelloOnHost(t *testing.T) {
	for _, impl := range Impls() {
		t.Run(impl.Name, func(t *testing.T) {
			if err := impl.Available(); err != nil {
				prereq.Missing(t, "%v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			prog, err := impl.BuildHello(ctx, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			out, err := impl.RunHost(ctx, 2, nil, prog, "200", "20")
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			res, err := ParseHello(out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if err := res.Check(2); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			want := map[string]string{"openmpi": "libmpi.so.40", "mpich": "libmpich.so.12"}[impl.Name]
			for r, rk := range res.Ranks {
				if !strings.Contains(rk.LibMPI, want) {
					t.Errorf("rank %d loaded %q, want %s", r, rk.LibMPI, want)
				}
			}
			t.Logf("%s: %s; latency %.3f us, bandwidth %.0f MB/s", impl.Name, res.Library, res.LatencyUS, res.BandwidthMBps)
		})
	}
}

func TestParseHello(t *testing.T) {
	out := []byte("warning: something\nrank 1 of 2\nrank 1 libmpi /x/libmpi.so.40\nrank 1 host h\nrank 0 of 2\nrank 0 libmpi /x/libmpi.so.40\nrank 0 host h\nlibrary Open MPI v4.1.4, package\nallreduce sum 3 expected 3\npairs checked 2 bad 0\npingpong latency_us 0.5 bytes 8 iters 10\npingpong bandwidth_MBps 900.5 bytes 1048576 iters 5\ndone\n")
	r, err := ParseHello(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Check(2); err != nil {
		t.Fatal(err)
	}
	if r.Library != "Open MPI v4.1.4, package" || r.LatencyUS != 0.5 || r.BandwidthMBps != 900.5 || r.Ranks[0].LibMPI != "/x/libmpi.so.40" {
		t.Errorf("parsed %+v", r)
	}
	if _, err := ParseHello([]byte("rank 0 of 2\nrank 1 of 3\n")); err == nil {
		t.Error("disagreeing sizes accepted")
	}
	if _, err := ParseHello([]byte("nothing\n")); err == nil {
		t.Error("empty output accepted")
	}
	r, _ = ParseHello([]byte("rank 0 of 2\nallreduce sum 2 expected 3\ndone\n"))
	if err := r.Check(2); err == nil {
		t.Error("wrong sum accepted")
	}
	// The every-pair exchange: missing, short, or with bad data.
	for _, pairs := range []string{"", "pairs checked 1 bad 0\n", "pairs checked 2 bad 1\n"} {
		r, _ = ParseHello([]byte("rank 0 of 2\nrank 1 of 2\nallreduce sum 3 expected 3\n" + pairs + "pingpong latency_us 0.5 bytes 8 iters 10\npingpong bandwidth_MBps 900.5 bytes 1048576 iters 5\ndone\n"))
		if err := r.Check(2); err == nil || !strings.Contains(err.Error(), "every-pair exchange") {
			t.Errorf("pairs line %q: Check = %v, want an every-pair error", pairs, err)
		}
	}
}
