package bench

import (
	"strings"
	"testing"
	"time"
)

func TestSplitLaunch(t *testing.T) {
	t0, _ := time.Parse(time.RFC3339Nano, "2026-12-02T01:00:00.000Z")
	at := func(ms int) string {
		return t0.Add(time.Duration(ms) * time.Millisecond).Format("2006-01-02T15:04:05.000Z07:00")
	}
	lines := []string{
		"time=" + at(300) + ` level=INFO msg="moved into step cgroup" step=1.0.0`,
		"time=" + at(300) + " level=INFO msg=phase step=1.0.0 phase=gpus ms=0",
		"time=" + at(301) + " level=INFO msg=phase step=1.0.0 phase=shares ms=1",
		"time=" + at(330) + " level=INFO msg=phase step=1.0.0 phase=image ms=29",
		"time=" + at(331) + " level=INFO msg=phase step=1.0.0 phase=mpi ms=1",
		"time=" + at(370) + " level=INFO msg=phase step=1.0.0 phase=assets ms=39",
		"time=" + at(371) + " level=INFO msg=phase step=1.0.0 phase=network ms=1",
		"time=" + at(3371) + ` level=INFO msg="boot timeline" step=1.0.0 total_ms=2990 vmm_ms=400 kernel_ms=2000 modules_ms=150 agent_init_ms=20 setup_wait_ms=0.5 setup_ms=419.5`,
		"time=" + at(3372) + " level=INFO msg=phase step=1.0.0 phase=boot ms=3001",
		"time=" + at(3380) + " level=INFO msg=phase step=1.0.0 phase=ready ms=8",
		"time=" + at(3600) + ` level=INFO msg="stopping sandbox" step=1.0.0 reason="context canceled"`,
		"time=" + at(3630) + " level=INFO msg=phase step=1.0.0 phase=stop ms=30",
	}
	r, err := splitLaunch(t0, t0.Add(3700*time.Millisecond), lines)
	if err != nil {
		t.Fatal(err)
	}
	var sum time.Duration
	got := map[string]time.Duration{}
	for _, p := range r.Parts {
		sum += p.D
		got[strings.TrimSpace(p.Name)] = p.D
	}
	if sum != r.Total || r.Total != 3700*time.Millisecond {
		t.Fatalf("parts add up to %s, total %s: %+v", sum, r.Total, r.Parts)
	}
	for name, want := range map[string]time.Duration{
		"Slurm step launch, plugin, supervisor start": 300 * time.Millisecond,
		"image (cached)":                               29 * time.Millisecond,
		"VMM prepare (fds, arguments)":                 11 * time.Millisecond,
		"kernel boot to PID 1":                         2000 * time.Millisecond,
		"task: exec entry, command in the guest, exit": 220 * time.Millisecond,
		"stop and Slurm's step end":                    100 * time.Millisecond,
	} {
		if got[name] != want {
			t.Errorf("%s: %s, want %s", name, got[name], want)
		}
	}
	if _, err := splitLaunch(t0, t0.Add(time.Second), lines[:3]); err == nil {
		t.Error("a log without the boot phase was split")
	}
}
