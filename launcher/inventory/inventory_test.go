package inventory_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher"
	"github.com/slurm-microvm/slurm-microvm/launcher/inventory"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// newStep writes a step directory as prepare does: root-owned 0700 and the
// spec of a launcher.Spec (so a renamed spec field fails these tests).
func newStep(t *testing.T, root string, id state.StepID, s launcher.Spec) state.Dir {
	t.Helper()
	d := state.Dir{Root: root, ID: id}
	if err := state.MakeDir(root, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(d.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	s.ID = id
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := state.WriteFileAtomic(d.File(state.SpecFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// deadPid is the pid of a process that ran and ended, recorded while it ran.
func recordDead(t *testing.T, path string) {
	t.Helper()
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := state.WriteProc(path, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

func TestList(t *testing.T) {
	spec := launcher.Spec{UID: 1234, User: "alice", Image: "docker://alpine:3.20", MemMiB: 2048, CPUs: 2}
	me := os.Getpid()
	tests := []struct {
		name   string
		setup  func(t *testing.T, d state.Dir)
		want   inventory.Sandbox
		digest string
	}{
		{name: "preparing", setup: func(t *testing.T, d state.Dir) {},
			want: inventory.Sandbox{Phase: inventory.PhasePreparing, VCPUs: 2, MemoryMiB: 2048}},
		{name: "booting", setup: func(t *testing.T, d state.Dir) {
			if err := d.RecordSupervisor(me); err != nil {
				t.Fatal(err)
			}
		}, want: inventory.Sandbox{Phase: inventory.PhaseBooting, SupervisorPid: me, VCPUs: 2, MemoryMiB: 2048}},
		{name: "running", setup: func(t *testing.T, d state.Dir) {
			if err := d.RecordSupervisor(me); err != nil {
				t.Fatal(err)
			}
			if err := inventory.WriteResolved(d, inventory.Resolved{ImageDigest: "sha256:abcd", VCPUs: 3, MemoryMiB: 1536, Driver: "qemu",
				PhasesMS: map[string]int64{launcher.PhaseBoot: 812}}); err != nil {
				t.Fatal(err)
			}
			if err := state.WriteProc(d.File(state.VMMPidFile), me); err != nil {
				t.Fatal(err)
			}
			if err := state.WriteFileAtomic(d.File(state.ReadyFile), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, want: inventory.Sandbox{Phase: inventory.PhaseRunning, SupervisorPid: me, VMMPid: me, VCPUs: 3, MemoryMiB: 1536, ImageDigest: "sha256:abcd"}},
		{name: "stopping", setup: func(t *testing.T, d state.Dir) {
			if err := d.RecordSupervisor(me); err != nil {
				t.Fatal(err)
			}
			if err := state.WriteFileAtomic(d.File(state.ReadyFile), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := d.MarkStopped(); err != nil {
				t.Fatal(err)
			}
		}, want: inventory.Sandbox{Phase: inventory.PhaseStopping, SupervisorPid: me, VCPUs: 2, MemoryMiB: 2048}},
		{name: "failed with an error", setup: func(t *testing.T, d state.Dir) {
			if err := d.RecordSupervisor(me); err != nil {
				t.Fatal(err)
			}
			if err := state.WriteFileAtomic(d.File(state.ErrorFile), []byte("image docker://alpine:3.20: not found\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, want: inventory.Sandbox{Phase: inventory.PhaseFailed, SupervisorPid: me, VCPUs: 2, MemoryMiB: 2048, Error: "image docker://alpine:3.20: not found"}},
		{name: "supervisor gone", setup: func(t *testing.T, d state.Dir) {
			if err := state.WriteFileAtomic(d.File(state.ReadyFile), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			recordDead(t, d.File(state.SupervisorFile))
		}, want: inventory.Sandbox{Phase: inventory.PhaseFailed, VCPUs: 2, MemoryMiB: 2048}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "run")
			id := state.StepID{Job: 42, Step: 1, Restart: 0, Node: "n1"}
			d := newStep(t, root, id, spec)
			tc.setup(t, d)
			// Not steps: the stop records and a stray file.
			if err := os.WriteFile(filepath.Join(root, "stray"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			now := time.Now().Add(90 * time.Second)
			got, err := inventory.List(root, now)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Fatalf("List: %d sandboxes, want 1: %+v", len(got), got)
			}
			g := got[0]
			w := tc.want
			w.ID, w.Job, w.Step, w.Node, w.UID, w.User, w.Image = "42.1.0.n1", 42, 1, "n1", 1234, "alice", "docker://alpine:3.20"
			if g.SupervisorPid == 0 && w.Phase == inventory.PhaseFailed && tc.name == "supervisor gone" {
				t.Fatal("a dead supervisor's pid is still recorded: want it shown")
			}
			if tc.name == "supervisor gone" {
				w.SupervisorPid = g.SupervisorPid
			}
			if g.UptimeS < 89 || g.UptimeS > 120 {
				t.Errorf("uptime_s %d, want about 90", g.UptimeS)
			}
			g.StartedAt, g.UptimeS = time.Time{}, 0
			if g != w {
				t.Errorf("List:\n got %+v\nwant %+v", g, w)
			}
		})
	}
}

func TestListOrderAndJSON(t *testing.T) {
	root := filepath.Join(t.TempDir(), "run")
	for _, id := range []state.StepID{{Job: 9, Step: 0, Node: "b"}, {Job: 9, Step: 0, Node: "a"}, {Job: 3, Step: 2}} {
		newStep(t, root, id, launcher.Spec{User: "u", Image: "img"})
	}
	got, err := inventory.List(root, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range got {
		ids = append(ids, s.ID)
	}
	if strings.Join(ids, " ") != "3.2.0 9.0.0.a 9.0.0.b" {
		t.Errorf("order %v", ids)
	}
	b, err := json.Marshal(got[0])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "job", "step", "restart", "node", "uid", "user", "image", "image_digest", "vcpus", "memory_mib", "phase", "started_at", "uptime_s", "supervisor_pid", "vmm_pid"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON has no %q: %s", k, b)
		}
	}
	if none, err := inventory.List(filepath.Join(root, "absent"), time.Now()); err != nil || len(none) != 0 {
		t.Errorf("List of a missing root: %v, %v; want none, nil", none, err)
	}
}

func TestListPermission(t *testing.T) {
	prereq.Root(t, "to drop to another uid")
	// Under /run (0755, written by root only): another uid can reach the
	// runtime root, as on a node, and run a copy of this test binary.
	base, err := os.MkdirTemp("/run", "inventory-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "inventory.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "run")
	newStep(t, root, state.StepID{Job: 1}, launcher.Spec{Image: "img"})
	// Another user (nobody) lists the root 0711: refused, and the error says root.
	cmd := exec.Command(bin, "-test.run=^TestHelperList$")
	cmd.Env = append(os.Environ(), "INVENTORY_HELPER_ROOT="+root)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "run this as root") {
		t.Errorf("a non-root List said %q, want it to name root", out)
	}
}

func TestHelperList(t *testing.T) {
	root := os.Getenv("INVENTORY_HELPER_ROOT")
	if root == "" {
		prereq.OptIn(t, "helper process for TestListPermission")
	}
	_, err := inventory.List(root, time.Now())
	if !errors.Is(err, inventory.ErrPermission) {
		t.Fatalf("List as uid %d: %v, want ErrPermission", os.Getuid(), err)
	}
	os.Stdout.WriteString(err.Error() + "\n")
}

func TestFind(t *testing.T) {
	root := filepath.Join(t.TempDir(), "run")
	for _, id := range []state.StepID{{Job: 7, Step: 0, Restart: 0, Node: "n1"}, {Job: 7, Step: 0, Restart: 1, Node: "n1"},
		{Job: 8, Step: 2, Node: "n1"}, {Job: 8, Step: 2, Node: "n2"}} {
		newStep(t, root, id, launcher.Spec{Image: "img"})
	}
	tests := []struct {
		arg, node string
		want      string // the step dir's name, or the error's text
		err       bool
	}{
		{arg: "7.0", want: "7.0.1.n1"},
		{arg: "7.0.0", want: "7.0.0.n1"},
		{arg: "7.0.0", node: "n1", want: "7.0.0.n1"},
		{arg: "8.2", node: "n2", want: "8.2.0.n2"},
		{arg: "8.2", err: true, want: "name one with --node"},
		{arg: "7.5", err: true, want: `step 7.5: no sandbox on this node`},
		{arg: "7.0", node: "n9", err: true, want: "no sandbox on node n9"},
		{arg: "7", err: true, want: `step "7": want JOB.STEP`},
		{arg: "7.x", err: true, want: `"x" is not a number`},
		{arg: "7.0.0.0", err: true, want: "want JOB.STEP"},
		{arg: "7.0", node: "-bad", err: true, want: "--node"},
	}
	for _, tc := range tests {
		t.Run(tc.arg+"@"+tc.node, func(t *testing.T) {
			d, err := inventory.Find(root, tc.arg, tc.node)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Find(%q, %q) = %v, %v; want an error with %q", tc.arg, tc.node, d.ID, err, tc.want)
				}
				return
			}
			if err != nil || d.ID.String() != tc.want {
				t.Fatalf("Find(%q, %q) = %v, %v; want %s", tc.arg, tc.node, d.ID, err, tc.want)
			}
		})
	}
}

func TestReadRecord(t *testing.T) {
	root := filepath.Join(t.TempDir(), "run")
	d := newStep(t, root, state.StepID{Job: 5, Step: 3}, launcher.Spec{Image: "img", Cores: "0-1", User: "bob"})
	if err := inventory.WriteResolved(d, inventory.Resolved{Driver: "qemu", PhasesMS: map[string]int64{"image": 5}}); err != nil {
		t.Fatal(err)
	}
	r, err := inventory.Read(d, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if r.StateDir != d.Path() || r.Driver != "qemu" || r.PhasesMS["image"] != 5 || !strings.Contains(string(r.Spec), `"cores":"0-1"`) {
		t.Errorf("record %+v spec %s", r, r.Spec)
	}
	if err := os.RemoveAll(d.Path()); err != nil {
		t.Fatal(err)
	}
	if _, err := inventory.Read(d, time.Now()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read of a removed step: %v, want ErrNotExist", err)
	}
}

func TestRunning(t *testing.T) {
	root := filepath.Join(t.TempDir(), "run")
	me := os.Getpid()
	for i, ready := range []bool{true, true, false} {
		d := newStep(t, root, state.StepID{Job: uint32(10 + i)}, launcher.Spec{Image: "img"})
		if err := d.RecordSupervisor(me); err != nil {
			t.Fatal(err)
		}
		if ready {
			if err := state.WriteFileAtomic(d.File(state.ReadyFile), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	newStep(t, root, state.StepID{Job: 20}, launcher.Spec{Image: "img"}) // preparing
	for _, tc := range []struct {
		except state.StepID
		want   int
	}{{state.StepID{Job: 99}, 3}, {state.StepID{Job: 10}, 2}} {
		if n, err := inventory.Running(root, tc.except); err != nil || n != tc.want {
			t.Errorf("Running(except %s) = %d, %v; want %d", tc.except, n, err, tc.want)
		}
	}
}
