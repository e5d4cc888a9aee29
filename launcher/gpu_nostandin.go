//go:build !smv_gpu_standin

package launcher

// standinGPUs is the end-to-end tests' hardware stand-in (gpu_standin.go);
// a production build has none: every GPU goes through VFIO.
func standinGPUs(stepGPUs, gresConf string) (int, bool) { return 0, false }
