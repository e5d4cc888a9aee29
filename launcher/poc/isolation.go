package poc

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/poc/report"
	"github.com/slurm-microvm/slurm-microvm/launcher/residue"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

func isolationChecks() []checkDef {
	return []checkDef{
		{"isolation.files", "each tenant's step reaches only its own paths (direct, planted symlink, '..'), read-only shares refuse writes, the other tree is unchanged", checkFiles},
		{"isolation.credentials", "a secret in one job's environment appears nowhere the other tenant can read; its control socket refuses the other user", checkCredentials},
		{"isolation.memory", "a step over its --mem fails alone with the reason; the other tenant's concurrent step completes; the node stays in service", checkMemory},
		{"isolation.cpus", "a step sees only its allocated CPUs (guest vCPUs = the VMM's allowed CPUs = the allocation)", checkCPUs},
		{"isolation.gpus", "requests of 0, 1 and all GPUs give exactly the allocated devices; the next job takes the same GPU", checkGPUs},
		{"isolation.network", "a step's VM reaches no node address or service and no other step's VM", checkNetwork},
	}
}

// pairs runs f for (A attacks B) and (B attacks A) at once.
func (r *run) pairs(f func(x, y *Tenant)) {
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); f(r.tenants[i], r.tenants[1-i]) }()
	}
	wg.Wait()
}

var readLine = regexp.MustCompile(`(?m)^POC-READ (\S+) ([0-9a-f]{64})`)
var rcLine = regexp.MustCompile(`(?m)^POC-RC (\S+) (\d+)`)

// fileHashes are the sha256 of every regular file under dir.
func fileHashes(dir string) map[string]string {
	out := map[string]string{}
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if b, err := readRegular(p, maxRead, nil); err == nil {
				out[fmt.Sprintf("%x", sha256.Sum256(b))] = p
			}
		}
		return nil
	})
	return out
}

// judgeFiles reads an attacker job's output: its own share must be
// readable (POC-OWN), no read may return a file of the victim (hashes),
// every refused mount must have failed (POC-RC name non-zero) and no
// write into the read-only share may have succeeded.
func judgeFiles(out string, victim map[string]string, mounts []string) []string {
	var fails []string
	if !strings.Contains(out, "POC-OWN ok") {
		fails = append(fails, "the step could not read its own share")
	}
	for _, m := range readLine.FindAllStringSubmatch(out, -1) {
		if p, ok := victim[m[2]]; ok {
			fails = append(fails, fmt.Sprintf("read the other tenant's %s through %s", filepath.Base(p), m[1]))
		}
	}
	rcs := map[string]string{}
	for _, m := range rcLine.FindAllStringSubmatch(out, -1) {
		rcs[m[1]] = m[2]
	}
	for _, name := range mounts {
		switch rc, ok := rcs[name]; {
		case !ok:
			fails = append(fails, "no result for the mount attempt "+name)
		case rc == "0":
			fails = append(fails, "the mount "+name+" was accepted")
		}
	}
	if strings.Contains(out, "POC-WROTE") {
		fails = append(fails, "a write into the read-only share succeeded")
	}
	return fails
}

func checkFiles(ctx context.Context, r *run, c *report.Check) {
	v := newVerdict(c)
	defer v.done()
	snap := residue.Take(r.scope)
	// Each tenant plants, in its own share, links into the other's tree.
	for i, x := range r.tenants {
		y := r.tenants[1-i]
		own := filepath.Join(r.treeOf(x), "own")
		for name, target := range map[string]string{
			"link-file": filepath.Join(r.treeOf(y), "own", "data.txt"),
			"link-dir":  r.treeOf(y),
		} {
			if err := r.asUser(ctx, x, "", "ln", "-sfn", target, filepath.Join(own, name)); err != nil {
				v.fail("plant %s: %v", name, err)
				return
			}
		}
	}
	before := map[string]string{}
	for _, t := range r.tenants {
		s, err := treeSum(r.treeOf(t))
		if err != nil {
			v.fail("%v", err)
			return
		}
		before[t.Label] = s
	}
	mounts := []string{"other-tree", "own-symlink", "own-dotdot"}
	var mu sync.Mutex
	r.pairs(func(x, y *Tenant) {
		xr, yr := r.treeOf(x), r.treeOf(y)
		rel, _ := filepath.Rel(filepath.Join(xr, "own"), yr)
		guest := `cat /data/data.txt >/dev/null && echo "POC-OWN ok"
for p in "$@"; do
  if [ -f "$p" ]; then echo "POC-READ $p $(sha256sum < "$p" | cut -d' ' -f1)"; fi
done
if (echo x > /data/poc-write) 2>/dev/null; then echo POC-WROTE; fi
`
		targets := []string{yr + "/own/data.txt", yr + "/private.txt", "/data/link-file", "/data/link-dir/own/data.txt",
			"/data/link-dir/private.txt", "/data/" + rel + "/private.txt", "/data/../../../../../../" + strings.TrimPrefix(yr, "/") + "/private.txt"}
		body := r.srunLine(append([]string{"--microvm-mounts=" + xr + "/own:/data", "sh", "-c", guest, "poc"}, targets...)...) + "\n"
		probe := []string{"sh", "-c", `for f in /y/data.txt /y/own/data.txt /y/private.txt; do [ -f $f ] && echo "POC-READ $f $(sha256sum < $f | cut -d' ' -f1)"; done; true`}
		for name, src := range map[string]string{
			"other-tree":  yr + "/own",
			"own-symlink": xr + "/own/link-dir",
			"own-dotdot":  xr + "/own/" + rel,
		} {
			body += r.srunLine(append([]string{"--microvm-mounts=" + src + ":/y"}, probe...)...) + "\n"
			body += fmt.Sprintf("echo \"POC-RC %s $?\"\n", name)
		}
		j, err := r.sbatch(ctx, x, "files", body, "-t", "10")
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			v.fail("%v", err)
			return
		}
		v.job(j)
		if _, err := r.wait(ctx, j, 10*time.Minute); err != nil {
			v.fail("%v", err)
		}
		out := j.output()
		for _, f := range judgeFiles(out, fileHashes(yr), mounts) {
			v.fail("tenant %s: %s", x.Label, f)
		}
		for _, m := range rcLine.FindAllStringSubmatch(out, -1) {
			v.note("tenant %s: mount %s: exit %s", x.Label, m[1], m[2])
		}
	})
	end := time.Now()
	for _, t := range r.tenants {
		after, err := treeSum(r.treeOf(t))
		if err != nil {
			v.fail("%v", err)
		} else if after != before[t.Label] {
			v.fail("tenant %s's tree changed (digest %s.. -> %s..)", t.Label, before[t.Label][:12], after[:12])
		} else {
			v.note("tenant %s's tree byte-for-byte unchanged (sha256 %s..)", t.Label, after[:12])
		}
	}
	r.cleanupAfter(ctx, v, snap, end)
}

// asTenant runs argv as t and reports whether it exited 0.
func (r *run) asTenant(ctx context.Context, t *Tenant, argv ...string) bool {
	_, _, code, err := r.slurm.Run(ctx, t, "", argv[0], argv[1:]...)
	return err == nil && code == 0
}

// secretHits lists the files under roots whose content holds secret.
func secretHits(roots []string, secret string) []string {
	var hits []string
	for _, root := range roots {
		_ = filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err != nil || !fi.Mode().IsRegular() || fi.Size() > 64<<20 {
				return nil
			}
			if b, err := readRegular(p, maxRead, nil); err == nil && strings.Contains(string(b), secret) {
				hits = append(hits, p)
			}
			return nil
		})
	}
	return hits
}

// exposedTo lists the hits that t can open for reading (checked by the
// kernel, as t).
func (r *run) exposedTo(ctx context.Context, t *Tenant, hits []string) []string {
	var out []string
	for _, h := range hits {
		if r.asTenant(ctx, t, "/bin/sh", "-c", `exec cat -- "$1" >/dev/null 2>&1`, "poc", h) {
			out = append(out, h)
		}
	}
	return out
}

// scanRoots are where a job's data could land on the node.
func (r *run) scanRoots(ctx context.Context) []string {
	c := r.o.Config
	roots := []string{c.RuntimeDir, "/tmp", "/var/tmp", "/dev/shm"}
	if c.Log.Dir != "" {
		roots = append(roots, c.Log.Dir)
	}
	if c.Mounts.ScratchBase != "" {
		roots = append(roots, c.Mounts.ScratchBase)
	}
	if lf, _ := r.slurm.ConfigValue(ctx, "SlurmdLogFile"); lf != "" && lf != "(null)" {
		roots = append(roots, strings.ReplaceAll(lf, "%n", r.o.Node))
	}
	return roots
}

func checkCredentials(ctx context.Context, r *run, c *report.Check) {
	v := newVerdict(c)
	defer v.done()
	a, b := r.tenants[0], r.tenants[1]
	secret := r.data(a).secret
	snap := residue.Take(r.scope)
	j, err := r.sbatch(ctx, a, "cred", r.srunLine("sh", "-c", "echo POC-UP; sleep 60"), "-t", "5")
	if err != nil {
		v.fail("%v", err)
		return
	}
	v.job(j)
	dir, err := r.waitReady(ctx, j, 0, 5*time.Minute)
	if err != nil {
		v.fail("%v", err)
		return
	}
	if err := r.waitOutput(ctx, j, "POC-UP", 2*time.Minute); err != nil {
		v.fail("%v", err)
	}
	// The other tenant, on the host.
	if r.asTenant(ctx, b, r.o.Launcher, "poc-probe", "connect", filepath.Join(dir, state.ControlSocket)) {
		v.fail("tenant B connected to tenant A's control socket")
	} else {
		v.note("tenant B: A's control socket refused")
	}
	for _, f := range []string{state.SpecFile, state.LauncherLog, state.ConsoleLog, state.SupervisorFile, state.VMMPidFile} {
		if r.asTenant(ctx, b, "/bin/sh", "-c", `exec cat -- "$1" >/dev/null 2>&1`, "poc", filepath.Join(dir, f)) {
			v.fail("tenant B read A's state file %s", f)
		}
	}
	if pids, err := r.slurm.StepPids(ctx, j.id, 0); err == nil {
		for _, p := range pids {
			if r.asTenant(ctx, b, "/bin/sh", "-c", `exec cat -- "$1" >/dev/null 2>&1`, "poc", fmt.Sprintf("/proc/%d/environ", p)) {
				v.fail("tenant B read /proc/%d/environ of A's step", p)
			}
		}
		v.note("tenant B: environ of A's %d step processes unreadable", len(pids))
	}
	if vmm, err := state.ReadProc(filepath.Join(dir, state.VMMPidFile)); err == nil {
		if r.asTenant(ctx, b, "/bin/sh", "-c", `exec cat -- "$1" >/dev/null 2>&1`, "poc", fmt.Sprintf("/proc/%d/environ", vmm.Pid)) {
			v.fail("tenant B read the environ of A's VMM")
		}
	}
	// The other tenant, in its own guest: A's secret in no process,
	// no temporary file. The pattern comes from a file, not argv.
	pat := filepath.Join(r.treeOf(b), "own", "pattern")
	if err := r.writeAs(ctx, b, pat, secret+"\n"); err != nil {
		v.fail("%v", err)
	}
	defer func() { _ = r.asUser(context.WithoutCancel(ctx), b, "", "rm", "-f", pat) }()
	jb, err := r.sbatch(ctx, b, "cred-probe", r.srunLine("--microvm-mounts="+r.treeOf(b)+"/own:/data", "sh", "-c",
		`grep -l -F -f /data/pattern /proc/[0-9]*/environ /proc/[0-9]*/cmdline /proc/cmdline 2>/dev/null | sed 's/^/POC-FOUND /'
grep -r -l -F -f /data/pattern /tmp /dev/shm /run /etc /var 2>/dev/null | sed 's/^/POC-FOUND /'
echo POC-SEARCHED`), "-t", "5")
	if err != nil {
		v.fail("%v", err)
	} else {
		v.job(jb)
		_, _ = r.wait(ctx, jb, 5*time.Minute)
		out := jb.output()
		if !strings.Contains(out, "POC-SEARCHED") {
			v.fail("tenant B's guest search did not run (job %d)", jb.id)
		}
		if strings.Contains(out, "POC-FOUND") {
			v.fail("tenant A's secret found in tenant B's guest: %s", strings.Join(regexp.MustCompile(`POC-FOUND \S+`).FindAllString(out, -1), ", "))
		}
	}
	// The node, while A's step runs and after.
	check := func(when string) {
		hits := secretHits(r.scanRoots(ctx), secret)
		for _, h := range r.exposedTo(ctx, b, hits) {
			v.fail("%s: A's secret is in %s, readable by tenant B", when, h)
		}
		v.note("%s: A's secret in %d node files, none readable by B", when, len(hits))
	}
	check("while running")
	_ = r.slurm.Scancel(ctx, strconv.Itoa(j.id))
	_, _ = r.wait(ctx, j, 2*time.Minute)
	end := time.Now()
	r.cleanupAfter(ctx, v, snap, end)
	check("after the job")
}
