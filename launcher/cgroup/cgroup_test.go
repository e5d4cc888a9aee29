package cgroup

import (
	"testing"
)

func TestStepDirName(t *testing.T) {
	for step, want := range map[uint32]string{0: "step_0", 7: "step_7", 0xfffffffb: "step_batch", 0xfffffffc: "step_extern", 0xfffffffa: "step_interactive"} {
		if got := StepDirName(step); got != want {
			t.Errorf("StepDirName(%d) = %q, want %q", step, got, want)
		}
	}
}

func TestCountList(t *testing.T) {
	tests := []struct {
		in   string
		want int
		bad  bool
	}{
		{"0", 1, false}, {"0-3", 4, false}, {"0-1,4,6-7", 5, false}, {"", 0, false},
		{"3-1", 0, true}, {"a", 0, true}, {"1-x", 0, true},
	}
	for _, tt := range tests {
		got, err := CountList(tt.in)
		if (err != nil) != tt.bad || got != tt.want {
			t.Errorf("CountList(%q) = %d, %v; want %d, bad=%v", tt.in, got, err, tt.want, tt.bad)
		}
	}
}

func TestInStep(t *testing.T) {
	for _, tt := range []struct {
		path string
		want bool
	}{
		{"/slurm/uid_1000/job_42/step_0", true},
		{"/system.slice/slurmstepd.scope/job_42/step_0/slurm", true},
		{"/slurm/uid_1000/job_42/step_0/task_1", true},
		{"/slurm/uid_1000/job_42/step_01", false},
		{"/slurm/uid_1000/job_142/step_0", false},
		{"/slurm/uid_1000/job_42", false},
		{"/slurm/uid_1000/job_42/step_batch", false},
		{"/", false},
	} {
		if got := InStep(tt.path, 42, 0); got != tt.want {
			t.Errorf("InStep(%q, 42, 0) = %v, want %v", tt.path, got, tt.want)
		}
	}
}
