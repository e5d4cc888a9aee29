package launcher

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

func TestGuestMemoryMiB(t *testing.T) {
	r := config.Defaults().Resources // overhead 256, default 1024, min 128
	tests := []struct {
		name    string
		spec    Spec
		cpus    int
		want    uint64
		wantErr []string
	}{
		{name: "nothing known: the default", spec: Spec{}, cpus: 4, want: 1024},
		{name: "allocation", spec: Spec{MemMiB: 4096}, cpus: 2, want: 3840},
		{name: "allocation, smallest that fits", spec: Spec{MemMiB: 384}, want: 128},
		{name: "allocation too small", spec: Spec{MemMiB: 383}, wantErr: []string{"step memory 383 MiB leaves less than 128 MiB", "ask for --mem=384M or more"}},
		{name: "allocation wins over the request", spec: Spec{MemMiB: 2048, MemPerNodeMiB: 700, MemPerCPUMiB: 100}, cpus: 2, want: 1792},
		// CR_Core: Slurm allocates no memory, the job asked --mem=700.
		{name: "no allocation: --mem", spec: Spec{MemPerNodeMiB: 700}, cpus: 1, want: 444},
		{name: "no allocation: --mem, cpus not known yet", spec: Spec{MemPerNodeMiB: 700}, want: 444},
		{name: "no allocation: --mem too small", spec: Spec{MemPerNodeMiB: 300}, cpus: 1, wantErr: []string{"the job's --mem=300M (SLURM_MEM_PER_NODE) leaves less than 128 MiB for the guest after the VMM's 256 MiB", "ask for --mem=384M or more"}},
		{name: "no allocation: --mem wins over --mem-per-cpu", spec: Spec{MemPerNodeMiB: 1000, MemPerCPUMiB: 100}, cpus: 2, want: 744},
		{name: "no allocation: --mem-per-cpu × cpus", spec: Spec{MemPerCPUMiB: 300}, cpus: 2, want: 344},
		{name: "no allocation: --mem-per-cpu × one cpu", spec: Spec{MemPerCPUMiB: 1024}, cpus: 1, want: 768},
		{name: "no allocation: --mem-per-cpu too small", spec: Spec{MemPerCPUMiB: 150}, cpus: 2, wantErr: []string{"--mem-per-cpu=150M (SLURM_MEM_PER_CPU) × 2 CPUs = 300 MiB leaves less than 128 MiB", "ask for --mem-per-cpu=192M or more, or --mem=384M"}},
		{name: "no allocation: --mem-per-cpu, cpus not known yet", spec: Spec{MemPerCPUMiB: 150}, want: 1024},
		// The step's memory cgroup (memory.max, memory.limit_in_bytes).
		{name: "no request: a limit above the default does not size the guest up", spec: Spec{MemLimitMiB: 2048}, cpus: 2, want: 1024},
		{name: "no request: the node's whole RAM as the limit (Slurm with no allocation)", spec: Spec{MemLimitMiB: 524288}, cpus: 2, want: 1024},
		{name: "no request: a limit below the default caps it", spec: Spec{MemLimitMiB: 900}, cpus: 2, want: 644},
		{name: "the cgroup limit below the allocation wins", spec: Spec{MemMiB: 4096, MemLimitMiB: 3072}, cpus: 2, want: 2816},
		{name: "the cgroup limit above the allocation: the allocation", spec: Spec{MemMiB: 1024, MemLimitMiB: 4096}, cpus: 2, want: 768},
		{name: "the cgroup limit below --mem", spec: Spec{MemPerNodeMiB: 1000, MemLimitMiB: 900}, cpus: 1, want: 644},
		{name: "the cgroup limit too small", spec: Spec{MemMiB: 1024, MemLimitMiB: 300}, wantErr: []string{"step memory 1024 MiB, capped by the step's cgroup memory limit of 300 MiB, leaves less than 128 MiB", "the site raises the step's memory limit"}},
		{name: "only a cgroup limit, too small", spec: Spec{MemLimitMiB: 300}, wantErr: []string{"the step's cgroup memory limit of 300 MiB leaves less than 128 MiB", "the site raises the step's memory limit"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := GuestMemoryMiB(&tt.spec, tt.cpus, r)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("= %d, want an error with %q", got, tt.wantErr)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("= %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

func TestGuestCPUs(t *testing.T) {
	for _, tt := range []struct {
		spec Spec
		want int
	}{
		{Spec{CPUs: 3, Cores: "0-7"}, 3},
		{Spec{Cores: "0-1,4"}, 3},
		{Spec{Cores: "junk"}, 1},
		{Spec{}, 1},
	} {
		if got := GuestCPUs(&tt.spec, 0); got != tt.want {
			t.Errorf("GuestCPUs(%+v) = %d, want %d", tt.spec, got, tt.want)
		}
	}
}

func TestParseSlurmMiB(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want uint64
		err  bool
	}{
		{"", 0, false}, {"0", 0, false}, {"700", 700, false}, {"700M", 700, false}, {"700m", 700, false},
		{"2G", 2048, false}, {"1T", 1 << 20, false}, {"1500K", 2, false}, {"1024K", 1, false},
		{"abc", 0, true}, {"-5", 0, true}, {"1.5G", 0, true}, {"G", 0, true}, {"700MB", 0, true}, {"99999999999999999999", 0, true},
	} {
		got, err := ParseSlurmMiB("SLURM_MEM_PER_NODE", tt.in)
		if tt.err {
			if err == nil || !strings.Contains(err.Error(), "SLURM_MEM_PER_NODE=") {
				t.Errorf("ParseSlurmMiB(%q) = %d, %v; want an error naming the variable", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseSlurmMiB(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}
}

func TestOverlayMiB(t *testing.T) {
	r := config.Defaults().Resources // overlay 1024
	for _, tt := range []struct{ guest, want uint64 }{{4096, 1024}, {1024, 512}, {96, 48}, {1, 1}} {
		if got := OverlayMiB(tt.guest, r); got != tt.want {
			t.Errorf("OverlayMiB(%d) = %d, want %d", tt.guest, got, tt.want)
		}
	}
}

// A request the guest cannot fit is refused at prepare, before anything
// boots, and a fitting one is recorded for the boot.
func TestPrepareSizesFromTheJobsRequest(t *testing.T) {
	cfg := config.Defaults()
	cfg.RuntimeDir = t.TempDir()
	l := &Launcher{Config: &cfg}
	small := &Spec{ID: state.StepID{Job: 8, Step: 1}, Image: "/img.tar", MemPerNodeMiB: 300}
	err := l.Prepare(context.Background(), small)
	if err == nil || !strings.Contains(err.Error(), "--mem=300M") || !strings.Contains(err.Error(), "ask for --mem=384M or more") {
		t.Fatalf("prepare of --mem=300 without an allocation: %v, want a refusal naming --mem", err)
	}
	if _, err := os.Stat(small.Dir(&cfg).Path()); !os.IsNotExist(err) {
		t.Errorf("a refused step left state: %v", err)
	}
	s := &Spec{ID: state.StepID{Job: 8, Step: 2}, Image: "/img.tar", MemPerNodeMiB: 700, MemPerCPUMiB: 0}
	if err := l.Prepare(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	got, err := ReadSpec(s.Dir(&cfg).Path())
	if err != nil {
		t.Fatal(err)
	}
	if mib, err := GuestMemoryMiB(got, GuestCPUs(got, 0), cfg.Resources); err != nil || mib != 700-256 {
		t.Errorf("recorded spec sizes the guest to %d MiB (%v), want %d", mib, err, 700-256)
	}
}
