// Package residue proves that a step left nothing on the host: it takes a
// snapshot before a test and, after it, lists what is new or still there
// that belongs to the step, looking at the whole host rather than one
// directory:
//
//   - mounts in the host's mount table (moby/sys/mountinfo) whose mount
//     point, root or source lies under one of the scope's paths (image
//     disks, shares, state, scratch), whose loop device is backed by a
//     file there, or that are new and lie under /tmp or /var/tmp (the MPI
//     check's temporary mounts);
//   - loop devices (/sys/block/loop*/loop/backing_file) backed by a file
//     under the scope's paths or a new one under /tmp or /var/tmp;
//   - processes in Slurm job cgroups that did not exist before (a job_N
//     directory under /sys/fs/cgroup), such a directory itself while it
//     is still there, and new processes of the scope's programs (QEMU,
//     virtiofsd, the launcher);
//   - PCI devices newly bound to vfio-pci (a GPU or VF the step took and
//     did not give back);
//   - state directories in the runtime directory and sockets naming it;
//   - work directories in the cache (tmp-*, .tmp-*), wherever they are;
//   - entries created in /tmp and /var/tmp since the snapshot (test
//     temporary directories, named Test*, excepted);
//   - step network objects new since the snapshot: interfaces (by name
//     and ifalias) and nftables tables that network.Leftover says are a
//     step's, in the host's network namespace and in each of the scope's
//     (the nodes of the two-node test cluster), read through netlink and
//     nftables handles opened in each namespace, not by running ip or
//     nft (github.com/vishvananda/netlink, github.com/google/nftables).
//
// Design decision: a snapshot compared after the test, rather than a list
// of the names the launcher is known to use: a leak under a name nobody
// thought of is what such a check exists to catch. What existed before
// the test is not blamed on it, so one leak is reported once.
package residue

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
)

// Scope is what belongs to the steps under test.
type Scope struct {
	// Paths are host directories (absolute) whose mounts, loop devices
	// and work files are the steps' own: runtime_dir, cache_dir, the
	// scratch base, the shared data trees, the installation.
	Paths []string
	// RuntimeDir holds one state directory per step; any entry new since
	// the snapshot is left behind.
	RuntimeDir string
	// Records are entries of RuntimeDir that outlive a step by design
	// (the stop records of launcher/state, removed by the epilog's gc).
	Records []string
	// CacheDir is searched for work directories (tmp-*, .tmp-*).
	CacheDir string
	// Programs are executables (absolute paths or base names) whose new
	// processes must be gone after the test.
	Programs []string
	// TmpDirs are the shared temporary directories watched for new
	// entries (default /tmp and /var/tmp).
	TmpDirs []string
	// TmpIgnore are glob patterns (path.Match) of names in TmpDirs that
	// other programs on a shared host make while a test runs; none in CI.
	TmpIgnore []string
	// NetNS are network namespaces (paths: /run/netns/NAME, or
	// /proc/PID/ns/net) searched for step network objects besides the
	// caller's own: each node's of the two-node test cluster. One that is
	// gone when Left looks has nothing left.
	NetNS []string
	// NetLeftover tells whether an interface (name, ifalias) or an
	// nftables table (name, "") is a step's; nil is network.Leftover.
	NetLeftover func(name, alias string) bool
	// SysRoot is where sysfs is mounted ("" : /sys); tests give a fake
	// tree.
	SysRoot string
	// NoCmdlines leaves processes' command lines out of Left's lines (pid
	// and executable only): on a node other users share, a command line
	// is theirs to keep (slurm-microvm poc's report is readable by all).
	NoCmdlines bool
}

// Snapshot is the host as it was before a test.
type Snapshot struct {
	scope  Scope
	mounts map[string]bool // mountpoint + root + source
	loops  map[string]bool // loop device name + backing file
	procs  map[int]bool
	cgroup map[string]bool // job cgroup directories
	tmp    map[string]bool
	state  map[string]bool
	net    map[string]bool // netObject keys
	vfio   map[string]bool // PCI addresses bound to vfio-pci
}

// Take records the host's state for scope.
func Take(scope Scope) *Snapshot {
	if len(scope.TmpDirs) == 0 {
		scope.TmpDirs = []string{"/tmp", "/var/tmp"}
	}
	s := &Snapshot{scope: scope, mounts: map[string]bool{}, loops: map[string]bool{}, procs: map[int]bool{},
		cgroup: map[string]bool{}, tmp: map[string]bool{}, state: map[string]bool{}, net: map[string]bool{}, vfio: map[string]bool{}}
	if s.scope.SysRoot == "" {
		s.scope.SysRoot = "/sys"
	}
	for _, m := range mounts() {
		s.mounts[mountKey(m)] = true
	}
	for dev, file := range loopDevices() {
		s.loops[dev+" "+file] = true
	}
	for _, p := range pids() {
		s.procs[p] = true
	}
	for _, d := range jobCgroups(s.scope.SysRoot) {
		s.cgroup[d] = true
	}
	for _, a := range vfioBound(s.scope.SysRoot) {
		s.vfio[a] = true
	}
	for _, d := range scope.TmpDirs {
		for _, n := range names(d) {
			s.tmp[filepath.Join(d, n)] = true
		}
	}
	for _, n := range names(scope.RuntimeDir) {
		s.state[n] = true
	}
	for _, o := range netObjects(scope.NetNS, scope.NetLeftover) {
		s.net[o.key] = true
	}
	return s
}

// Left lists what the steps left on the host since the snapshot, one
// line each ("mount ...", "loop ...", "process ...", ...); nil when
// nothing.
func (s *Snapshot) Left() []string {
	var out []string
	under := func(p string) bool {
		for _, root := range s.scope.Paths {
			if root != "" && (p == root || strings.HasPrefix(p, strings.TrimSuffix(root, "/")+"/")) {
				return true
			}
		}
		return false
	}
	inTmp := func(p string) bool {
		for _, d := range s.scope.TmpDirs {
			if strings.HasPrefix(p, d+"/") {
				return true
			}
		}
		return false
	}
	loops := loopDevices()
	for _, m := range mounts() {
		backing := loops[strings.TrimPrefix(m.Source, "/dev/")]
		isNew := !s.mounts[mountKey(m)]
		if under(m.Mountpoint) || under(m.Source) || under(m.Root) || (backing != "" && under(backing)) ||
			(isNew && (inTmp(m.Mountpoint) || (backing != "" && inTmp(backing)))) {
			out = append(out, fmt.Sprintf("mount %s on %s (%s, root %s%s)", m.Source, m.Mountpoint, m.FSType, m.Root, backingNote(backing)))
		}
	}
	for dev, file := range loops {
		if under(file) || (!s.loops[dev+" "+file] && inTmp(file)) {
			out = append(out, fmt.Sprintf("loop device /dev/%s backed by %s", dev, file))
		}
	}
	for _, d := range jobCgroups(s.scope.SysRoot) {
		if s.cgroup[d] {
			continue
		}
		procs := cgroupProcs(d)
		for _, p := range procs {
			out = append(out, fmt.Sprintf("process %d in the job cgroup %s%s", p, d, s.cmdline(p)))
		}
		if len(procs) == 0 {
			out = append(out, "cgroup directory "+d)
		}
	}
	for _, a := range vfioBound(s.scope.SysRoot) {
		if !s.vfio[a] {
			out = append(out, "VFIO binding of PCI device "+a+" (vfio-pci)")
		}
	}
	for _, p := range pids() {
		if s.procs[p] || p == os.Getpid() {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", p))
		exe = strings.TrimSuffix(exe, " (deleted)")
		for _, prog := range s.scope.Programs {
			if exe != "" && (exe == prog || filepath.Base(exe) == prog) {
				out = append(out, fmt.Sprintf("process %d (%s)%s", p, exe, s.cmdline(p)))
				break
			}
		}
	}
	for _, n := range names(s.scope.RuntimeDir) {
		if !s.state[n] && !slices.Contains(s.scope.Records, n) {
			out = append(out, "state "+filepath.Join(s.scope.RuntimeDir, n))
		}
	}
	if rd := s.scope.RuntimeDir; rd != "" {
		if f, err := os.Open("/proc/net/unix"); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if strings.Contains(sc.Text(), rd) {
					out = append(out, "socket "+strings.TrimSpace(sc.Text()))
				}
			}
			f.Close()
		}
	}
	if s.scope.CacheDir != "" {
		_ = filepath.WalkDir(s.scope.CacheDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || p == s.scope.CacheDir {
				return nil
			}
			if strings.HasPrefix(d.Name(), "tmp-") || strings.HasPrefix(d.Name(), ".tmp-") {
				out = append(out, "cache work file "+p)
				if d.IsDir() {
					return filepath.SkipDir
				}
			}
			if strings.Count(strings.TrimPrefix(p, s.scope.CacheDir), "/") >= 3 && d.IsDir() {
				return filepath.SkipDir // work files sit at most at <cache>/images/<uid>/
			}
			return nil
		})
	}
	for _, d := range s.scope.TmpDirs {
		for _, n := range names(d) {
			p := filepath.Join(d, n)
			if !s.tmp[p] && !compilerTemp(n) && !s.ignored(n) {
				out = append(out, "temporary file "+p+owner(p))
			}
		}
	}
	for _, o := range netObjects(s.scope.NetNS, s.scope.NetLeftover) {
		if !s.net[o.key] {
			out = append(out, o.line)
		}
	}
	sort.Strings(out)
	return out
}

// WaitClean waits up to timeout (stop is asynchronous to srun's exit)
// until Left is empty, or ctx ends. It returns what is still left then,
// nil when nothing is.
func (s *Snapshot) WaitClean(ctx context.Context, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	for {
		left := s.Left()
		if len(left) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return left
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// vfioBound lists the PCI addresses bound to vfio-pci (the links
// <sys>/bus/pci/drivers/vfio-pci/DDDD:BB:DD.F), none when the driver is
// not loaded.
func vfioBound(sys string) []string {
	var out []string
	entries, _ := os.ReadDir(filepath.Join(sys, "bus", "pci", "drivers", "vfio-pci"))
	for _, e := range entries {
		if pciAddr.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

var pciAddr = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

func mounts() []*mountinfo.Info {
	ms, _ := mountinfo.GetMounts(nil)
	return ms
}

func mountKey(m *mountinfo.Info) string {
	return m.Mountpoint + "\x00" + m.Root + "\x00" + m.Source + "\x00" + strconv.Itoa(m.ID)
}

// cmdline is ": " and pid's command line, or "" with Scope.NoCmdlines.
func (s *Snapshot) cmdline(pid int) string {
	if s.scope.NoCmdlines {
		return ""
	}
	return ": " + cmdline(pid)
}

func backingNote(b string) string {
	if b == "" {
		return ""
	}
	return ", backed by " + b
}

// loopDevices maps each bound loop device ("loop3") to its backing file.
func loopDevices() map[string]string {
	out := map[string]string{}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		dev := filepath.Base(filepath.Dir(filepath.Dir(f)))
		out[dev] = strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
	}
	return out
}

func pids() []int {
	var out []int
	des, _ := os.ReadDir("/proc")
	for _, de := range des {
		if n, err := strconv.Atoi(de.Name()); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// jobCgroups lists the Slurm job cgroup directories (job_N) of every
// hierarchy: cgroup v1 (<controller>/slurm*/uid_U/job_N) and v2
// (.../job_N under slurmd's or slurmstepd's scope).
func jobCgroups(sys string) []string {
	var out []string
	root := filepath.Join(sys, "fs", "cgroup")
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if strings.HasPrefix(d.Name(), "job_") {
			out = append(out, p)
			return filepath.SkipDir
		}
		if strings.Count(strings.TrimPrefix(p, root), "/") > 5 {
			return filepath.SkipDir
		}
		return nil
	})
	return out
}

// cgroupProcs lists the processes of the cgroup dir and its children.
func cgroupProcs(dir string) []int {
	seen := map[int]bool{}
	var out []int
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil && !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
		return nil
	})
	return out
}

func names(dir string) []string {
	if dir == "" {
		return nil
	}
	des, _ := os.ReadDir(dir)
	var out []string
	for _, de := range des {
		out = append(out, de.Name())
	}
	return out
}

func owner(p string) string {
	fi, err := os.Lstat(p)
	if err != nil {
		return ""
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fmt.Sprintf(" (uid %d)", st.Uid)
	}
	return ""
}

// ignored tells whether name matches one of the scope's TmpIgnore globs.
func (s *Snapshot) ignored(name string) bool {
	for _, g := range s.scope.TmpIgnore {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}

// compilerTemp tells whether name is a temporary file of the Go toolchain
// or gcc (tests build helpers while they run), or a test's own Test*
// directory: never made by a step.
func compilerTemp(name string) bool {
	for _, p := range []string{"Test", "go-build", "go-link-", "cc"} {
		// gcc: "cc" + 6 random characters + a suffix (ccXpTaVD.res).
		if strings.HasPrefix(name, p) && (p != "cc" || len(name) > 9 && name[8] == '.') {
			return true
		}
	}
	return false
}
