package harness

import (
	"slices"
	"strings"
	"testing"
)

const memPerCPU = uint64(1) << 63 // slurm.h MEM_PER_CPU

// srun exports the memory request of a job it allocated itself, which
// Slurm does not put in the step's environment (sbatch and salloc do).
func TestSrunExportsJobMemRequest(t *testing.T) {
	tests := []struct {
		name      string
		image     bool
		jobMem    *uint64
		preset    map[string]string
		wantLoads int
		want      map[string]string // "" = unset
	}{
		{name: "--mem", image: true, jobMem: U64(700), wantLoads: 1, want: map[string]string{"SLURM_MEM_PER_NODE": "700", "SLURM_MEM_PER_CPU": ""}},
		{name: "--mem-per-cpu", image: true, jobMem: U64(300 | memPerCPU), wantLoads: 1, want: map[string]string{"SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_CPU": "300"}},
		{name: "no request", image: true, jobMem: U64(0), wantLoads: 1, want: map[string]string{"SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_CPU": ""}},
		{name: "per cpu, none", image: true, jobMem: U64(memPerCPU), wantLoads: 1, want: map[string]string{"SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_CPU": ""}},
		{name: "NO_VAL64", image: true, jobMem: U64(0xfffffffffffffffe), wantLoads: 1, want: map[string]string{"SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_CPU": ""}},
		{name: "slurmctld unreachable", image: true, jobMem: nil, wantLoads: 1, want: map[string]string{"SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_CPU": ""}},
		{name: "sbatch/salloc already exported it", image: true, jobMem: U64(700), preset: map[string]string{"SLURM_MEM_PER_NODE": "800"}, want: map[string]string{"SLURM_MEM_PER_NODE": "800", "SLURM_MEM_PER_CPU": ""}},
		{name: "per cpu already exported", image: true, jobMem: U64(700), preset: map[string]string{"SLURM_MEM_PER_CPU": "100"}, want: map[string]string{"SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_CPU": "100"}},
		{name: "no --microvm", jobMem: U64(700), want: map[string]string{"SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_CPU": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []string{"SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU"} {
				t.Setenv(k, "") // restored after the test
				ProcessUnsetenv(k)
			}
			t.Cleanup(func() {
				ProcessUnsetenv("SLURM_MEM_PER_NODE")
				ProcessUnsetenv("SLURM_MEM_PER_CPU")
			})
			for k, v := range tt.preset {
				t.Setenv(k, v)
			}
			f := newFakeLauncher(t)
			h := NewHost(Job{Context: CtxLocal, JobID: U32(51), JobMem: tt.jobMem, Argv: []string{"/bin/true"}}, f.args()...)
			h.Call(HookInit, -1)
			if tt.image {
				h.Option("microvm", "a.img", false)
			}
			if rc := h.Call(HookLocalUserInit, -1); rc != 0 {
				t.Fatalf("local_user_init = %d, log %q", rc, h.Log())
			}
			if got := h.LoadJobCalls(); got != tt.wantLoads {
				t.Errorf("%d slurm_load_job calls, want %d", got, tt.wantLoads)
			}
			for k, want := range tt.want {
				if got, _ := ProcessGetenv(k); got != want {
					t.Errorf("%s=%q, want %q", k, got, want)
				}
			}
			everyLinePrefixed(t, h.Log())
		})
	}
}

// slurmstepd hands the job's request to prepare, next to the allocation.
func TestRemoteStepPassesJobMemRequest(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    []string // after --mem-mb 0
		refused string
	}{
		{name: "--mem", env: map[string]string{"SLURM_MEM_PER_NODE": "700"}, want: []string{"--mem-per-node", "700", "--gpus"}},
		{name: "--mem-per-cpu", env: map[string]string{"SLURM_MEM_PER_CPU": "300"}, want: []string{"--mem-per-cpu", "300", "--gpus"}},
		{name: "both, as the job has them", env: map[string]string{"SLURM_MEM_PER_NODE": "2G", "SLURM_MEM_PER_CPU": "300"}, want: []string{"--mem-per-node", "2G", "--mem-per-cpu", "300", "--gpus"}},
		{name: "none", want: []string{"--gpus"}},
		{name: "too long to be a size", env: map[string]string{"SLURM_MEM_PER_NODE": strings.Repeat("9", 100)}, refused: "cannot read SLURM_MEM_PER_NODE of the job"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeLauncher(t)
			job := remoteJob()
			job.MemMB = U64(0)
			job.Env = tt.env
			h := NewHost(job, f.args()...)
			h.Call(HookInit, -1)
			h.Option("microvm", "a.img", true)
			if rc := h.Call(HookInitPostOpt, -1); rc != 0 {
				t.Fatalf("init_post_opt = %d, log %q", rc, h.Log())
			}
			calls := f.calls(t)
			if tt.refused != "" {
				if len(calls) != 0 {
					t.Errorf("launcher called: %q", argvs(calls))
				}
				if rc := h.Call(HookTaskInit, 0); rc == 0 || !logHas(h.Log(), tt.refused) {
					t.Errorf("task_init = %d, log %q; want refused with %q", rc, h.Log(), tt.refused)
				}
				return
			}
			if len(calls) != 1 {
				t.Fatalf("launcher calls %q, want one prepare", argvs(calls))
			}
			args := calls[0].args
			i := slices.Index(args, "--mem-mb")
			if i < 0 || args[i+1] != "0" {
				t.Fatalf("prepare %q lacks --mem-mb 0", args)
			}
			if got := args[i+2 : i+2+len(tt.want)]; !slices.Equal(got, tt.want) {
				t.Errorf("prepare %q: after --mem-mb 0 got %q, want %q", args, got, tt.want)
			}
		})
	}
}
