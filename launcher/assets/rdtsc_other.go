//go:build !amd64

package assets

func rdtsc() uint64 { return 0 }

const haveRDTSC = false
