package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/mpi/mpitest"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// mpiTests run real MPI jobs with ranks inside the step's microVM: the
// image's own MPI stack, PMI relayed across the VM boundary by the task's
// exec process and the guest agent (PMIx for Open MPI, PMI-2 for MPICH).
func mpiTests(t *testing.T, e *harness.Env) {
	cases := []struct {
		impl mpitest.Impl
		mpi  string
		env  []string // srun's environment, which the tasks inherit
	}{
		// Shared memory between the ranks in the one VM.
		{mpitest.OpenMPI, "pmix", []string{"OMPI_MCA_btl=self,vader", "OMPI_MCA_pml=ob1"}},
		{mpitest.MPICH, "pmi2", []string{"UCX_TLS=self,sm"}},
	}
	for _, c := range cases {
		for _, mode := range []string{"image", "host"} {
			e.Run(t, c.impl.Name+" over "+c.mpi+" with --microvm-mpi="+mode, func(t *testing.T) {
				img := harness.MPIImage(t, c.impl)
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
				defer cancel()
				cmd, err := e.C.Command(ctx, "", "srun", "-n2", "--mpi="+c.mpi, "--microvm-mpi="+mode, "--microvm="+img, "mpi_hello")
				if err != nil {
					t.Fatal(err)
				}
				cmd.Env = append(cmd.Env, c.env...)
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				if err := cmd.Run(); err != nil {
					t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
				}
				out := stdout.String()
				res, err := mpitest.ParseHello([]byte(out))
				if err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
				if err := res.Check(2); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
				for r, rk := range res.Ranks {
					injected := strings.HasPrefix(rk.LibMPI, "/run/slurm-microvm/mpi/")
					if injected != (mode == "host") {
						t.Errorf("rank %d loaded %s with --microvm-mpi=%s", r, rk.LibMPI, mode)
					}
				}
				t.Logf("%s in the VM (--microvm-mpi=%s): size %d, sum %d, latency %.2f us, bandwidth %.0f MB/s, libmpi %s",
					c.impl.Name, mode, res.Size, res.Sum, res.LatencyUS, res.BandwidthMBps, res.Ranks[0].LibMPI)
			})
		}
	}
	e.Run(t, "--microvm-mpi=host refuses an image without MPI", func(t *testing.T) {
		// (Family mismatches are table-tested in package mpi: this
		// host has both families, so every Debian image matches one.)
		_, errOut, code := e.Srun(t, "", "--microvm-mpi=host", "--microvm="+e.Image, "true")
		if code == 0 || !strings.Contains(errOut, "no MPI") {
			t.Fatalf("exit %d, stderr %q: want a refusal saying the image has no MPI", code, errOut)
		}
	})
	e.Run(t, "explicit MPI mode without PMI in a multi-task step fails", func(t *testing.T) {
		_, errOut, code := e.Srun(t, "", "-n2", "--microvm-mpi=image", "--microvm="+e.Image, "true")
		if code == 0 || !strings.Contains(errOut, "singleton") {
			t.Fatalf("exit %d, stderr %q: want a refusal before N singletons start", code, errOut)
		}
	})
	e.Run(t, "multi-task step without PMI still runs (no MPI asked for)", func(t *testing.T) {
		out, errOut, code := e.Srun(t, "", "-n2", "--microvm="+e.Image, "sh", "-c", "echo ok")
		if code != 0 || strings.Count(out, "ok") != 2 {
			t.Fatalf("exit %d, %q %q", code, out, errOut)
		}
	})
}
