package gpu_test

import (
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
)

func TestGuestVisibleDevices(t *testing.T) {
	for n, want := range map[int]string{0: "", 1: "0", 4: "0,1,2,3"} {
		if got := gpu.GuestVisibleDevices(n); got != want {
			t.Errorf("GuestVisibleDevices(%d) = %q, want %q", n, got, want)
		}
	}
	for _, tc := range []struct {
		host string
		n    int
		want string
	}{
		{"0,1,4,5", 4, "0,1,2,3"}, // global indices (no ConstrainDevices)
		{"0,1", 2, "0,1"},         // renumbered by ConstrainDevices
		{"", 2, "0,1"},
		{"GPU-8c1f-aa,GPU-77e2-bb", 2, "GPU-8c1f-aa,GPU-77e2-bb"}, // UUIDs (Slurm 25.11) name the same GPUs in the guest
	} {
		if got := gpu.GuestCUDAVisibleDevices(tc.host, tc.n); got != tc.want {
			t.Errorf("GuestCUDAVisibleDevices(%q, %d) = %q, want %q", tc.host, tc.n, got, tc.want)
		}
	}
}

func TestNormalizeBDF(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0", "0000:3b:00.1": "0000:3b:00.1", "3b:00.0": "0000:3b:00.0",
		"00000001:01:1f.7": "0001:01:1f.7", " 0000:18:00.0\n": "0000:18:00.0",
		"3b:00": "", "0000:3b:20.0": "", "0000:3b:00.8": "", "zz:00.0": "", "1:2:3:4.0": "",
	} {
		got, err := gpu.NormalizeBDF(in)
		if want == "" {
			if err == nil {
				t.Errorf("NormalizeBDF(%q) = %q, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("NormalizeBDF(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
