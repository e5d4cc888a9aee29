package assets

// rdtsc reads the time-stamp counter (RDTSC; not serialising, which is fine
// for a calibration over milliseconds).
func rdtsc() uint64

const haveRDTSC = true
