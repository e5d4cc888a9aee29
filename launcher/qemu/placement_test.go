package qemu_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/placement"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// threadAffinity reads a thread's allowed CPUs from the kernel
// (/proc/<pid>/task/<tid>/status Cpus_allowed_list).
func threadAffinity(t *testing.T, pid, tid int) placement.CPUSet {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
	if err != nil {
		t.Fatalf("VMM thread %d: %v", tid, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			c, err := placement.ParseList(v)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
	}
	t.Fatalf("VMM thread %d: no Cpus_allowed_list", tid)
	return nil
}

// TestPlacement boots real VMs with 2 vCPUs on a given allocation and
// reads every VMM thread's affinity from the kernel: vCPU i runs on the
// allocation's i-th CPU (round robin on a 1-CPU allocation), the VMM's
// other threads on the whole allocation, also after the guest did I/O;
// every thread stays in this process's cgroups (the step's, in the
// supervisor); with MemoryNodes the guest RAM is bound to that node
// (/proc/<pid>/numa_maps); with no allocation nothing is pinned.
func TestPlacement(t *testing.T) {
	fixture.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	self, err := placement.Of(os.Getpid(), placement.Host, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	cgroups, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	e := newVMEnv(t, ctx, "Placement OS", nil)
	type tc struct {
		name  string
		host  []int
		nodes []int
		want  []int // each vCPU's host CPU; nil: not pinned
	}
	last := self.CPUs[len(self.CPUs)-1]
	cases := []tc{
		{name: "one CPU for two vCPUs", host: []int{last}, want: []int{last, last}},
		{name: "no allocation", want: nil},
	}
	if len(self.CPUs) >= 2 {
		a, b := self.CPUs[0], self.CPUs[1]
		cases = append([]tc{{name: "two vCPUs on two CPUs, memory on node 0", host: []int{a, b}, nodes: []int{0}, want: []int{a, b}}}, cases...)
	} else if os.Getenv("CI") == "true" {
		t.Errorf("this host lets the test use CPUs %s: the two-CPU case needs two", self.CPUs)
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stateDir := e.stateDir(t, "state"+strconv.Itoa(i))
			cfg := jobConfig("place"+strconv.Itoa(i), stateDir, e.disk)
			cfg.CPUs, cfg.HostCPUs, cfg.MemoryNodes = 2, c.host, c.nodes
			sb, err := e.driver(true).Start(ctx, cfg)
			if err != nil {
				t.Fatalf("start: %v", err)
			}
			t.Cleanup(func() { _ = sb.Stop(context.Background()) })
			pid := sb.Pid()
			run := serve(t, ctx, sb, stateDir)
			// I/O in the guest: QEMU may start worker threads for it.
			out, st, err := run("sh", "-c", "nproc; cat /bin/busybox > /tmp/copy && sync && wc -c < /tmp/copy")
			if err != nil || st.Code != 0 {
				t.Fatalf("guest: %q, %v, %v", out, st, err)
			}
			if f := strings.Fields(out); len(f) == 0 || f[0] != "2" {
				t.Errorf("guest nproc: %q, want 2", out)
			}
			threads, err := qemu.Threads(pid)
			if err != nil {
				t.Fatal(err)
			}
			all := placement.CPUSet(c.host)
			if c.want == nil {
				all = self.CPUs
			}
			vcpus := 0
			for _, th := range threads {
				got := threadAffinity(t, pid, th.TID)
				want := all
				if th.VCPU >= 0 {
					vcpus++
					if c.want != nil {
						want = placement.CPUSet{c.want[th.VCPU]}
					}
				}
				if !got.Equal(want) {
					t.Errorf("VMM thread %d %q: affinity %s, want %s", th.TID, th.Name, got, want)
				} else {
					t.Logf("VMM thread %d %q: affinity %s", th.TID, th.Name, got)
				}
				cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/cgroup", pid, th.TID))
				if err != nil {
					t.Fatal(err)
				}
				if string(cg) != string(cgroups) {
					t.Errorf("VMM thread %d %q: cgroups\n%s\nwant the supervisor's\n%s", th.TID, th.Name, cg, cgroups)
				}
			}
			if vcpus != 2 {
				t.Errorf("%d vCPU threads (named \"CPU n/...\") among %d, want 2", vcpus, len(threads))
			}
			maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/numa_maps", pid))
			if err != nil {
				prereq.Missing(t, "no NUMA maps to check the memory binding (a kernel with CONFIG_NUMA): %v", err)
			}
			bound := strings.Contains(string(maps), " bind:0 ")
			if bound != (len(c.nodes) > 0) {
				t.Errorf("guest RAM bound to node 0: %v, want %v", bound, len(c.nodes) > 0)
			}
		})
	}
}
