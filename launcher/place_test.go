package launcher

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/placement"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// TestPlaceStep: the driver gets this process's CPUs when they are the
// step's own (here: fewer than a fake sysfs says the node has online),
// and none when they are the whole node or the driver places nothing.
func TestPlaceStep(t *testing.T) {
	self, err := placement.Of(os.Getpid(), placement.Host, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := cgroup.Parse(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	// A cgroup tree whose cpuset (where this process has one) allows
	// what the process may use.
	cg := t.TempDir()
	if cs, err := cgroup.Cpuset(ms, placement.Host.Cgroup); err == nil {
		rel, _ := filepath.Rel(placement.Host.Cgroup, cs.File)
		p := filepath.Join(cg, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(self.CPUs.String()+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sys := func(online string) string {
		d := t.TempDir()
		p := filepath.Join(d, "devices/system/cpu/online")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(online+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	s := &Spec{ID: state.StepID{Job: 4000000001}}
	for _, tt := range []struct {
		name   string
		online string
		caps   driver.Capabilities
		want   []int
		log    string
	}{
		{name: "the step's own CPUs", online: "0-1023", want: self.CPUs, log: "placement=\"cpus " + self.CPUs.String() + "\""},
		{name: "the whole node", online: self.CPUs.String(), want: nil, log: "not pinned"},
		{name: "a driver that places nothing", online: "0-1023", caps: driver.Capabilities{Placement: "no pinning here"}, want: nil, log: "no pinning here"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			cpus, nodes := placeStep(s, tt.caps, placement.Roots{Cgroup: cg, Sys: sys(tt.online)}, slog.New(slog.NewTextHandler(&buf, nil)))
			if !reflect.DeepEqual(cpus, tt.want) && !(len(cpus) == 0 && len(tt.want) == 0) {
				t.Errorf("host CPUs %v, want %v", cpus, tt.want)
			}
			if nodes != nil {
				t.Errorf("memory nodes %v on a sysfs without nodes", nodes)
			}
			if !strings.Contains(buf.String(), tt.log) {
				t.Errorf("log %q lacks %q", buf.String(), tt.log)
			}
		})
	}
}
