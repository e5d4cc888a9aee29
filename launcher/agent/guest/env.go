package guest

import "strings"

// stepOwnedPrefixes are the name prefixes of variables that Slurm and its
// PMI plugins set for a task: slurmstepd's SLURM_* and SLURMD_*, PMI-1/2's
// PMI_* and PMI2_*, PMIx's PMIX_* (the server's address among them).
var stepOwnedPrefixes = []string{"SLURM_", "SLURMD_", "PMI_", "PMI2_", "PMIX_"}

// stepOwnedNames are the device-selection variables that Slurm's gres/gpu
// plugin sets for a step with GPUs, and the launcher renumbers for the
// guest (CUDA_VISIBLE_DEVICES): the GPUs a process may use are the step's.
var stepOwnedNames = map[string]bool{
	"CUDA_VISIBLE_DEVICES": true,
	"GPU_DEVICE_ORDINAL":   true,
	"ROCR_VISIBLE_DEVICES": true,
	"ZE_AFFINITY_MASK":     true,
}

// StepOwned reports whether an environment variable name belongs to the
// step (Slurm, its PMI layer, the launcher) rather than to the image: such a
// name in the image's ENV is dropped, so an image cannot plant a job id, a
// rank or a PMIx server address that the task did not set. The launcher's
// MPI injection sets each of its variables in every task of a step that
// injects, so the task's value always wins over the image's for those.
func StepOwned(name string) bool {
	if stepOwnedNames[name] {
		return true
	}
	for _, p := range stepOwnedPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// MergeEnv is the environment of a task's process: the image's ENV
// overridden by the task's, names the step owns never from the image
// (StepOwned), and PATH the image's search path (DefaultPath when the
// image sets none), as the agent starts processes. Drivers that start
// processes without the agent (launcher/kata) use it so both agree.
func MergeEnv(image, task []string) []string {
	imagePath, ok := envValue(image, "PATH")
	if !ok {
		imagePath = DefaultPath
	}
	return withPath(mergeEnv(image, task), imagePath)
}
