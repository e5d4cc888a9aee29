package guest

import (
	"slices"
	"testing"
)

// TestMergeEnvStepOwned: the image's ENV gives defaults, the task's values
// win, and names the step owns never come from the image, even when the
// task does not set them.
func TestMergeEnvStepOwned(t *testing.T) {
	tests := []struct {
		name        string
		image, task []string
		want        []string
	}{
		{"image defaults, task wins",
			[]string{"LANG=C.UTF-8", "FOO=image"}, []string{"FOO=task", "HOME=/home/u"},
			[]string{"LANG=C.UTF-8", "FOO=task", "HOME=/home/u"}},
		{"fake job id from the image, task sets it",
			[]string{"SLURM_JOB_ID=999", "A=1"}, []string{"SLURM_JOB_ID=42"},
			[]string{"A=1", "SLURM_JOB_ID=42"}},
		{"Slurm variables the task does not set",
			[]string{"SLURM_ARRAY_JOB_ID=7", "SLURMD_NODENAME=fake", "SLURM_MICROVM_STATE=/x", "A=1"}, nil,
			[]string{"A=1"}},
		{"PMIx server address from the image",
			[]string{"PMIX_SERVER_URI41=pmix-server.1;tcp4://10.0.0.9:1234", "PMIX_NAMESPACE=evil"}, []string{"B=2"},
			[]string{"B=2"}},
		{"PMI-2 descriptor and rank from the image",
			[]string{"PMI_FD=5", "PMI_RANK=0", "PMI2_X=1"}, nil,
			nil},
		{"GPU selection from the image",
			[]string{"CUDA_VISIBLE_DEVICES=0,1", "ROCR_VISIBLE_DEVICES=0", "GPU_DEVICE_ORDINAL=0", "ZE_AFFINITY_MASK=0", "NVIDIA_VISIBLE_DEVICES=all"}, nil,
			[]string{"NVIDIA_VISIBLE_DEVICES=all"}},
		{"step-owned names the task sets pass",
			nil, []string{"SLURM_PROCID=3", "PMIX_RANK=3", "CUDA_VISIBLE_DEVICES=0"},
			[]string{"SLURM_PROCID=3", "PMIX_RANK=3", "CUDA_VISIBLE_DEVICES=0"}},
		{"look-alike names stay the image's",
			[]string{"MY_SLURM_JOB_ID=1", "SLURMX=2", "PMIXY=3", "slurm_job_id=4"}, nil,
			[]string{"MY_SLURM_JOB_ID=1", "SLURMX=2", "PMIXY=3", "slurm_job_id=4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mergeEnv(tt.image, tt.task); !slices.Equal(got, tt.want) {
				t.Errorf("mergeEnv(%q, %q) = %q, want %q", tt.image, tt.task, got, tt.want)
			}
		})
	}
}
