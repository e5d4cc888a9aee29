package fault

import "fmt"

// Stage names a fault.
type Stage string

// Start stages: the supervisor fails the step's start there.
const (
	Image  Stage = "image"  // before the image is resolved
	Disk   Stage = "disk"   // after the image's disk is made
	Shares Stage = "shares" // after the host shares are opened
	VMM    Stage = "vmm"    // instead of spawning the VMM
	Agent  Stage = "agent"  // after the VMM started, as if the agent never became ready
)

// StartStages are the start stages. The supervisor meets Shares before
// Image and Disk (it opens the host shares before it prepares the image).
var StartStages = []Stage{Image, Disk, Shares, VMM, Agent}

// Behaviours of a broken build (for the poc's can-fail tests).
const (
	// ShareRW exports every share read-write, ignoring :ro.
	ShareRW Stage = "share-rw"
	// LogEnv makes the exec entry (as the job's user) print each of the
	// task's environment variables on the task's stderr and write them to
	// /tmp/slurm-microvm-env-<job>.<step> (mode 0644).
	LogEnv Stage = "log-env"
	// LeakState leaves the step's state directory behind at stop.
	LeakState Stage = "leak-state"
)

// Dir holds the switches of an smv_faults build.
const Dir = "/run/slurm-microvm-faults"

// Injected is the error a start stage returns when its fault is on.
type Injected struct{ Stage Stage }

func (e *Injected) Error() string {
	return fmt.Sprintf("fault injected at stage %q (smv_faults build, %s)", e.Stage, Dir)
}
