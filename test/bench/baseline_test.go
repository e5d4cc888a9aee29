package bench

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// ociRuntimes are the container baselines, Slurm's own `srun --container`
// with each runtime of the cluster's oci.conf (cluster.OCIConf).
var ociRuntimes = []string{"runc", "crun"}

// BenchmarkBaselines puts `srun --microvm=IMG true` side by side with what
// a user would pick instead, in the same shape (stepShape) and as the
// same unprivileged user: `srun true` on the host and Slurm's own `srun
// --container=BUNDLE true` with runc and with crun (oci.conf as Slurm
// 22.05's containers guide gives it, cluster.OCIConf), the bundle made from
// the microVM step's own image (harness.OCIBundle). See measureBaselines.
func BenchmarkBaselines(b *testing.B) {
	e := harness.SetupWith(b, func(o *cluster.Options) { o.OCIRuntime = ociRuntimes[0] })
	report.Environment(qemu.DetectAccel(), e.Kernel)
	measureBaselines(b, e, harness.OCIBundle(b, e.Image, harness.OCIBundleDir))
}

// measureBaselines times the four commands of the baseline section,
// rounds times each, alternating (the order rotates every round, so no
// command always runs first or after the VM), as cluster.TestUser, and
// adds the medians and the ratios microVM/runc, microVM/crun, runc/host
// and crun/host to the report. The cluster must have been started with
// cluster.Options.OCIRuntime; the runtime is switched by rewriting
// oci.conf before each container step (every step's slurmstepd reads it;
// test/e2e TestSrunContainer proves both). Before timing, each container
// runtime must run `cat /proc/self/uid_map` in a user namespace whose root
// is the test user: without a working oci.conf Slurm ignores --container
// and runs the command on the host, so a failing baseline cannot pass for
// a fast one. A runtime that fails the check is left out with its reason
// as an error of b; a step that fails while timed fails b.
func measureBaselines(b *testing.B, e *harness.Env, bundle string) {
	shape := []string{stepShape[0], stepShape[1]}
	run := func(args ...string) (string, string, int) {
		return e.Srun(b, cluster.TestUser, append(append([]string{}, shape...), args...)...)
	}
	type cmd struct {
		name, command string
		runtime       string // OCI runtime to switch to first; "" none
		args          []string
		times         []time.Duration
	}
	cmds := []*cmd{
		{name: "srun true (host)", args: []string{"true"}},
	}
	want := "0 " + strconv.Itoa(e.TestUID) + " 1"
	for _, rt := range ociRuntimes {
		if err := e.C.SetOCIRuntime(rt); err != nil {
			b.Fatal(err)
		}
		out, errOut, code := run("--container="+bundle, "cat", "/proc/self/uid_map")
		if got := strings.Join(strings.Fields(out), " "); code != 0 || got != want {
			b.Errorf("baseline srun --container with %s left out: `srun %s --container=%s cat /proc/self/uid_map` as %s: exit %d, uid_map %q (want %q: the container's root is the user)\nstderr: %s\nslurmd.log:\n%s",
				rt, strings.Join(shape, " "), bundle, cluster.TestUser, code, got, want, errOut, e.C.LogTail("slurmd.log", 20))
			continue
		}
		cmds = append(cmds, &cmd{name: "srun --container true (" + rt + ")", runtime: rt, args: []string{"--container=" + bundle, "true"},
			command: fmt.Sprintf("srun %s --container=BUNDLE true, oci.conf: %s run, rootless", strings.Join(shape, " "), rt)})
	}
	// The per-user image cache of the microVM path is warmed first, as
	// BenchmarkStepLaunch does.
	if _, errOut, code := run("--microvm="+e.Image, "true"); code != 0 {
		b.Fatalf("srun --microvm true as %s: exit %d: %s", cluster.TestUser, code, errOut)
	}
	cmds = append(cmds, &cmd{name: "srun --microvm true", args: []string{"--microvm=" + e.Image, "true"}})
	for _, c := range cmds {
		if c.command == "" {
			c.command = "srun " + strings.Join(append(append([]string{}, shape...), c.args...), " ")
			c.command = strings.Replace(c.command, e.Image, "IMG", 1)
		}
	}

	for i := 0; i < rounds; i++ {
		for j := range cmds {
			c := cmds[(i+j)%len(cmds)]
			if c.runtime != "" {
				if err := e.C.SetOCIRuntime(c.runtime); err != nil {
					b.Fatal(err)
				}
			}
			t0 := time.Now()
			_, errOut, code := run(c.args...)
			d := time.Since(t0)
			if code != 0 {
				b.Fatalf("%s: exit %d: %s", c.command, code, errOut)
			}
			c.times = append(c.times, d)
		}
	}

	med := map[string]time.Duration{}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nbaselines as %s, %s, median of %d, alternating\n", cluster.TestUser, strings.Join(shape, " "), rounds)
	for _, c := range cmds {
		m := median(c.times)
		med[c.name] = m
		report.Add(Figure{Section: "baseline", Name: c.name, Value: ms(m), Unit: "ms", Command: c.command})
		fmt.Fprintf(&sb, "  %-34s %9.1f ms   %s\n", c.name, ms(m), c.command)
	}
	host, vm := med["srun true (host)"], med["srun --microvm true"]
	for _, rt := range ociRuntimes {
		ctr, ok := med["srun --container true ("+rt+")"]
		if !ok {
			continue
		}
		for _, r := range []struct {
			name     string
			num, den time.Duration
		}{
			{"srun --microvm / srun --container (" + rt + ")", vm, ctr},
			{"srun --container (" + rt + ") / srun (host)", ctr, host},
		} {
			v := float64(r.num) / float64(r.den)
			report.Add(Figure{Section: "baseline", Name: r.name, Value: v, Unit: "ratio",
				Command: "medians of the commands above, measured side by side"})
			fmt.Fprintf(&sb, "  %-46s %6.2f\n", r.name, v)
		}
	}
	b.Log(sb.String())
	b.ReportMetric(ms(host), "host-ms")
	b.ReportMetric(ms(vm), "microvm-ms")
	for _, rt := range ociRuntimes {
		if ctr, ok := med["srun --container true ("+rt+")"]; ok {
			b.ReportMetric(ms(ctr), rt+"-ms")
		}
	}
}
