//go:build !smv_faults

package fault

// Enabled is whether this build has fault injection (tag smv_faults).
const Enabled = false

// At returns *Injected when stage s is switched on for job; in this
// build never.
func At(job uint32, s Stage) error { return nil }

// On reports whether behaviour s is switched on for job; in this build
// never.
func On(job uint32, s Stage) bool { return false }
