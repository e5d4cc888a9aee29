package placement

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
)

// tree writes files (path relative to root: content) under a new root.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestParseList(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want CPUSet
		str  string
		err  bool
	}{
		{"0-3,8\n", CPUSet{0, 1, 2, 3, 8}, "0-3,8", false},
		{"5,1,1-2", CPUSet{1, 2, 5}, "1-2,5", false},
		{"", CPUSet{}, "", false},
		{"7", CPUSet{7}, "7", false},
		{"3-1", nil, "", true},
		{"a", nil, "", true},
		{"-1", nil, "", true},
	} {
		got, err := ParseList(tt.in)
		if (err != nil) != tt.err {
			t.Errorf("ParseList(%q) error %v, want error %v", tt.in, err, tt.err)
			continue
		}
		if tt.err {
			continue
		}
		if !got.Equal(tt.want) || got.String() != tt.str {
			t.Errorf("ParseList(%q) = %v (%q), want %v (%q)", tt.in, got, got.String(), tt.want, tt.str)
		}
	}
}

func TestVCPUs(t *testing.T) {
	for _, tt := range []struct {
		n    int
		cpus CPUSet
		want []int
	}{
		{2, CPUSet{0, 1}, []int{0, 1}},
		{2, CPUSet{1}, []int{1, 1}},
		{1, CPUSet{4, 5, 6}, []int{4}},
		{5, CPUSet{2, 7}, []int{2, 7, 2, 7, 2}},
		{3, CPUSet{}, nil},
	} {
		if got := VCPUs(tt.n, tt.cpus); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("VCPUs(%d, %v) = %v, want %v", tt.n, tt.cpus, got, tt.want)
		}
	}
}

// twoNodes is a sysfs tree of a host with CPUs 0-3 on node 0 and 4-7 on
// node 1, both with memory.
var twoNodes = map[string]string{
	"devices/system/cpu/online":             "0-7\n",
	"devices/system/node/node0/cpulist":     "0-3\n",
	"devices/system/node/node1/cpulist":     "4-7\n",
	"devices/system/node/has_memory":        "0-1\n",
	"devices/system/node/possible":          "0-1\n",
	"devices/system/node/node0/meminfo":     "",
	"devices/system/node/node1/meminfo":     "",
	"devices/system/node/online":            "0-1\n",
	"devices/system/node/has_normal_memory": "0-1\n",
}

func with(base map[string]string, more map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

func without(base map[string]string, key string) map[string]string {
	out := with(base, nil)
	delete(out, key)
	return out
}

func TestNode(t *testing.T) {
	for _, tt := range []struct {
		name   string
		sys    map[string]string
		cpus   CPUSet
		node   int
		ok     bool
		errHas string
	}{
		{name: "all on node 1", sys: twoNodes, cpus: CPUSet{5, 6}, node: 1, ok: true},
		{name: "all on node 0", sys: twoNodes, cpus: CPUSet{0}, node: 0, ok: true},
		{name: "over two nodes", sys: twoNodes, cpus: CPUSet{3, 4}},
		{name: "one node: nothing to choose", sys: map[string]string{"devices/system/node/node0/cpulist": "0-1\n"}, cpus: CPUSet{1}},
		{name: "no NUMA in the kernel", sys: map[string]string{"devices/system/cpu/online": "0-1"}, cpus: CPUSet{1}},
		{name: "node without memory", sys: with(twoNodes, map[string]string{"devices/system/node/has_memory": "0\n"}), cpus: CPUSet{4}},
		{name: "no has_memory file", sys: without(twoNodes, "devices/system/node/has_memory"), cpus: CPUSet{4}, node: 1, ok: true},
		{name: "malformed cpulist", sys: with(twoNodes, map[string]string{"devices/system/node/node0/cpulist": "x"}), cpus: CPUSet{4}, errHas: "node0/cpulist"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sys := tree(t, tt.sys)
			node, ok, err := Node(sys, tt.cpus)
			if tt.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("err = %v, want one naming %q", err, tt.errHas)
				}
				return
			}
			if err != nil || ok != tt.ok || (ok && node != tt.node) {
				t.Fatalf("Node = %d, %v, %v; want %d, %v", node, ok, err, tt.node, tt.ok)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	const job, step = 42, 0
	stepV1 := "/slurm/uid_1000/job_42/step_0"
	for _, tt := range []struct {
		name     string
		affinity CPUSet
		cgroups  string
		files    map[string]string
		want     Placement
		errHas   string
	}{
		{
			name: "v1 step cpuset on node 1", affinity: CPUSet{0, 1, 2, 3, 4, 5, 6, 7},
			cgroups: "3:cpuset:" + stepV1 + "\n1:memory:" + stepV1,
			files:   with(twoNodes, map[string]string{"fs/cgroup/cpuset" + stepV1 + "/cpuset.effective_cpus": "5-6\n", "fs/cgroup/cpuset" + stepV1 + "/cpuset.cpus": "0-7\n"}),
			want:    Placement{CPUs: CPUSet{5, 6}, Known: true, Cpuset: stepV1, Node: 1, HasNode: true},
		},
		{
			name: "v1 step cpuset on node 1, node 1 among its mems", affinity: CPUSet{0, 1, 2, 3, 4, 5, 6, 7},
			cgroups: "3:cpuset:" + stepV1,
			files:   with(twoNodes, map[string]string{"fs/cgroup/cpuset" + stepV1 + "/cpuset.effective_cpus": "5-6\n", "fs/cgroup/cpuset" + stepV1 + "/cpuset.effective_mems": "0-1\n"}),
			want:    Placement{CPUs: CPUSet{5, 6}, Known: true, Cpuset: stepV1, Node: 1, HasNode: true},
		},
		{
			name: "v1 step cpuset on node 1 that may not allocate there", affinity: CPUSet{0, 1, 2, 3, 4, 5, 6, 7},
			cgroups: "3:cpuset:" + stepV1,
			files:   with(twoNodes, map[string]string{"fs/cgroup/cpuset" + stepV1 + "/cpuset.effective_cpus": "5-6\n", "fs/cgroup/cpuset" + stepV1 + "/cpuset.effective_mems": "0\n"}),
			want:    Placement{CPUs: CPUSet{5, 6}, Known: true, Cpuset: stepV1, Node: 1, HasNode: false},
		},
		{
			name: "v2 step cpuset on node 0, mems without it", affinity: CPUSet{0, 1, 2, 3, 4, 5, 6, 7},
			cgroups: "0::/system.slice/slurmstepd.scope/job_42/step_0/slurm",
			files: with(twoNodes, map[string]string{"fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/slurm/cpuset.cpus.effective": "0-1",
				"fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/slurm/cpuset.mems.effective": "1"}),
			want: Placement{CPUs: CPUSet{0, 1}, Known: true, Cpuset: "/system.slice/slurmstepd.scope/job_42/step_0/slurm", Node: 0, HasNode: false},
		},
		{
			name: "v1 without effective_cpus", affinity: CPUSet{0, 1, 2, 3, 4, 5, 6, 7},
			cgroups: "3:cpuset:" + stepV1,
			files:   with(twoNodes, map[string]string{"fs/cgroup/cpuset" + stepV1 + "/cpuset.cpus": "3-4"}),
			want:    Placement{CPUs: CPUSet{3, 4}, Known: true, Cpuset: stepV1},
		},
		{
			name: "v1 whole node, the step's own cpuset", affinity: CPUSet{0, 1, 2, 3, 4, 5, 6, 7},
			cgroups: "3:cpuset:" + stepV1,
			files:   with(twoNodes, map[string]string{"fs/cgroup/cpuset" + stepV1 + "/cpuset.effective_cpus": "0-7"}),
			want:    Placement{CPUs: CPUSet{0, 1, 2, 3, 4, 5, 6, 7}, Known: true, Cpuset: stepV1},
		},
		{
			name: "v1 whole node, another step's cpuset", affinity: CPUSet{0, 1, 2, 3, 4, 5, 6, 7},
			cgroups: "3:cpuset:/slurm/uid_1000/job_42/step_1",
			files:   with(twoNodes, map[string]string{"fs/cgroup/cpuset/slurm/uid_1000/job_42/step_1/cpuset.effective_cpus": "0-7"}),
			want:    Placement{CPUs: CPUSet{0, 1, 2, 3, 4, 5, 6, 7}, Cpuset: "/slurm/uid_1000/job_42/step_1"},
		},
		{
			name: "v2 step cpuset", affinity: CPUSet{0, 1, 2, 3, 4, 5, 6, 7},
			cgroups: "0::/system.slice/slurmstepd.scope/job_42/step_0/slurm",
			files:   with(twoNodes, map[string]string{"fs/cgroup/system.slice/slurmstepd.scope/job_42/step_0/slurm/cpuset.cpus.effective": "0-1"}),
			want:    Placement{CPUs: CPUSet{0, 1}, Known: true, Cpuset: "/system.slice/slurmstepd.scope/job_42/step_0/slurm", Node: 0, HasNode: true},
		},
		{
			name: "v2 without the cpuset controller, whole node: not known", affinity: CPUSet{0, 1, 2, 3, 4, 5, 6, 7},
			cgroups: "0::/user.slice",
			files:   with(twoNodes, map[string]string{"fs/cgroup/user.slice/cgroup.procs": ""}),
			want:    Placement{CPUs: CPUSet{0, 1, 2, 3, 4, 5, 6, 7}},
		},
		{
			name: "taskset narrower than the node, root cpuset", affinity: CPUSet{1},
			cgroups: "3:cpuset:/",
			files:   with(twoNodes, map[string]string{"fs/cgroup/cpuset/cpuset.effective_cpus": "0-7"}),
			want:    Placement{CPUs: CPUSet{1}, Known: true, Cpuset: "/", Node: 0, HasNode: true},
		},
		{
			name: "affinity within the cpuset", affinity: CPUSet{4, 5},
			cgroups: "3:cpuset:" + stepV1,
			files:   with(twoNodes, map[string]string{"fs/cgroup/cpuset" + stepV1 + "/cpuset.effective_cpus": "4-7"}),
			want:    Placement{CPUs: CPUSet{4, 5}, Known: true, Cpuset: stepV1, Node: 1, HasNode: true},
		},
		{
			name: "disjoint affinity and cpuset", affinity: CPUSet{0},
			cgroups: "3:cpuset:" + stepV1,
			files:   with(twoNodes, map[string]string{"fs/cgroup/cpuset" + stepV1 + "/cpuset.effective_cpus": "4-7"}),
			errHas:  "share no CPU",
		},
		{
			name: "malformed cpuset", affinity: CPUSet{0},
			cgroups: "3:cpuset:" + stepV1,
			files:   with(twoNodes, map[string]string{"fs/cgroup/cpuset" + stepV1 + "/cpuset.effective_cpus": "4-x"}),
			errHas:  "cpuset.effective_cpus",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := tree(t, tt.files)
			ms, err := cgroup.Parse(strings.NewReader(tt.cgroups))
			if err != nil {
				t.Fatal(err)
			}
			got, err := decide(tt.affinity, ms, Roots{Cgroup: filepath.Join(root, "fs/cgroup"), Sys: root}, job, step)
			if tt.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("err = %v, want one with %q", err, tt.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("decide = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestOfSelf reads this process's own placement from the host: the CPUs
// are those it may run on.
func TestOfSelf(t *testing.T) {
	p, err := Of(os.Getpid(), Host, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			want, err := ParseList(v)
			if err != nil {
				t.Fatal(err)
			}
			if !p.CPUs.Intersect(want).Equal(p.CPUs) || len(p.CPUs) == 0 {
				t.Fatalf("placement CPUs %s not within the affinity %s", p.CPUs, want)
			}
		}
	}
}
