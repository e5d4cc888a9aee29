package bench

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/mpi/mpitest"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// BenchmarkMPIPingPong prints, side by side in one run, mpi_hello's
// ping-pong latency and bandwidth for 2 ranks sharing one microVM (srun
// --microvm, the image's own MPI over shared memory, PMI relayed) and for
// the same 2 ranks on the host (the implementation's own launcher), per
// implementation, as ratios VM/host.
func BenchmarkMPIPingPong(b *testing.B) {
	e := harness.Setup(b)
	cases := []struct {
		impl mpitest.Impl
		mpi  string
		env  []string
	}{
		{mpitest.OpenMPI, "pmix", []string{"OMPI_MCA_btl=self,vader", "OMPI_MCA_pml=ob1"}},
		{mpitest.MPICH, "pmi2", []string{"UCX_TLS=self,sm"}},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n2 ranks, median of %d runs each   %12s %12s %12s %12s\n", rounds, "lat host us", "lat VM us", "bw host MB/s", "bw VM MB/s")
	for _, c := range cases {
		img := harness.MPIImage(b, c.impl)
		hello, err := c.impl.BuildHello(context.Background(), b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		var latH, latV, bwH, bwV []float64
		for i := 0; i < rounds; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			out, err := c.impl.RunHost(ctx, 2, nil, hello)
			cancel()
			if err != nil {
				b.Fatalf("%s on the host: %v\n%s", c.impl.Name, err, out)
			}
			h, err := mpitest.ParseHello(out)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel = context.WithTimeout(context.Background(), 4*time.Minute)
			cmd, err := e.C.Command(ctx, "", "srun", "-n2", "-c1", "--mem=1536", "--mpi="+c.mpi, "--microvm="+img, "mpi_hello")
			if err != nil {
				b.Fatal(err)
			}
			cmd.Env = append(cmd.Env, c.env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err = cmd.Run()
			cancel()
			if err != nil {
				b.Fatalf("%s in the VM: %v\n%s\n%s", c.impl.Name, err, stdout.String(), stderr.String())
			}
			v, err := mpitest.ParseHello(stdout.Bytes())
			if err != nil {
				b.Fatal(err)
			}
			latH, latV = append(latH, h.LatencyUS), append(latV, v.LatencyUS)
			bwH, bwV = append(bwH, h.BandwidthMBps), append(bwV, v.BandwidthMBps)
		}
		lh, lv, bh, bv := medianF(latH), medianF(latV), medianF(bwH), medianF(bwV)
		fmt.Fprintf(&sb, "  %-32s %12.2f %12.2f %12.0f %12.0f   latency VM/host %.2f, bandwidth VM/host %.2f\n",
			c.impl.Name+" ("+c.mpi+")", lh, lv, bh, bv, lv/lh, bv/bh)
		b.ReportMetric(lv/lh, c.impl.Name+"-lat-vm/host")
		b.ReportMetric(bv/bh, c.impl.Name+"-bw-vm/host")
		addMPI(c.impl.Name+" ("+c.mpi+"), 2 ranks in one VM", lh, lv, bh, bv,
			"srun -n2 -c1 --mem=1536 --mpi="+c.mpi+" --microvm=IMG mpi_hello vs the implementation's own launcher on the host")
	}
	b.Log(sb.String())
}

// addMPI records one ping-pong comparison: latency (us) and bandwidth
// (MB/s) on the host and in the VM, and the VM/host ratios.
func addMPI(what string, latHost, latVM, bwHost, bwVM float64, command string) {
	for _, f := range []Figure{
		{Name: what + ": latency, host", Value: latHost, Unit: "us"},
		{Name: what + ": latency, VM", Value: latVM, Unit: "us"},
		{Name: "  latency VM / host", Value: latVM / latHost, Unit: "ratio"},
		{Name: what + ": bandwidth, host", Value: bwHost, Unit: "MB/s"},
		{Name: what + ": bandwidth, VM", Value: bwVM, Unit: "MB/s"},
		{Name: "  bandwidth VM / host", Value: bwVM / bwHost, Unit: "ratio"},
	} {
		f.Section, f.Command = "mpi", command
		report.Add(f)
	}
}

func medianF(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// BenchmarkMPIPingPongAcrossNodes prints, side by side in one run, the
// ping-pong of 2 ranks on the two nodes of the two-node test cluster: in
// one microVM per node over the step network (VXLAN between the nodes,
// the guests' virtio-net and the host's tap and bridge) and on the bare
// nodes (the same program, the same srun, the nodes' own addresses), per
// implementation, as ratios VM/host. MPICH's UCX 1.13 needs its sm
// transport on the bare test nodes (with tcp,self only it finds no
// transport to the other node: "tcp/lo - Destination is unreachable"),
// and must not have it in the guests (MPI_Finalize hangs flushing the
// shared-memory endpoints once TCP is in use): the guests run tcp,self,
// as the e2e tests do. The data between the nodes is TCP in both.
func BenchmarkMPIPingPongAcrossNodes(b *testing.B) {
	e := harness.SetupWith(b, harness.TwoNodes)
	cases := []struct {
		impl     mpitest.Impl
		mpi      string
		env      []string // both runs
		guestEnv []string // the VM runs only
	}{
		{mpitest.OpenMPI, "pmix", []string{"OMPI_MCA_btl=self,vader,tcp", "OMPI_MCA_pml=ob1"}, []string{"OMPI_MCA_btl_tcp_if_include=eth0"}},
		{mpitest.MPICH, "pmi2", []string{"UCX_TLS=tcp,self,sm"}, []string{"UCX_TLS=tcp,self", "UCX_NET_DEVICES=eth0"}},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n2 ranks on 2 nodes, median of %d runs each   %12s %12s %12s %12s\n", rounds, "lat host us", "lat VM us", "bw host MB/s", "bw VM MB/s")
	for _, c := range cases {
		img := harness.MPIImage(b, c.impl)
		// On the host the program must be where every node reads it.
		hello, err := c.impl.BuildHello(context.Background(), harness.Root)
		if err != nil {
			b.Fatal(err)
		}
		run := func(env []string, args ...string) *mpitest.Result {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			all := append([]string{"-N2", "-n2", "--ntasks-per-node=1", "--mpi=" + c.mpi}, args...)
			cmd, err := e.C.Command(ctx, "", "srun", all...)
			if err != nil {
				b.Fatal(err)
			}
			cmd.Env = append(append(cmd.Env, c.env...), env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				b.Fatalf("srun %q: %v\n%s\n%s", all, err, stdout.String(), stderr.String())
			}
			r, err := mpitest.ParseHello(stdout.Bytes())
			if err != nil {
				b.Fatal(err)
			}
			if err := r.Check(2); err != nil {
				b.Fatalf("%v\n%s", err, stdout.String())
			}
			return r
		}
		var latH, latV, bwH, bwV []float64
		for i := 0; i < rounds; i++ {
			h := run(nil, hello)
			v := run(c.guestEnv, "--microvm="+img, "mpi_hello")
			latH, latV = append(latH, h.LatencyUS), append(latV, v.LatencyUS)
			bwH, bwV = append(bwH, h.BandwidthMBps), append(bwV, v.BandwidthMBps)
		}
		lh, lv, bh, bv := medianF(latH), medianF(latV), medianF(bwH), medianF(bwV)
		fmt.Fprintf(&sb, "  %-42s %12.2f %12.2f %12.0f %12.0f   latency VM/host %.2f, bandwidth VM/host %.2f\n",
			c.impl.Name+" ("+c.mpi+", TCP)", lh, lv, bh, bv, lv/lh, bv/bh)
		b.ReportMetric(lv/lh, c.impl.Name+"-xnode-lat-vm/host")
		b.ReportMetric(bv/bh, c.impl.Name+"-xnode-bw-vm/host")
		addMPI(c.impl.Name+" ("+c.mpi+", TCP), 2 ranks on 2 nodes", lh, lv, bh, bv,
			"srun -N2 -n2 --ntasks-per-node=1 --mpi="+c.mpi+" --microvm=IMG mpi_hello vs the same srun on the bare nodes")
	}
	b.Log(sb.String())
}
