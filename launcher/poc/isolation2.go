package poc

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
	"github.com/slurm-microvm/slurm-microvm/launcher/poc/report"
	"github.com/slurm-microvm/slurm-microvm/launcher/residue"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// oomReason is how the exec entry reports a task killed by the guest's
// OOM killer (not a program's own "out of memory" on a failed malloc).
var oomReason = regexp.MustCompile(`out-of-memory killer`)

// judgeMemory: the hog must fail with the reason on its stderr, the other
// tenant's step must complete.
func judgeMemory(hog Job, hogOut string, other Job, otherOut string) []string {
	var fails []string
	if hog.State == "COMPLETED" {
		fails = append(fails, "the step over its --mem completed")
	}
	if !oomReason.MatchString(hogOut) {
		fails = append(fails, fmt.Sprintf("the step over its --mem ended %s (exit %s) without naming the out-of-memory reason", hog.State, hog.ExitCode))
	}
	if other.State != "COMPLETED" || !strings.Contains(otherOut, "POC-DONE") {
		fails = append(fails, fmt.Sprintf("the other tenant's concurrent step ended %s (exit %s)", other.State, other.ExitCode))
	}
	return fails
}

func checkMemory(ctx context.Context, r *run, c *report.Check) {
	v := newVerdict(c)
	defer v.done()
	a, b := r.tenants[0], r.tenants[1]
	snap := residue.Take(r.scope)
	other, err := r.sbatch(ctx, b, "mem-other", r.srunLine("sh", "-c", "echo POC-UP; sleep 20; echo POC-DONE"), "-t", "5", "--mem=512", "-c1")
	if err != nil {
		v.fail("%v", err)
		return
	}
	v.job(other)
	if _, err := r.waitReady(ctx, other, 0, 5*time.Minute); err != nil {
		v.fail("%v", err)
	}
	hog, err := r.sbatch(ctx, a, "mem-hog", r.srunLine("tail", "/dev/zero"), "-t", "5", "--mem=512", "-c1")
	if err != nil {
		v.fail("%v", err)
		return
	}
	v.job(hog)
	hj, err := r.wait(ctx, hog, 6*time.Minute)
	if err != nil {
		v.fail("%v", err)
	}
	oj, err := r.wait(ctx, other, 6*time.Minute)
	if err != nil {
		v.fail("%v", err)
	}
	end := time.Now()
	for _, f := range judgeMemory(hj, hog.output(), oj, other.output()) {
		v.fail("%s", f)
	}
	if m := oomReason.FindString(hog.output()); m != "" {
		v.note("tenant A's step: %s, exit %s, reported %q", hj.State, hj.ExitCode, firstLineWith(hog.output(), m))
	}
	v.note("tenant B's step: %s, exit %s", oj.State, oj.ExitCode)
	r.cleanupAfter(ctx, v, snap, end)
}

// firstLineWith is the first line of s containing sub.
func firstLineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// cpuCount counts a cpuset list ("0-3,8,10-11"); 0 when it is not one.
func cpuCount(list string) int {
	n, err := cgroup.CountList(strings.TrimSpace(list))
	if err != nil {
		return 0
	}
	return n
}

var cpuIDs = regexp.MustCompile(`CPU_IDs=(\S+)`)

// judgeCPUs: the guest's vCPUs, the VMM's allowed CPUs and the job's
// allocation on the node are one number, below the node's when the job
// asked for less.
func judgeCPUs(guest, vmmAllowed, allocated, nodeCPUs int) []string {
	var fails []string
	if guest == 0 || vmmAllowed == 0 || allocated == 0 {
		return []string{fmt.Sprintf("not measured (guest %d, VMM %d, allocation %d)", guest, vmmAllowed, allocated)}
	}
	if guest != allocated {
		fails = append(fails, fmt.Sprintf("the guest sees %d CPUs, the job was allocated %d", guest, allocated))
	}
	if vmmAllowed != allocated {
		fails = append(fails, fmt.Sprintf("the VMM may run on %d CPUs, the job was allocated %d", vmmAllowed, allocated))
	}
	if nodeCPUs > allocated && guest >= nodeCPUs {
		fails = append(fails, fmt.Sprintf("the guest sees all %d CPUs of the node", nodeCPUs))
	}
	return fails
}

func checkCPUs(ctx context.Context, r *run, c *report.Check) {
	v := newVerdict(c)
	defer v.done()
	snap := residue.Take(r.scope)
	j, err := r.sbatch(ctx, r.tenants[0], "cpus", r.srunLine("sh", "-c", "echo POC-NPROC $(nproc); sleep 8"), "-t", "5", "-c1", "--mem=512")
	if err != nil {
		v.fail("%v", err)
		return
	}
	v.job(j)
	dir, err := r.waitReady(ctx, j, 0, 5*time.Minute)
	vmmAllowed := 0
	if err != nil {
		v.fail("%v", err)
	} else if p, err := state.ReadProc(dir + "/" + state.VMMPidFile); err == nil {
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid)); err == nil {
			if m := regexp.MustCompile(`(?m)^Cpus_allowed_list:\s*(\S+)`).FindSubmatch(st); m != nil {
				vmmAllowed = cpuCount(string(m[1]))
			}
		}
	}
	allocated := 0
	if out, _, _, err := r.slurm.Run(ctx, nil, "", "scontrol", "show", "job", "-d", strconv.Itoa(j.id)); err == nil {
		if m := cpuIDs.FindStringSubmatch(out); m != nil {
			allocated = cpuCount(m[1])
		}
	}
	jb, err := r.wait(ctx, j, 5*time.Minute)
	if err != nil {
		v.fail("%v", err)
	}
	end := time.Now()
	guest := 0
	if m := regexp.MustCompile(`POC-NPROC (\d+)`).FindStringSubmatch(j.output()); m != nil {
		guest, _ = strconv.Atoi(m[1])
	}
	if jb.State != "COMPLETED" {
		v.fail("the step ended %s (exit %s)", jb.State, jb.ExitCode)
	}
	for _, f := range judgeCPUs(guest, vmmAllowed, allocated, r.node.CPUs) {
		v.fail("%s", f)
	}
	v.note("-c1: guest nproc %d, VMM allowed CPUs %d, allocated %d, node %d", guest, vmmAllowed, allocated, r.node.CPUs)
	r.cleanupAfter(ctx, v, snap, end)
}

// gpuAnswer is the guest's line of the GPU check.
var gpuAnswer = regexp.MustCompile(`POC-GPUS (\d+) CVD=(\S*)`)

// judgeGPUs: a step that asked for n GPUs completed, and its guest has
// exactly n GPU devices and n entries in CUDA_VISIBLE_DEVICES.
func judgeGPUs(n int, jb Job, out string) []string {
	if jb.State != "COMPLETED" {
		return []string{fmt.Sprintf("%d GPUs: the step ended %s (exit %s)", n, jb.State, jb.ExitCode)}
	}
	got := gpuAnswer.FindStringSubmatch(out)
	if got == nil {
		return []string{fmt.Sprintf("%d GPUs: no answer from the guest", n)}
	}
	seen, _ := strconv.Atoi(got[1])
	cvd := 0
	if got[2] != "" {
		cvd = len(strings.Split(got[2], ","))
	}
	if seen != n || cvd != n {
		return []string{fmt.Sprintf("%d GPUs requested: the guest has %d GPU devices and CUDA_VISIBLE_DEVICES lists %d", n, seen, cvd)}
	}
	return nil
}

// judgeNetwork: the network step completed, listed its interfaces, and
// reached nothing it tried (POC-REACHED lines).
func judgeNetwork(jb Job, out, port string) []string {
	var fails []string
	if jb.State != "COMPLETED" || !strings.Contains(out, "POC-NET-DONE") {
		fails = append(fails, fmt.Sprintf("the step ended %s (exit %s)", jb.State, jb.ExitCode))
	}
	if !strings.Contains(out, "POC-IF ") && strings.Contains(out, "POC-NET-DONE") {
		fails = append(fails, "the guest listed no interface")
	}
	for _, m := range regexp.MustCompile(`POC-REACHED (\S+)`).FindAllStringSubmatch(out, -1) {
		fails = append(fails, fmt.Sprintf("the VM reached %s:%s", m[1], port))
	}
	return fails
}

// gpuRequest parses a GRES request "gpu[:type]:N" (Slurm gres.conf(5)
// Name[:Type]:Count) into its name with type and count.
func gpuRequest(gres string) (prefix string, n int, err error) {
	f := strings.Split(gres, ":")
	if len(f) < 2 || len(f) > 3 || f[0] != "gpu" {
		return "", 0, fmt.Errorf("--gres %q: want gpu:N or gpu:TYPE:N (Slurm gres.conf(5))", gres)
	}
	n, err = strconv.Atoi(f[len(f)-1])
	if err != nil || n < 1 {
		return "", 0, fmt.Errorf("--gres %q: the count must be a positive number", gres)
	}
	return strings.Join(f[:len(f)-1], ":"), n, nil
}

// nodeGPUs is the node's first GPU GRES as a request (gpu:TYPE:N), ""
// when it has none; Gres looks like "gpu:fake:2(S:0),gpu:standin:2".
func nodeGPUs(gres string) string {
	for _, g := range strings.Split(gres, ",") {
		g, _, _ = strings.Cut(g, "(")
		if strings.HasPrefix(g, "gpu:") {
			return g
		}
	}
	return ""
}

var gresIdx = regexp.MustCompile(`GRES=\S*\(IDX:([0-9,-]+)\)`)

func checkGPUs(ctx context.Context, r *run, c *report.Check) {
	v := newVerdict(c)
	defer v.done()
	req := r.o.GRES
	if req == "" {
		req = nodeGPUs(r.node.Gres)
	}
	if req == "" {
		v.skip("node %s has no GPU GRES (Slurm gres.conf(5)); pass --gres gpu:N on a GPU node", r.o.Node)
		return
	}
	prefix, all, err := gpuRequest(req)
	if err != nil {
		v.fail("%v", err)
		return
	}
	if strings.Contains(prefix, "standin") || strings.Contains(prefix, "fake") {
		r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("GPU checks ran on fake GRES (%s): no GPU of this node was passed through", prefix))
	}
	snap := residue.Take(r.scope)
	guest := `echo POC-GPUS $(ls /dev | grep -c '^nvidia[0-9][0-9]*$') CVD=$CUDA_VISIBLE_DEVICES`
	counts := []int{0, 1, all, 1}
	var idx []string
	for i, n := range counts {
		args := []string{"-t", "5", "--mem=1024"}
		if n > 0 {
			args = append(args, fmt.Sprintf("--gres=%s:%d", prefix, n))
		}
		j, jb, ok := r.runJob(ctx, v, r.tenants[i%2], fmt.Sprintf("gpus-%d", i), r.srunLine("sh", "-c", guest), 6*time.Minute, args...)
		if !ok {
			return
		}
		out, _, _, _ := r.slurm.Run(ctx, nil, "", "scontrol", "show", "job", "-d", strconv.Itoa(j.id))
		m := gresIdx.FindStringSubmatch(out)
		got := gpuAnswer.FindStringSubmatch(j.output())
		for _, f := range judgeGPUs(n, jb, j.output()) {
			v.fail("%s", f)
		}
		if got != nil {
			seen := got[1]
			where := ""
			if m != nil {
				where = " (IDX " + m[1] + ")"
			}
			v.note("%d GPUs requested: guest devices %s, CUDA_VISIBLE_DEVICES %q%s", n, seen, got[2], where)
		}
		if n == 1 {
			if m != nil {
				idx = append(idx, m[1])
			} else {
				idx = append(idx, "?")
			}
		}
	}
	if len(idx) == 2 && idx[0] != idx[1] {
		v.note("the second 1-GPU job got IDX %s, the first %s (Slurm chose another free GPU)", idx[1], idx[0])
	} else if len(idx) == 2 {
		v.note("the next job took the same GPU (IDX %s)", idx[0])
	}
	r.cleanupAfter(ctx, v, snap, time.Now())
}

func checkNetwork(ctx context.Context, r *run, c *report.Check) {
	v := newVerdict(c)
	defer v.done()
	port, _ := r.slurm.ConfigValue(ctx, "SlurmdPort")
	addr := "127.0.0.1"
	if out, _, _, err := r.slurm.Run(ctx, nil, "", "scontrol", "show", "node", "-o", r.o.Node); err == nil {
		if m := regexp.MustCompile(`NodeAddr=(\S+)`).FindStringSubmatch(out); m != nil {
			addr = m[1]
		}
	}
	snap := residue.Take(r.scope)
	guest := fmt.Sprintf(`for i in $(sed 1,2d /proc/net/dev | cut -d: -f1); do echo POC-IF $i; done
if ! command -v nc >/dev/null; then echo POC-NO-NC; else
  for h in %s 10.0.2.2 169.254.169.254; do timeout 3 nc $h %s </dev/null >/dev/null 2>&1 && echo POC-REACHED $h; done
fi
echo POC-NET-DONE`, addr, port)
	j, jb, ok := r.runJob(ctx, v, r.tenants[0], "net", r.srunLine("sh", "-c", guest), 5*time.Minute, "-t", "5")
	if !ok {
		return
	}
	end := time.Now()
	out := j.output()
	var ifs []string
	for _, m := range regexp.MustCompile(`POC-IF (\S+)`).FindAllStringSubmatch(out, -1) {
		ifs = append(ifs, m[1])
	}
	for _, f := range judgeNetwork(jb, out, port) {
		v.fail("%s", f)
	}
	v.note("network mode %s: guest interfaces %s", r.o.Config.Network.Mode, strings.Join(ifs, ","))
	switch {
	case len(ifs) == 1 && ifs[0] == "lo":
		v.note("a one-node step without services has no network device: it reaches nothing")
	case strings.Contains(out, "POC-NO-NC") && len(ifs) > 0:
		v.skip("the step's VM has interfaces %s but the image has no nc to try what they reach", strings.Join(ifs, ","))
		return
	}
	r.cleanupAfter(ctx, v, snap, end)
}
