package gpu

import "context"

// NVML is the little of NVIDIA's management library the plan needs. The
// implementation over github.com/NVIDIA/go-nvml is package
// launcher/gpu/gpunvml; tests use go-nvml's mock package through it.
type NVML interface {
	// Devices returns every GPU NVML sees (those bound to the nvidia
	// driver). When the library cannot be loaded or initialised the error
	// wraps ErrNVMLUnavailable and says why.
	Devices(ctx context.Context) ([]NVMLDevice, error)
}

// NVMLDevice is one GPU as NVML reports it.
type NVMLDevice struct {
	// Index is NVML's (and nvidia-smi's) index. It is not the minor
	// number and not Slurm's index.
	Index int `json:"index"`
	// Minor is the N of /dev/nvidiaN.
	Minor int `json:"minor"`
	// BDF is the PCI address in sysfs form ("0000:3b:00.0").
	BDF  string `json:"bdf"`
	UUID string `json:"uuid"`
	Name string `json:"name,omitempty"`
	// MIG is the device's MIG mode.
	MIG MIGMode `json:"mig"`
	// Processes are the compute, graphics and MPS processes running on
	// it (nil when NVML could not list them; see ProcessesErr).
	Processes []NVMLProcess `json:"processes,omitempty"`
	// ProcessesErr says why processes could not be listed ("" when they
	// could).
	ProcessesErr string `json:"processes_err,omitempty"`
}

// MIGMode is a device's MIG mode.
type MIGMode struct {
	// Supported is false on GPUs without MIG.
	Supported bool `json:"supported"`
	// Current is the mode in effect, Pending the one after the next reset.
	Current bool `json:"current"`
	Pending bool `json:"pending"`
}

func (m MIGMode) String() string {
	switch {
	case !m.Supported:
		return "not supported"
	case m.Current && !m.Pending:
		return "enabled (disable pending)"
	case m.Current:
		return "enabled"
	case m.Pending:
		return "disabled (enable pending)"
	}
	return "disabled"
}

// NVMLProcess is one process NVML lists on a GPU.
type NVMLProcess struct {
	PID uint32 `json:"pid"`
	// UsedMemory is in bytes.
	UsedMemory uint64 `json:"used_memory"`
}
