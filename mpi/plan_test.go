package mpi

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/mpi/mpitest"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

func TestPlanEnviron(t *testing.T) {
	p := &Plan{Env: []EnvVar{
		{Name: "LD_LIBRARY_PATH", Value: "/g/lib", Prepend: true},
		{Name: "OMPI_MCA_mca_base_component_path", Value: "/g/lib/openmpi"},
	}}
	tests := []struct {
		name string
		env  []string
		want []string
	}{
		{"empty", nil, []string{"LD_LIBRARY_PATH=/g/lib", "OMPI_MCA_mca_base_component_path=/g/lib/openmpi"}},
		{"prepend to existing, replace the other", []string{"A=1", "LD_LIBRARY_PATH=/opt/x", "OMPI_MCA_mca_base_component_path=/img"},
			[]string{"A=1", "LD_LIBRARY_PATH=/g/lib:/opt/x", "OMPI_MCA_mca_base_component_path=/g/lib/openmpi"}},
		{"empty existing value", []string{"LD_LIBRARY_PATH="}, []string{"LD_LIBRARY_PATH=/g/lib", "OMPI_MCA_mca_base_component_path=/g/lib/openmpi"}},
		{"duplicate keys: the last wins, as in exec", []string{"LD_LIBRARY_PATH=/a", "LD_LIBRARY_PATH=/b"}, []string{"LD_LIBRARY_PATH=/g/lib:/b", "OMPI_MCA_mca_base_component_path=/g/lib/openmpi"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.env)
			got := p.Environ(tt.env)
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if !slices.Equal(in, tt.env) {
				t.Error("input modified")
			}
		})
	}
}

// TestPlanRunsOnHost materializes the host's plan for each implementation
// into a directory standing in for the guest share, runs mpi_hello with two
// ranks under the plan's environment, and checks that every rank loaded
// the MPI library, and the stack its plugins, from the share.
func TestPlanRunsOnHost(t *testing.T) {
	for _, tt := range []struct {
		impl    mpitest.Impl
		family  Family
		plugins string // a plugin directory that must be used
	}{
		{mpitest.OpenMPI, FamilyOpenMPI, "/lib/openmpi/mca_"},
		{mpitest.MPICH, FamilyMPICH, "/lib/ucx/libuct_"},
	} {
		t.Run(tt.impl.Name, func(t *testing.T) {
			prog := buildHello(t, tt.impl)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			host, err := OpenRoot("/")
			if err != nil {
				t.Fatal(err)
			}
			defer host.Close()
			st, err := Discover(ctx, host)
			if err != nil {
				t.Fatal(err)
			}
			lib := st.MPIOf(tt.family)
			if lib == nil {
				prereq.Missing(t, "host has no %s", tt.family)
			}
			share := t.TempDir()
			plan, err := NewPlan(ctx, host, lib, PlanOptions{GuestDir: share})
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			if err := plan.Materialize(ctx, share); err != nil {
				t.Fatal(err)
			}
			t.Logf("%d files materialized in %v; %d plugins skipped", len(plan.Files), time.Since(t0), len(plan.Skipped))
			env := plan.Environ(nil)
			out, err := tt.impl.RunHost(ctx, 2, env, prog, "100", "10")
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			res, err := mpitest.ParseHello(out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if err := res.Check(2); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for r, rk := range res.Ranks {
				if !strings.HasPrefix(rk.LibMPI, share+"/lib/") {
					t.Errorf("rank %d loaded %s, want it from the share %s/lib", r, rk.LibMPI, share)
				}
			}
			// The loader's own account of every file it mapped, one file
			// per process (LD_DEBUG_OUTPUT=<prefix>.<pid>): on the shared
			// stderr the two ranks' lines interleave mid-line ("/tmp/TestPl"
			// + "ing init: /tmp/...", a CI failure).
			ldDir := t.TempDir()
			out, err = tt.impl.RunHost(ctx, 2, append(env, "LD_DEBUG=files", "LD_DEBUG_OUTPUT="+filepath.Join(ldDir, "ld")), prog, "10", "2")
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			logs, _ := filepath.Glob(filepath.Join(ldDir, "ld.*"))
			if len(logs) < 2 {
				t.Fatalf("LD_DEBUG_OUTPUT wrote %d files, want one per rank at least", len(logs))
			}
			var ld strings.Builder
			for _, l := range logs {
				b, err := os.ReadFile(l)
				if err != nil {
					t.Fatal(err)
				}
				ld.Write(b)
			}
			out = []byte(ld.String())
			if !strings.Contains(string(out), share+tt.plugins) {
				t.Errorf("no plugin loaded from %s%s*", share, tt.plugins)
			}
			fromShare := 0
			for _, line := range strings.Split(string(out), "\n") {
				// "file=libz.so.1 [0];  generating link map" is followed by
				// "... name: /path" lines; every MPI-stack file must come
				// from the share.
				if i := strings.Index(line, "calling init: "); i >= 0 {
					p := strings.TrimSpace(line[i+len("calling init: "):])
					base := p[strings.LastIndex(p, "/")+1:]
					if _, inPlan := plan.objs[base]; inPlan && !strings.HasPrefix(p, share) {
						t.Errorf("%s was loaded from %s, not from the share", base, p)
					}
					if strings.HasPrefix(p, share) {
						fromShare++
					}
				}
			}
			if fromShare < 2 {
				t.Errorf("the loader initialized %d objects from the share, want the MPI stack's", fromShare)
			}
			t.Logf("%d objects initialized from the share", fromShare)
		})
	}
}

// TestPlanJSONRoundTrip: the supervisor records the plan as JSON and every
// task reads it back to set its environment.
func TestPlanJSONRoundTrip(t *testing.T) {
	in := &Plan{GuestDir: DefaultGuestDir, MPI: &Library{Name: "libmpi.so.40", FileVersion: Version{40, 30, 4}},
		Env: []EnvVar{{Name: "LD_LIBRARY_PATH", Value: DefaultGuestDir + "/lib", Prepend: true}}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out Plan
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	if out.MPI.FileVersion.String() != "40.30.4" || len(out.Env) != 1 {
		t.Fatalf("round trip: %+v", out)
	}
	env := out.Environ([]string{"LD_LIBRARY_PATH=/opt/x"})
	if env[0] != "LD_LIBRARY_PATH="+DefaultGuestDir+"/lib:/opt/x" {
		t.Fatalf("Environ = %v", env)
	}
}
