package poc

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/poc/report"
	"github.com/slurm-microvm/slurm-microvm/launcher/residue"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// maxRead bounds what the poc reads of a file someone else may have made
// (a tenant's output, a file in /tmp): 16 MiB.
const maxRead = 16 << 20

// readRegular reads at most max bytes of path when it is a regular file
// (not a symlink: the last component is opened with O_NOFOLLOW; not a
// FIFO or device: O_NONBLOCK, then fstat) and, when owner is not nil,
// owned by that uid. The poc runs as root and reads files that tenants
// can replace at any time; this is how it reads them.
func readRegular(path string, max int64, owner *uint32) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); owner != nil && (!ok || st.Uid != *owner) {
		return nil, fmt.Errorf("%s: not owned by uid %d", path, *owner)
	}
	return io.ReadAll(io.LimitReader(f, max))
}

// PocDirName is the directory under each test account's home that holds
// the poc's trees, one per run (<home>/.slurm-microvm-poc/<run id>).
const PocDirName = ".slurm-microvm-poc"

// SecretEnv is the variable every poc job carries a per-tenant secret in;
// the credential and diagnosis checks look for its value.
const SecretEnv = "SMV_POC_SECRET"

func (r *run) treeOf(t *Tenant) string { return filepath.Join(t.Home, PocDirName, r.id) }

// token is a fresh random marker (hex, 32 characters).
func token() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// tenantData are the markers of one tenant's tree and environment: none
// of them may appear in the other tenant's view, a log, or the report.
type tenantData struct {
	secret  string // SecretEnv's value
	content string // in own/data.txt and private.txt
}

func (r *run) data(t *Tenant) tenantData { return r.markers[t.Label] }

// makeTrees creates each tenant's tree, as the tenant (root never writes
// into a directory a tenant owns: a symlink planted there would redirect
// root's write), 0700:
//
//	own/data.txt own/sub/more.txt   the tenant's share (mounted read-only)
//	private.txt                     outside the share
//	out/                            job output
//	ckpt/                           the checkpoint check's writable share
func (r *run) makeTrees(ctx context.Context) error {
	r.markers = map[string]tenantData{}
	for _, t := range r.tenants {
		d := tenantData{secret: token(), content: token()}
		r.markers[t.Label] = d
		root := r.treeOf(t)
		if err := r.asUser(ctx, t, "", "mkdir", "-p", "-m", "0700", filepath.Join(t.Home, PocDirName), root,
			root+"/own/sub", root+"/out", root+"/ckpt"); err != nil {
			return fmt.Errorf("poc tree of %s: %w", t.Name, err)
		}
		if err := r.asUser(ctx, t, "", "chmod", "0700", root+"/own", root+"/own/sub"); err != nil {
			return fmt.Errorf("poc tree of %s: %w", t.Name, err)
		}
		for name, text := range map[string]string{
			"own/data.txt":     "data " + d.content + "\n",
			"own/sub/more.txt": "more " + d.content + "\n",
			"private.txt":      "private " + d.content + "\n",
		} {
			if err := r.writeAs(ctx, t, filepath.Join(root, name), text); err != nil {
				return fmt.Errorf("poc tree of %s: %w", t.Name, err)
			}
		}
	}
	return nil
}

// asUser runs argv as t with stdin; a non-zero exit is an error naming
// the command and its stderr.
func (r *run) asUser(ctx context.Context, t *Tenant, stdin string, argv ...string) error {
	_, errOut, code, err := r.slurm.Run(ctx, t, stdin, argv[0], argv[1:]...)
	if err == nil && code != 0 {
		err = fmt.Errorf("%s as %s: exit %d: %s", strings.Join(argv, " "), t.Name, code, strings.TrimSpace(errOut))
	}
	return err
}

// writeAs writes text to path as t (mode 0600; an existing file is
// replaced).
func (r *run) writeAs(ctx context.Context, t *Tenant, path, text string) error {
	return r.asUser(ctx, t, text, "/bin/sh", "-c", `umask 077; cat > "$1"`, "poc", path)
}

// treeSum is a digest of every entry under dir: path, type, mode, owner,
// size, content and link target (byte-for-byte unchanged, or not).
func treeSum(dir string) (string, error) {
	h := sha256.New()
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(dir, p); rel == "out" || strings.HasPrefix(rel, "out/") {
			return nil // the jobs' output is written while the check runs
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v %d", p, fi.Mode(), fi.Size())
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			line += fmt.Sprintf(" %d:%d", st.Uid, st.Gid)
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case fi.Mode().IsRegular():
			b, err := readRegular(p, maxRead, nil)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		lines = append(lines, line)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("digest of %s: %w", dir, err)
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Fprintln(h, l)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// job is one submitted batch job.
type job struct {
	t    *Tenant
	name string
	id   int
	out  string // its output file (stdout and stderr)
}

// sh quotes s for a POSIX shell.
func sh(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// srunLine is `srun --microvm=IMAGE args...` with every argument quoted.
func (r *run) srunLine(args ...string) string {
	q := []string{"srun", sh("--microvm=" + r.o.Image)}
	for _, a := range args {
		q = append(q, sh(a))
	}
	return strings.Join(q, " ")
}

// sbatch submits a batch script as t, pinned to the poc's node, named
// smv-<run id>-<name>, its output in t's out/, the tenant's secret in its
// environment; args are more sbatch options.
func (r *run) sbatch(ctx context.Context, t *Tenant, name, body string, args ...string) (*job, error) {
	pattern := "%j"
	for _, a := range args {
		if strings.HasPrefix(a, "--array") {
			pattern = "%A_%a"
		}
	}
	out := filepath.Join(r.treeOf(t), "out", name+"-"+pattern+".out")
	a := []string{"-J", "smv-" + r.id + "-" + name, "-w", r.o.Node, "-o", out, "-N1"}
	if r.o.Partition != "" {
		a = append(a, "-p", r.o.Partition)
	}
	if r.o.Reservation != "" {
		a = append(a, "--reservation", r.o.Reservation)
	}
	a = append(a, args...)
	script := "#!/bin/sh\n" + body + "\n"
	id, err := r.slurm.Sbatch(ctx, t, []string{SecretEnv + "=" + r.data(t).secret}, script, a...)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.jobs = append(r.jobs, id)
	j := &job{t: t, name: name, id: id, out: strings.NewReplacer("%j", strconv.Itoa(id), "%A", strconv.Itoa(id)).Replace(out)}
	if r.byName == nil {
		r.byName = map[string]*job{}
	}
	r.byName[name] = j
	r.mu.Unlock()
	return j, nil
}

// runJob submits body as t (see sbatch), records the job on v and waits
// up to limit for its end; ok is false when it could not be submitted
// (v holds why). A wait that fails is recorded on v too.
func (r *run) runJob(ctx context.Context, v *verdict, t *Tenant, name, body string, limit time.Duration, args ...string) (j *job, jb Job, ok bool) {
	j, err := r.sbatch(ctx, t, name, body, args...)
	if err != nil {
		v.fail("%v", err)
		return nil, Job{}, false
	}
	v.job(j)
	if jb, err = r.wait(ctx, j, limit); err != nil {
		v.fail("%v", err)
	}
	return j, jb, true
}

// output is the job's output file so far ("" when none).
func (j *job) output() string {
	b, _ := readRegular(j.out, maxRead, &j.t.UID) // Slurm writes it as the tenant
	return string(b)
}

// wait waits for the job to end (bounded by limit) and returns its record.
func (r *run) wait(ctx context.Context, j *job, limit time.Duration) (Job, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	return r.slurm.WaitJob(ctx, j.id)
}

// waitReady waits until the sandbox of job's step is ready and returns
// its state directory; it fails when the job ends first or limit passes.
func (r *run) waitReady(ctx context.Context, j *job, step int, limit time.Duration) (string, error) {
	deadline := time.Now().Add(limit)
	for {
		matches, _ := filepath.Glob(filepath.Join(r.o.Config.RuntimeDir, fmt.Sprintf("%d.%d.*.%s", j.id, step, r.o.Node), state.ReadyFile))
		if len(matches) > 0 {
			return filepath.Dir(matches[len(matches)-1]), nil
		}
		if jb, err := r.slurm.Job(ctx, j.id); err == nil && terminal[jb.State] {
			return "", fmt.Errorf("job %d ended %s (exit %s) before its step %d was ready", j.id, jb.State, jb.ExitCode, step)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("job %d step %d: no ready sandbox within %s", j.id, step, limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitOutput waits until the job's output holds marker (the workload
// reached a point), or the job ends, or limit passes.
func (r *run) waitOutput(ctx context.Context, j *job, marker string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for !strings.Contains(j.output(), marker) {
		if jb, err := r.slurm.Job(ctx, j.id); err == nil && terminal[jb.State] {
			return fmt.Errorf("job %d ended %s before printing %s", j.id, jb.State, marker)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("job %d: no %s in its output within %s", j.id, marker, limit)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// verdict collects a check's failures and evidence.
type verdict struct {
	c     *report.Check
	fails []string
}

func newVerdict(c *report.Check) *verdict { return &verdict{c: c} }

func (v *verdict) fail(format string, a ...any) { v.fails = append(v.fails, fmt.Sprintf(format, a...)) }
func (v *verdict) note(format string, a ...any) {
	v.c.Evidence = append(v.c.Evidence, fmt.Sprintf(format, a...))
}
func (v *verdict) job(j *job) {
	if j != nil {
		v.c.Jobs = append(v.c.Jobs, j.id)
	}
}

// skip marks the check skipped with reason.
func (v *verdict) skip(format string, a ...any) {
	v.c.Verdict, v.c.Reason = report.Skip, fmt.Sprintf(format, a...)
}

// done sets the verdict from the failures (a skip stays a skip).
func (v *verdict) done() {
	if v.c.Verdict == report.Skip {
		return
	}
	if len(v.fails) > 0 {
		v.c.Verdict, v.c.Reason = report.Fail, strings.Join(v.fails, "; ")
		return
	}
	v.c.Verdict = report.Pass
}

// stopPhase is the supervisor's line for a step's stop (its duration).
var stopPhase = regexp.MustCompile(`msg=phase (?:step=\S+ )?phase=stop ms=(\d+)`)

// judgeCleanup is the "nothing left, node in service" verdict after a
// step: left is what the residue snapshot found after teardown, took how
// long teardown took, state the node's sinfo state.
func judgeCleanup(left []string, took, unkillable time.Duration, nodeState string) []string {
	var fails []string
	if len(left) > 0 {
		fails = append(fails, fmt.Sprintf("left on the node after %s: %s", took.Round(time.Millisecond), strings.Join(left, " | ")))
	} else if took > unkillable {
		fails = append(fails, fmt.Sprintf("teardown took %s, more than UnkillableStepTimeout %s", took.Round(time.Millisecond), unkillable))
	}
	if Drained(nodeState) {
		fails = append(fails, fmt.Sprintf("the node is %s", nodeState))
	}
	return fails
}

// cleanupAfter waits (up to UnkillableStepTimeout, at least 30 s) until
// nothing of the steps since snap is left, records the teardown time,
// and checks the node is in service. The teardown time is the longest of
// the launcher's own stop phase (phase=stop in the admin's log of the
// check's jobs: end the guest, kill the VMM, release, remove the state)
// and what was still left once Slurm said the job ended (end to clean).
func (r *run) cleanupAfter(ctx context.Context, v *verdict, snap *residue.Snapshot, end time.Time) {
	limit := max(r.unkill, 30*time.Second)
	left := snap.WaitClean(ctx, limit)
	took := time.Since(end)
	for _, id := range v.c.Jobs {
		for _, m := range stopPhase.FindAllStringSubmatch(r.adminLog(id), -1) {
			if ms, _ := strconv.Atoi(m[1]); time.Duration(ms)*time.Millisecond > took {
				took = time.Duration(ms) * time.Millisecond
			}
		}
	}
	if len(left) == 0 {
		v.c.TeardownMS = max(took.Milliseconds(), 1)
	}
	st, err := r.slurm.NodeState(ctx, r.o.Node)
	if err != nil {
		v.fail("node state: %v", err)
	}
	for _, f := range judgeCleanup(left, took, r.unkill, st) {
		v.fail("%s", f)
	}
}

// adminLog is what the supervisors of job wrote into the admin's kept logs
// ([log] dir, <job>.<step>.<restart>.<node>.log) since this run began:
// lines older than the run are another job's that had the same id (a
// cluster whose job ids started over). "" when [log] dir is off.
func (r *run) adminLog(id int) string {
	dir := r.o.Config.Log.Dir
	if dir == "" {
		return ""
	}
	logs, _ := filepath.Glob(filepath.Join(dir, fmt.Sprintf("%d.*.log", id)))
	var b strings.Builder
	since := r.rep.Started.Add(-time.Second)
	for _, p := range logs {
		data, err := readRegular(p, maxRead, nil)
		if err != nil {
			continue
		}
		for _, line := range strings.SplitAfter(string(data), "\n") {
			if t, ok := logTime(line); ok && t.Before(since) {
				continue
			}
			b.WriteString(line)
		}
	}
	return b.String()
}

// logTime reads the time= attribute that opens a log/slog text line.
func logTime(line string) (time.Time, bool) {
	v, ok := strings.CutPrefix(line, "time=")
	if !ok {
		return time.Time{}, false
	}
	v, _, _ = strings.Cut(v, " ")
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil
}
