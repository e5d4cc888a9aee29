// Package fault is fault injection for tests and `slurm-microvm poc`:
// points in the supervisor where a step's start can be made to fail at a
// named stage, and behaviours a deliberately broken build shows, so that
// every poc check is seen to FAIL against one.
//
// Only a launcher built with the tag smv_faults has them (fault_on.go);
// the default build's At is a constant nil, so nothing a tenant or an
// admin writes can switch a fault on in a production binary. In an
// smv_faults build a fault is switched on by root only: a file in Dir
// (root-owned, not writable by group or others) named after the job id,
// or "all", holding stage names, one per line.
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

// StartStages are the start stages in the order the supervisor meets them.
var StartStages = []Stage{Image, Disk, Shares, VMM, Agent}

// Behaviours of a broken build (for the poc's can-fail tests).
const (
	// ShareRW exports every share read-write, ignoring :ro.
	ShareRW Stage = "share-rw"
	// LogEnv logs the task's environment in the supervisor's log.
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
