package cgroupv2

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// nodeModules are what nodeinit needs before the host's tree is its root:
// the microvm machine's virtio-mmio transport, 9p over virtio and the
// overlay for writes. Everything else the node loads from the host's
// /lib/modules with modprobe, as any machine does.
var nodeModules = []string{"virtio_mmio", "9p", "9pnet_virtio", "overlay"}

// node is one boot of the test node.
type node struct {
	// Work is the host directory shared read-write with the node at the
	// same path (9p tag "work"): what the node writes there is the test's
	// result. Outside /tmp and /run, which the node mounts afresh.
	Work string
	// MemoryMiB and CPUs size the node.
	MemoryMiB, CPUs int
}

// bootAssets builds (or finds in cacheDir) the node's kernel and
// initramfs: the host's newest Debian kernel, nodeinit as /init.
func bootAssets(t *testing.T, cacheDir string) *assets.Assets {
	t.Helper()
	initBin := filepath.Join(t.TempDir(), "nodeinit")
	b := exec.Command("go", "build", "-trimpath", "-o", initBin, "./test/cgroupv2/nodeinit")
	b.Dir = fixture.RepoRoot()
	b.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("build nodeinit: %v\n%s", err, out)
	}
	a, err := assets.Ensure(context.Background(), assets.Options{
		Agent: initBin, Modules: nodeModules, Required: nodeModules,
		CacheDir: cacheDir, CacheBytes: 256 << 20,
	})
	if err != nil {
		t.Fatalf("node boot assets: %v", err)
	}
	return a
}

// run boots the node with a, runs argv[0] (a path in the host's tree,
// seen read-only) with argv[1:] and env in it, and returns its exit
// status and the console's output. The node powers off when the command
// ends; ctx bounds the whole boot (QEMU is killed at its end).
func (n node) run(ctx context.Context, t *testing.T, a *assets.Assets, env []string, argv ...string) (int, string) {
	t.Helper()
	console := filepath.Join(n.Work, "console.log")
	status := filepath.Join(n.Work, "status")
	_ = os.Remove(status)
	_ = os.Remove(console)
	cmdline := append(assets.KernelCmdline("tcg"),
		"quiet", "loglevel=4",
		// Only the unified hierarchy: no v1 controller can be mounted.
		"cgroup_no_v1=all", "systemd.unified_cgroup_hierarchy=1",
		"smv.run="+argv[0], "smv.work="+n.Work, "smv.status="+status)
	for _, a := range argv[1:] {
		cmdline = append(cmdline, "smv.arg="+a)
	}
	for _, e := range env {
		cmdline = append(cmdline, "smv.env="+e)
	}
	for _, c := range cmdline[len(assets.KernelCmdline("tcg")):] {
		if strings.ContainsAny(c, " \t\n\"") {
			t.Fatalf("node command line piece %q: no spaces or quotes", c)
		}
	}
	args := []string{
		"-name", "guest=cgv2node,debug-threads=on",
		"-M", "microvm,x-option-roms=off,isa-serial=on,rtc=on",
		"-accel", "tcg", "-cpu", "max",
		"-smp", strconv.Itoa(n.CPUs), "-m", fmt.Sprintf("%dM", n.MemoryMiB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", a.Kernel, "-initrd", a.Initrd,
		"-append", strings.Join(cmdline, " "),
		"-chardev", "file,id=console,path=" + console,
		"-serial", "chardev:console",
		"-fsdev", "local,id=root,path=/,security_model=passthrough,readonly=on,multidevs=remap",
		"-device", "virtio-9p-device,fsdev=root,mount_tag=hostroot",
		"-fsdev", "local,id=work,path=" + n.Work + ",security_model=passthrough,multidevs=remap",
		"-device", "virtio-9p-device,fsdev=work,mount_tag=work",
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	con, _ := os.ReadFile(console)
	if err != nil {
		t.Fatalf("node: qemu: %v\n%s\nconsole:\n%s", err, out, con)
	}
	b, err := os.ReadFile(status)
	if err != nil {
		t.Fatalf("node: %s exited without a status (%v); console:\n%s", argv[0], err, con)
	}
	code, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("node: status %q: %v", b, err)
	}
	return code, string(con)
}
