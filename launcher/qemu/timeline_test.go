package qemu

import (
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
)

func TestBootTimeline(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name  string
		total time.Duration
		m     *api.SetupResponse
		want  BootTimeline
	}{
		{"in order", 3000 * ms,
			&api.SetupResponse{AgentStartUs: 2000_000, ModulesDoneUs: 2150_000, ServingUs: 2170_000, SetupStartUs: 2171_000, SetupDoneUs: 2400_000},
			BootTimeline{Total: 3000 * ms, VMM: 600 * ms, Kernel: 2000 * ms, Modules: 150 * ms, AgentInit: 20 * ms, SetupWait: 1 * ms, Setup: 229 * ms}},
		{"guest clock ahead of the host's", 1000 * ms,
			&api.SetupResponse{AgentStartUs: 900_000, ModulesDoneUs: 1000_000, ServingUs: 1100_000, SetupStartUs: 1100_000, SetupDoneUs: 1200_000},
			BootTimeline{Total: 1000 * ms, VMM: 0, Kernel: 900 * ms, Modules: 100 * ms}},
		{"marks out of order", 1000 * ms,
			&api.SetupResponse{AgentStartUs: 500_000, ModulesDoneUs: 400_000, ServingUs: 600_000, SetupStartUs: 600_000, SetupDoneUs: 700_000},
			BootTimeline{Total: 1000 * ms, VMM: 300 * ms, Kernel: 500 * ms, AgentInit: 100 * ms, Setup: 100 * ms}},
		{"no marks (an agent without them)", 1000 * ms, &api.SetupResponse{},
			BootTimeline{Total: 1000 * ms, VMM: 1000 * ms}},
		{"a guest that lies (marks that would overflow a Duration)", 1000 * ms,
			&api.SetupResponse{AgentStartUs: 1 << 63, ModulesDoneUs: 1<<64 - 1, ServingUs: 5, SetupStartUs: 1 << 62, SetupDoneUs: 1<<64 - 1},
			BootTimeline{Total: 1000 * ms, Kernel: 1000 * ms}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := NewBootTimeline(c.total, c.m)
			if got != c.want {
				t.Fatalf("got %+v\nwant %+v", got, c.want)
			}
			if sum := got.VMM + got.Kernel + got.Modules + got.AgentInit + got.SetupWait + got.Setup; sum != got.Total {
				t.Fatalf("parts add up to %s, not the total %s", sum, got.Total)
			}
			for _, p := range []time.Duration{got.VMM, got.Kernel, got.Modules, got.AgentInit, got.SetupWait, got.Setup} {
				if p < 0 {
					t.Fatalf("a negative part: %+v", got)
				}
			}
		})
	}
}
