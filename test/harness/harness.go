// Package harness installs slurm-microvm for the end-to-end tests and
// benchmarks and starts a real one-node Slurm with the plugin.
package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/slurm-microvm/slurm-microvm/launcher/residue"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/fixture/nvstandin"
)

// Paths of the installation the end-to-end tests run against. They live
// under /run (0755 all the way) so the unprivileged test user can execute
// the exec entry and read the images, wherever the repository is cloned.
const (
	// DataDir is the tree users may mount from; DataDir/rw may be
	// mounted writable.
	DataDir = cluster.BaseDir + "/data"
	// ScratchDir holds the per-step scratch directories.
	ScratchDir = cluster.BaseDir + "/scratch"
	Root       = cluster.BaseDir + "/install"
	// LogDir is [log] dir: each step's supervisor log, kept after the
	// step as <job>.<step>.<restart>.<node>.log. Under Root, so every
	// test cluster starts with none (job ids restart per cluster) and a
	// failed test shows its own steps' warnings (StepLogProblems).
	LogDir = Root + "/log"
	// MetricsFile is [metrics] textfile: the node's Prometheus metrics,
	// new with every cluster (under Root).
	MetricsFile = Root + "/metrics/slurm_microvm.prom"

	RuntimeDir = "/run/slurm-microvm-e2e"
	// GPUDriverRoot is gpu.driver.root: where a GPU test installs the
	// stand-in NVIDIA driver (test/fixture/nvstandin); absent until then,
	// so a GPU step first finds no driver.
	GPUDriverRoot = cluster.BaseDir + "/nvdriver"
	// GPUDriverParams are the nvidia module's parameters in the config.
	GPUDriverParams = "NVreg_StandinParam=from-site-config"
	CacheDir        = "/var/cache/slurm-microvm-e2e"
)

// Env is what every end-to-end test gets.
type Env struct {
	// baseConfig is the microvm.toml of every test (WriteConfig).
	baseConfig string
	// cacheDir is its cache_dir (CacheDir unless Options.CacheDir).
	cacheDir string

	C         *cluster.Cluster
	Launcher  string // installed slurm-microvm
	Config    string // its microvm.toml
	Agent     string
	Image     string // busybox OCI archive, readable by everyone
	ImageName string // NAME in its os-release
	Kernel    string // guest kernel release
	HostBoot  string // the host's boot_id
	TestUID   int    // uid of cluster.TestUser
}

// Setup builds and installs the launcher, agent and plugin under Root,
// writes the node config, builds the test image, and starts a one-node
// Slurm with the plugin in plugstack.conf. clusterEnv are extra settings
// for test/cluster/up.sh (e.g. "SELECT_TYPE_PARAMETERS=CR_Core").
func Setup(t testing.TB, clusterEnv ...string) *Env {
	t.Helper()
	return SetupWith(t, nil, clusterEnv...)
}

// TwoNodes is a tune for SetupWith: the cluster's two-node mode
// (cluster.Options.Nodes = 2), nodes n1 and n2 in network namespaces of
// their own, each with the same fake and stand-in GPUs. Commands of Env.C
// run in the controller's namespace; Env.Nodes, Env.C.NodeNetNS and
// Env.C.NodeCommand reach each node's side.
func TwoNodes(o *cluster.Options) { o.Nodes = 2 }

// SetupWith is Setup with the cluster's options adjusted by tune (when not
// nil) before the cluster starts, e.g. to turn on Options.Accounting, or
// TwoNodes.
func SetupWith(t testing.TB, tune func(*cluster.Options), clusterEnv ...string) *Env {
	t.Helper()
	return SetupOpts(t, Options{}, tune, clusterEnv...)
}

// Options change what SetupOpts installs. The zero value is Setup's.
type Options struct {
	// Prebuilt is a directory Build filled: its binaries and image are
	// installed instead of building them here (the cgroup v2 test node,
	// test/cgroupv2, runs the harness under emulation, where a build
	// would take minutes).
	Prebuilt string
	// BootTimeout and AgentHang replace the configuration's
	// timeouts.boot and timeouts.agent_hang ("" keeps 120 s and the
	// default): a guest under nested emulation boots in about a minute
	// and answers pings slowly.
	BootTimeout, AgentHang string
	// VMMOverheadMiB replaces resources.vmm_overhead_mib (0 keeps 192).
	VMMOverheadMiB int
	// CacheDir replaces cache_dir ("" keeps CacheDir): the cgroup v2 node
	// builds its own, rather than reading the host's through its overlay.
	CacheDir string
}

// Build builds what Setup installs into dir: dir/bin holds the e2e build of
// the launcher, the agent and the plugin, dir/images the test image
// (busybox.tar). Setup builds the same into Root.
func Build(t testing.TB, dir string) {
	t.Helper()
	fixture.Require(t, "busybox", "make", "cc")
	build(t, filepath.Join(dir, "bin"), filepath.Join(dir, "images"), imageName)
}

// imageName is NAME in the test image's os-release (Env.ImageName).
const imageName = "Microvm E2E Busybox"

// build makes the launcher, agent and plugin in bin and the test image
// busybox.tar in images (see Build).
func build(t testing.TB, bin, images, osName string) {
	t.Helper()
	repo := fixture.RepoRoot()
	for _, d := range []string{bin, images} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command("make", "build")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	for _, f := range []string{"slurm-microvm-agent", "spank_microvm.so"} {
		if err := InstallFile(filepath.Join(repo, "bin", f), filepath.Join(bin, f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The launcher under test is the test build: tag smv_gpu_standin
	// (launcher/gpu_standin.go: gres.conf's Type=standin GPUs boot without
	// VFIO, which this machine cannot do) and tag smv_faults (package
	// launcher/fault: root's switch files in fault.Dir make a step's start
	// fail at a named stage, or the build misbehave for one job; off
	// while Dir is empty). It is built here, never into the repository's
	// bin/ (make build refuses both tags: hack/no-test-tags.sh), so
	// `make install` never installs it.
	standin := exec.Command("go", "build", "-trimpath", "-tags", "smv_gpu_standin,smv_faults", "-o", filepath.Join(bin, "slurm-microvm"), "./cmd/slurm-microvm")
	standin.Dir = repo
	if out, err := standin.CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in launcher: %v\n%s", err, out)
	}
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	fixture.BusyboxRootfs(t, rootfs, osName)
	// icmpecho: a ping a non-root job can run (busybox's needs a raw
	// socket); the agent opens the guest's ping_group_range to every gid.
	icmp := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(rootfs, "usr/bin/icmpecho"), "./test/fixture/icmpecho")
	icmp.Dir = repo
	icmp.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := icmp.CombinedOutput(); err != nil {
		t.Fatalf("build icmpecho: %v\n%s", err, out)
	}
	img := filepath.Join(images, "busybox.tar")
	fixture.OCIArchive(t, rootfs, img, "microvm-e2e/busybox:1", v1.Config{
		Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "IMAGE_VAR=from-image"}, WorkingDir: "/",
	})
	if err := os.Chmod(img, 0o644); err != nil {
		t.Fatal(err)
	}
}

// SetupOpts is SetupWith with Options.
func SetupOpts(t testing.TB, o Options, tune func(*cluster.Options), clusterEnv ...string) *Env {
	t.Helper()
	fixture.RequireRoot(t)
	fixture.Require(t, "qemu-system-x86_64", "mkfs.erofs")
	bin := filepath.Join(Root, "bin")
	images := filepath.Join(Root, "images")
	if err := os.RemoveAll(Root); err != nil {
		t.Fatal(err)
	}
	// Stop records of an earlier test cluster whose epilog never ran (a
	// killed test): job ids restart with every cluster, so job 16 would
	// find job 16's record and refuse to start (state.ErrStopped).
	if err := os.RemoveAll(filepath.Join(RuntimeDir, state.StoppedDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{cluster.BaseDir, Root} {
		_ = os.Chmod(d, 0o755)
	}
	if o.Prebuilt == "" {
		fixture.Require(t, "busybox", "make", "cc")
		build(t, bin, images, imageName)
	} else {
		if err := os.MkdirAll(images, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"bin/slurm-microvm", "bin/slurm-microvm-agent", "bin/spank_microvm.so", "images/busybox.tar"} {
			mode := os.FileMode(0o755)
			if strings.HasPrefix(f, "images/") {
				mode = 0o644
			}
			if err := InstallFile(filepath.Join(o.Prebuilt, f), filepath.Join(Root, f), mode); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Symlink("slurm-microvm", filepath.Join(bin, "slurm-microvm-exec")); err != nil {
		t.Fatal(err)
	}
	bootTimeout, agentHang, overhead := "120s", "", 192
	if o.BootTimeout != "" {
		bootTimeout = o.BootTimeout
	}
	if o.AgentHang != "" {
		agentHang = fmt.Sprintf("agent_hang = %q\n", o.AgentHang)
	}
	if o.VMMOverheadMiB != 0 {
		overhead = o.VMMOverheadMiB
	}
	cacheDir := CacheDir
	if o.CacheDir != "" {
		cacheDir = o.CacheDir
	}
	cfg := filepath.Join(Root, "microvm.toml")
	conf := fmt.Sprintf(`runtime_dir = %q
cache_dir = %q
[qemu]
agent = %q
[resources]
vmm_overhead_mib = %d
default_memory_mib = 512
overlay_mib = 256
[timeouts]
boot = %q
%sstop_grace = "3s"
[images]
# The test cache stays bounded across runs (the largest test image is
# about 250 MiB): least recently used images and assets are pruned.
user_cache_mib = 3072
cache_mib = 4096
assets_cache_mib = 512
[gpu]
gres_conf = %q
[gpu.driver]
root = %q
[gpu.driver.params]
nvidia = %q
[mounts]
allowed = [%q]
writable = [%q]
scratch_base = %q
[log]
dir = %q
[metrics]
textfile = %q
`, RuntimeDir, cacheDir, filepath.Join(bin, "slurm-microvm-agent"), overhead, bootTimeout, agentHang, filepath.Join(cluster.DefaultDir, "etc", "gres.conf"),
		GPUDriverRoot, GPUDriverParams,
		DataDir, filepath.Join(DataDir, "rw"), ScratchDir, LogDir, MetricsFile)
	e := &Env{Launcher: filepath.Join(bin, "slurm-microvm"), Config: cfg, Agent: filepath.Join(bin, "slurm-microvm-agent"), ImageName: imageName, baseConfig: conf, cacheDir: cacheDir}
	if err := e.WriteConfig("", ""); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(e.Launcher, "--config", cfg, "config", "check").CombinedOutput(); err != nil {
		t.Fatalf("config check: %v\n%s", err, b)
	}
	out, err := exec.Command(e.Launcher, "--config", cfg, "assets").CombinedOutput()
	if err != nil {
		t.Fatalf("assets: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "kernel "); ok {
			e.Kernel = v
		}
	}
	e.Image = filepath.Join(images, "busybox.tar")
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	e.HostBoot = strings.TrimSpace(string(b))

	plug := fmt.Sprintf("required %s launcher=%s config=%s", filepath.Join(bin, "spank_microvm.so"), e.Launcher, cfg)
	// Two fake GPUs (character devices 195:N, as Slurm requires; no
	// device backs them) and two stand-in ones (gpu:standin, booted
	// without VFIO by the stand-in build) for the GPU steps; steps
	// without --gres are unaffected.
	opts := cluster.Options{PlugstackLine: plug, StartTimeout: 90 * time.Second, FakeGPUs: 2, StandinGPUs: 2, Env: clusterEnv}
	if tune != nil {
		tune(&opts)
	}
	e.C = cluster.Up(t, opts)
	// Runs before the cluster goes down (cleanups run last first).
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("slurm-microvm: warnings and errors of this cluster's step logs (%s):\n%s", LogDir, StepLogProblems(LogDir, stepLogProblemLines))
		}
	})
	u, err := user.Lookup(cluster.TestUser)
	if err != nil {
		t.Fatal(err)
	}
	e.TestUID, _ = strconv.Atoi(u.Uid)
	return e
}

// WriteConfig replaces the cluster's microvm.toml by the tests' one with
// top (top-level keys, e.g. runtime = "kata") before it and tables (more
// tables) after it, renamed into place: the next step reads it.
func (e *Env) WriteConfig(top, tables string) error {
	conf := top + "\n" + e.baseConfig + tables
	tmp := e.Config + ".tmp"
	if err := os.WriteFile(tmp, []byte(conf), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, e.Config)
}

// Nodes are the cluster's node names (cluster.Cluster.Nodes): one, or n1
// and n2 with TwoNodes.
func (e *Env) Nodes() []string { return e.C.Nodes() }

// Srun runs srun as userName ("" for root) with a generous timeout.
func (e *Env) Srun(t testing.TB, userName string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	stdout, stderr, code, err := e.C.Srun(ctx, userName, args...)
	if err != nil && code < 0 {
		t.Fatalf("srun %v: %v\nstderr: %s", args, err, stderr)
	}
	return stdout, stderr, code
}

// Leftovers lists what remains of job on this node: state directories,
// VMM processes, mounts and sockets mentioning the runtime directory.
func (e *Env) Leftovers(job int) []string {
	var out []string
	entries, _ := os.ReadDir(RuntimeDir)
	for _, en := range entries {
		if strings.HasPrefix(en.Name(), strconv.Itoa(job)+".") {
			out = append(out, "state dir "+en.Name())
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, "slurm-microvm-"+strconv.Itoa(job)+".") ||
			(strings.Contains(cmd, e.Launcher) && strings.Contains(cmd, "--job "+strconv.Itoa(job)+" ")) {
			out = append(out, "process "+filepath.Base(filepath.Dir(p))+": "+cmd)
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, RuntimeDir) {
			out = append(out, "mount "+line)
		}
	}
	un, _ := os.ReadFile("/proc/net/unix")
	for _, line := range strings.Split(string(un), "\n") {
		if strings.Contains(line, RuntimeDir) {
			out = append(out, "socket "+line)
		}
	}
	return out
}

// WaitClean waits (up to 15 s, stop is asynchronous to srun's exit) until
// nothing of job is left, and fails with the list otherwise.
func (e *Env) WaitClean(t testing.TB, job int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		left := e.Leftovers(job)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("job %d left behind:\n  %s", job, strings.Join(left, "\n  "))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// InstallFile copies src to dst as make install does (hack/install.sh): a
// new file in dst's directory, renamed over dst. A slurmd or slurmstepd
// that still has the old dst mapped (the plugin) keeps its inode intact;
// writing in place truncated it under a running slurmd, which crashed.
func InstallFile(src, dst string, mode os.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("install %s: %w", dst, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp")
	if err != nil {
		return fmt.Errorf("install %s: %w", dst, err)
	}
	defer os.Remove(tmp.Name()) // after the rename: already gone
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("install %s: write %s: %w", dst, tmp.Name(), err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("install %s: chmod %s: %w", dst, tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("install %s: close %s: %w", dst, tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("install %s: %w", dst, err)
	}
	return nil
}

// Scope is what the steps of the end-to-end tests own on this host (see
// package residue): their state, cache, scratch and data trees, the
// installation, the processes of QEMU, virtiofsd and the launcher, and
// the step network objects in the host's network namespace and, in
// two-node mode, in each node's.
func (e *Env) Scope() residue.Scope {
	return residue.Scope{
		Paths:      []string{RuntimeDir, e.cacheDir, ScratchDir, DataDir, Root},
		RuntimeDir: RuntimeDir,
		Records:    []string{state.StoppedDir},
		// SMV_RESIDUE_TMP_IGNORE=GLOB[:GLOB...]: names in /tmp that other
		// programs of a shared development host make (unset in CI).
		TmpIgnore: filepath.SplitList(os.Getenv("SMV_RESIDUE_TMP_IGNORE")),
		CacheDir:  e.cacheDir,
		Programs:  []string{"qemu-system-x86_64", "virtiofsd", e.Launcher, "containerd-shim-runc-v2", "containerd-shim-kata-v2", "runc"},
		NetNS:     e.C.NodeNetNSPaths(),
	}
}

// NothingLeft snapshots the host now and, when t ends, waits (up to 15 s:
// stop is asynchronous to srun's exit) until nothing that a step made is
// left anywhere on the host, failing t with the list otherwise.
func (e *Env) NothingLeft(t testing.TB) {
	t.Helper()
	snap := residue.Take(e.Scope())
	t.Cleanup(func() {
		if left := snap.WaitClean(context.Background(), 15*time.Second); len(left) > 0 {
			t.Errorf("left on the host after the test:\n  %s", strings.Join(left, "\n  "))
		}
	})
}

// Run runs f as subtest name of t with the host-wide "nothing left" check
// after it (NothingLeft): every end-to-end test runs through it.
func (e *Env) Run(t *testing.T, name string, f func(t *testing.T)) bool {
	t.Helper()
	return t.Run(name, func(t *testing.T) {
		e.NothingLeft(t)
		f(t)
	})
}

// InstallStandinDriver builds (or finds in CacheDir) the stand-in NVIDIA
// driver for the guest kernel (test/fixture/nvstandin) and installs it at
// GPUDriverRoot, gpu.driver.root of the test configuration, until t ends.
func InstallStandinDriver(t *testing.T, e *Env) *nvstandin.Driver {
	t.Helper()
	d := nvstandin.Require(t, nvstandin.Options{KernelRelease: e.Kernel, CacheDir: filepath.Join(CacheDir, "nvstandin")})
	if err := os.RemoveAll(GPUDriverRoot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(GPUDriverRoot) })
	if out, err := exec.Command("cp", "-a", d.Root+"/.", GPUDriverRoot).CombinedOutput(); err != nil {
		t.Fatalf("install the stand-in driver at %s: %v\n%s", GPUDriverRoot, err, out)
	}
	return d
}
