package bench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// supervisorLogDir is [log] dir of the harness's configuration: each
// step's supervisor log is kept there as <job>.<step>.<restart>.<node>.log.
const supervisorLogDir = harness.LogDir

// part is one piece of a launch.
type part struct {
	Name string
	D    time.Duration
}

// launchRound is one `srun --microvm true`: its wall time and the parts
// that add up to it.
type launchRound struct {
	Total time.Duration
	Parts []part
}

// srunMicroVM runs `srun SHAPE --microvm=IMG true` as root and splits its
// wall time by the supervisor's log lines of the step (phase lines, the
// boot timeline and the stop), which carry the host's clock.
func srunMicroVM(b *testing.B, e *harness.Env, shape []string) launchRound {
	b.Helper()
	t0 := time.Now()
	args := append(append([]string{}, shape...), "--microvm="+e.Image, "true")
	if _, errOut, code := e.Srun(b, "", args...); code != 0 {
		b.Fatalf("srun %s: exit %d: %s", strings.Join(args, " "), code, errOut)
	}
	t1 := time.Now()
	lines, err := stepLogLines(supervisorLogDir, t0)
	if err != nil {
		b.Fatal(err)
	}
	r, err := splitLaunch(t0, t1, lines)
	if err != nil {
		b.Fatalf("%v\nsupervisor log:\n%s", err, strings.Join(lines, "\n"))
	}
	return r
}

// stepLogLines returns the supervisor log lines stamped at or after since,
// from the most recently written step log in dir.
func stepLogLines(dir string, since time.Time) ([]string, error) {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var newest string
	var mt time.Time
	for _, l := range logs {
		if fi, err := os.Stat(l); err == nil && fi.ModTime().After(mt) {
			newest, mt = l, fi.ModTime()
		}
	}
	if newest == "" || mt.Before(since) {
		return nil, fmt.Errorf("no supervisor log in %s written since %s", dir, since.Format(time.RFC3339Nano))
	}
	f, err := os.Open(newest)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		if t, ok := lineTime(sc.Text()); ok && !t.Before(since.Truncate(time.Millisecond)) {
			out = append(out, sc.Text())
		}
	}
	return out, sc.Err()
}

var (
	timeRe     = regexp.MustCompile(`^time=(\S+) `)
	phaseRe    = regexp.MustCompile(` msg=phase .*phase=(\w+) ms=(\d+)`)
	timelineRe = regexp.MustCompile(` msg="boot timeline" .*total_ms=([\d.]+) vmm_ms=([\d.]+) kernel_ms=([\d.]+) modules_ms=([\d.]+) agent_init_ms=([\d.]+) setup_wait_ms=([\d.]+) setup_ms=([\d.]+)`)
)

func lineTime(l string) (time.Time, bool) {
	m := timeRe.FindStringSubmatch(l)
	if m == nil {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, m[1])
	return t, err == nil
}

// phaseNames are the supervisor's phases in the order a start runs them
// (launcher.Phase*), with the names the breakdown prints.
var phaseNames = []struct{ phase, name string }{
	{launcher.PhaseGPUs, "GPUs"},
	{launcher.PhaseShares, "shares"},
	{launcher.PhaseImage, "image (cached)"},
	{launcher.PhaseMPI, "MPI check"},
	{launcher.PhaseAssets, "guest assets"},
	{launcher.PhaseNetwork, "step network"},
	{launcher.PhaseBoot, "boot"},
	{launcher.PhaseReady, "control socket, ready mark"},
}

// splitLaunch splits t1-t0 at the marks of the supervisor's lines: Slurm's
// launch and the supervisor's start up to its first line, each phase from
// the end of the one before, the boot by its timeline, the task (exec
// entry, the command in the guest, its exit) up to the stop, and what
// follows to srun's return. The parts add up to the total by construction.
func splitLaunch(t0, t1 time.Time, lines []string) (launchRound, error) {
	r := launchRound{Total: t1.Sub(t0)}
	if len(lines) == 0 {
		return r, fmt.Errorf("no supervisor log lines for the step")
	}
	first, _ := lineTime(lines[0])
	ends := map[string]time.Time{}
	var tl []float64
	var stopAt time.Time
	for _, l := range lines {
		t, _ := lineTime(l)
		if m := phaseRe.FindStringSubmatch(l); m != nil {
			ends[m[1]] = t
		}
		if m := timelineRe.FindStringSubmatch(l); m != nil {
			for _, v := range m[1:] {
				f, _ := strconv.ParseFloat(v, 64)
				tl = append(tl, f)
			}
		}
		if strings.Contains(l, `msg="stopping sandbox"`) && stopAt.IsZero() {
			stopAt = t
		}
	}
	clamp := func(t time.Time) time.Time {
		if t.After(t1) {
			return t1
		}
		if t.Before(t0) {
			return t0
		}
		return t
	}
	prev := t0
	add := func(name string, end time.Time) {
		end = clamp(end)
		if end.Before(prev) {
			end = prev
		}
		r.Parts = append(r.Parts, part{name, end.Sub(prev)})
		prev = end
	}
	add("Slurm step launch, plugin, supervisor start", first)
	for _, p := range phaseNames {
		end, ok := ends[p.phase]
		if !ok {
			return r, fmt.Errorf("no %q phase line", p.phase)
		}
		if p.phase != launcher.PhaseBoot || len(tl) != 7 {
			add(p.name, end)
			continue
		}
		// The boot phase: its start-up before the VMM's spawn, then the
		// timeline (ms), scaled into the phase if the clocks disagree.
		begin := prev
		span := clamp(end).Sub(begin)
		total := time.Duration(tl[0] * float64(time.Millisecond))
		pre := max(span-total, 0)
		add("VMM prepare (fds, arguments)", begin.Add(pre))
		names := []string{"VMM spawn, kernel load, early kernel", "kernel boot to PID 1", "boot modules", "agent start-up", "wait for Setup", "guest set-up (root, overlay, shares)"}
		at := begin.Add(pre)
		for i, n := range names {
			at = at.Add(time.Duration(tl[i+1] * float64(time.Millisecond)))
			if i == len(names)-1 {
				at = end
			}
			add("  "+n, at)
		}
	}
	if stopAt.IsZero() {
		stopAt = t1
	}
	add("task: exec entry, command in the guest, exit", stopAt)
	add("stop and Slurm's step end", t1)
	return r, nil
}

// medianRound is the round whose total is the median.
func medianRound(rs []launchRound) launchRound {
	s := append([]launchRound(nil), rs...)
	sort.Slice(s, func(i, j int) bool { return s[i].Total < s[j].Total })
	return s[len(s)/2]
}

// vmmMemory is the VMM's resident memory at agent ready, split: the
// guest's RAM, and beyond it TCG's code buffers, mapped files (QEMU and
// its libraries, the kernel and initramfs it keeps mapped: page cache,
// shared between VMMs) and the VMM's own anonymous memory.
type vmmMemory struct {
	GuestMiB, VMMMiB, TCGMiB, FilesMiB, OwnMiB float64
}

// readVMMMemory reads /proc/<vmm>/smaps of the sandbox in stateDir: the
// guest RAM is the anonymous mapping of guestMiB (QEMU may round it up
// by a few pages), TCG's code buffers the anonymous rwx mappings.
func readVMMMemory(stateDir string, guestMiB uint64) (vmmMemory, error) {
	p, err := state.ReadProc(filepath.Join(stateDir, state.VMMPidFile))
	if err != nil {
		return vmmMemory{}, err
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", p.Pid))
	if err != nil {
		return vmmMemory{}, err
	}
	defer f.Close()
	var m vmmMemory
	var total, guest, tcg, files uint64
	var perms, path string
	var size uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if strings.Contains(fields[0], "-") && len(fields) >= 5 {
			perms, path, size = fields[1], "", 0
			if len(fields) >= 6 {
				path = fields[5]
			}
			continue
		}
		kb, _ := strconv.ParseUint(fields[len(fields)-2], 10, 64)
		switch fields[0] {
		case "Size:":
			size = kb
		case "Rss:":
			total += kb
			anon := path == ""
			switch {
			case anon && size >= guestMiB*1024 && size <= guestMiB*1024+4096:
				guest += kb
			case anon && strings.HasPrefix(perms, "rwx"):
				tcg += kb
			case strings.HasPrefix(path, "/"):
				files += kb
			}
		}
	}
	if guest == 0 {
		return m, fmt.Errorf("no guest RAM mapping of %d MiB in the VMM's smaps", guestMiB)
	}
	m.GuestMiB = float64(guest) / 1024
	m.VMMMiB = float64(total-guest) / 1024
	m.TCGMiB = float64(tcg) / 1024
	m.FilesMiB = float64(files) / 1024
	m.OwnMiB = float64(total-guest-tcg-files) / 1024
	return m, sc.Err()
}

func medianMemory(ms []vmmMemory) vmmMemory {
	pick := func(f func(vmmMemory) float64) float64 {
		v := make([]float64, len(ms))
		for i, m := range ms {
			v[i] = f(m)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	return vmmMemory{
		GuestMiB: pick(func(m vmmMemory) float64 { return m.GuestMiB }),
		VMMMiB:   pick(func(m vmmMemory) float64 { return m.VMMMiB }),
		TCGMiB:   pick(func(m vmmMemory) float64 { return m.TCGMiB }),
		FilesMiB: pick(func(m vmmMemory) float64 { return m.FilesMiB }),
		OwnMiB:   pick(func(m vmmMemory) float64 { return m.OwnMiB }),
	}
}

// launchSizes measures `srun --microvm true` from the small shape (1 vCPU,
// 512 MiB guest) to all of the node's CPUs and memory (--mem=0: Slurm
// gives the step the node's whole memory), each as a ratio to the small
// shape; target within 10%.
func launchSizes(b *testing.B, e *harness.Env) {
	shapes := []struct {
		name  string
		shape []string
	}{
		{"1 vCPU, 512 MiB (small)", []string{"-c1", "--mem=704"}},
		{"all vCPUs, 512 MiB", []string{fmt.Sprintf("-c%d", runtime.NumCPU()), "--mem=704"}},
		{"1 vCPU, node's memory", []string{"-c1", "--mem=0"}},
		{"all vCPUs, node's memory", []string{fmt.Sprintf("-c%d", runtime.NumCPU()), "--mem=0"}},
	}
	runs := make([][]launchRound, len(shapes))
	for i := 0; i < rounds; i++ {
		for j, s := range shapes {
			runs[j] = append(runs[j], srunMicroVM(b, e, s.shape))
		}
	}
	total := func(rs []launchRound) time.Duration { return medianRound(rs).Total }
	small := total(runs[0])
	for j, s := range shapes {
		cmd := "srun " + strings.Join(s.shape, " ") + " --microvm=IMG true"
		report.Add(Figure{Section: "size", Name: s.name, Value: ms(total(runs[j])), Unit: "ms", Command: cmd})
		if j > 0 {
			report.Add(Figure{Section: "size", Name: "  / small shape", Value: float64(total(runs[j])) / float64(small), Unit: "ratio", Target: "<= 1.10", Command: cmd + " vs srun -c1 --mem=704 --microvm=IMG true"})
		}
		// Where a size costs: the guest kernel's part of the median round.
		for _, p := range medianRound(runs[j]).Parts {
			if strings.TrimSpace(p.Name) == "kernel boot to PID 1" {
				report.Add(Figure{Section: "size", Name: "  of which kernel boot to PID 1", Value: ms(p.D), Unit: "ms", Command: cmd + ", guest boot marks"})
			}
		}
	}
}
