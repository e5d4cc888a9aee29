package launcher

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

func TestTaskEnv(t *testing.T) {
	in := []string{"A=1", EnvArgv0 + "=hostname", EnvStep + "=1.0.0", EnvConfig + "=/etc/x", EnvState + "=/run/x", "SLURM_PROCID=0"}
	got := strings.Join(TaskEnv(in), " ")
	if got != "A=1 SLURM_PROCID=0" {
		t.Fatalf("TaskEnv = %q: the plugin's hand-off variables must not reach the guest", got)
	}
}

func TestWaitReady(t *testing.T) {
	sleeper := exec.Command("sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _, _ = sleeper.Process.Wait() })
	dead := exec.Command("true")
	if err := dead.Start(); err != nil {
		t.Fatal(err)
	}
	deadProc, _ := state.ProcOf(dead.Process.Pid)
	_ = dead.Wait()

	tests := []struct {
		name    string
		setup   func(dir string)
		wantErr string
	}{
		{"ready", func(d string) { touch(t, d, state.ReadyFile) }, ""},
		{"error file", func(d string) { write(t, d, state.ErrorFile, "image \"x\": no such file\n") }, "image \"x\": no such file"},
		{"missing state", func(d string) { os.RemoveAll(d) }, "no sandbox state"},
		{"supervisor died", func(d string) {
			write(t, d, state.SupervisorFile, strconv.Itoa(deadProc.Pid)+" "+strconv.FormatUint(deadProc.StartTime, 10)+"\n")
		}, "supervisor exited before the microVM was ready"},
		{"timeout", func(d string) {
			if err := state.WriteProc(filepath.Join(d, state.SupervisorFile), sleeper.Process.Pid); err != nil {
				t.Fatal(err)
			}
		}, "not ready within"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "1.0.0")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			tt.setup(dir)
			err := WaitReady(context.Background(), dir, 300*time.Millisecond)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestPrepareStopIdempotent(t *testing.T) {
	cfg := config.Defaults()
	cfg.RuntimeDir = t.TempDir()
	l := &Launcher{Config: &cfg}
	s := &Spec{ID: state.StepID{Job: 7, Step: 0}, UID: 1000, GID: 1000, Image: "/img.tar", LocalTasks: 2, MemMiB: 2048}
	for i := 0; i < 2; i++ { // SPANK callbacks may run twice
		if err := l.Prepare(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ReadSpec(s.Dir(&cfg).Path())
	if err != nil || got.Image != "/img.tar" || got.LocalTasks != 2 {
		t.Fatalf("spec %+v, %v", got, err)
	}
	// Root's 0700 with the ACL's mask (--x) in the group bits when
	// prepared for a user by root (package state).
	want := os.FileMode(0o700)
	if os.Geteuid() == 0 {
		want = 0o710
	}
	if fi, err := os.Stat(s.Dir(&cfg).Path()); err != nil || fi.Mode().Perm() != want {
		t.Fatalf("state dir: %v %v, want mode %v", fi, err, want)
	}
	if err := l.Prepare(context.Background(), &Spec{ID: s.ID, Image: "/img.tar", MemMiB: 200}); err == nil {
		t.Fatal("a step too small for the guest was accepted")
	}
	for i := 0; i < 2; i++ {
		if err := l.Stop(context.Background(), s.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(s.Dir(&cfg).Path()); !os.IsNotExist(err) {
		t.Fatalf("state dir left after stop: %v", err)
	}
	// A stopped step is never prepared again (a late SPANK callback).
	if err := l.Prepare(context.Background(), s); !errors.Is(err, state.ErrStopped) {
		t.Fatalf("prepare after stop: %v, want state.ErrStopped", err)
	}
	s.ID.Step = 1
	if err := l.Prepare(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if err := l.GC(context.Background(), 7, ""); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(cfg.RuntimeDir)
	records, _ := os.ReadDir(filepath.Join(cfg.RuntimeDir, state.StoppedDir))
	if len(entries) != 1 || entries[0].Name() != state.StoppedDir || len(records) != 0 {
		t.Fatalf("gc left %v and stop records %v", entries, records)
	}
}

func touch(t *testing.T, dir, name string) { write(t, dir, name, "") }

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestGuestGPUEnv(t *testing.T) {
	tests := []struct {
		env  []string
		gpus string
		want string
	}{
		{[]string{"A=1", "CUDA_VISIBLE_DEVICES=4,5"}, "0,1,4,5", "A=1 CUDA_VISIBLE_DEVICES=0,1,2,3"},
		{[]string{"CUDA_VISIBLE_DEVICES=GPU-1234"}, "2", "CUDA_VISIBLE_DEVICES=GPU-1234"},
		{[]string{"A=1"}, "3", "A=1 CUDA_VISIBLE_DEVICES=0"},
		{[]string{"A=1"}, "", "A=1"},
	}
	for _, tt := range tests {
		if got := strings.Join(guestGPUEnv(tt.env, tt.gpus), " "); tt.gpus != "" && got != tt.want {
			t.Errorf("guestGPUEnv(%v, %q) = %q, want %q", tt.env, tt.gpus, got, tt.want)
		}
	}
}

// TestSpecNonUTF8: the user's paths reach the supervisor and the tasks
// through spec.json byte for byte, UTF-8 or not.
func TestSpecNonUTF8(t *testing.T) {
	for _, v := range []string{"/w\xff\xfe", "/plain/ü", ""} {
		in := &Spec{ID: state.StepID{Job: 1}, Image: "/img" + v + ".sqsh", Mounts: "/src" + v + ":/dst" + v, Workdir: v, User: "u"}
		d := state.Dir{Root: t.TempDir(), ID: in.ID}
		if err := os.MkdirAll(d.Path(), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := writeSpec(d, in); err != nil {
			t.Fatal(err)
		}
		out, err := ReadSpec(d.Path())
		if err != nil {
			t.Fatal(err)
		}
		if out.Image != in.Image || out.Mounts != in.Mounts || out.Workdir != in.Workdir || out.User != "u" || out.ID != in.ID {
			t.Errorf("spec.json round trip of %q: got image %q mounts %q workdir %q user %q id %v", v, out.Image, out.Mounts, out.Workdir, out.User, out.ID)
		}
	}
}

// Several slurmd on one host (multiple-slurmd) share the runtime root: each
// node's epilog collects only its own node's steps, and two nodes' parts of
// one step never share a directory.
func TestGCLeavesOtherNodes(t *testing.T) {
	cfg := config.Defaults()
	cfg.RuntimeDir = t.TempDir()
	l := &Launcher{Config: &cfg}
	n1 := &Spec{ID: state.StepID{Job: 7, Step: 0, Node: "n1"}, UID: 1000, GID: 1000, Image: "/img.tar", LocalTasks: 1, MemMiB: 2048}
	n2 := &Spec{ID: state.StepID{Job: 7, Step: 0, Node: "n2"}, UID: 1000, GID: 1000, Image: "/img.tar", LocalTasks: 1, MemMiB: 2048}
	for _, s := range []*Spec{n1, n2} {
		if err := l.Prepare(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	if n1.Dir(&cfg).Path() == n2.Dir(&cfg).Path() {
		t.Fatalf("both nodes' parts of step 7.0 use %s", n1.Dir(&cfg).Path())
	}
	if err := l.GC(context.Background(), 7, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(n1.Dir(&cfg).Path()); !os.IsNotExist(err) {
		t.Errorf("gc of n1 left n1's state: %v", err)
	}
	if _, err := os.Stat(n2.Dir(&cfg).Path()); err != nil {
		t.Errorf("gc of n1 removed n2's state: %v", err)
	}
	// n2's step is not stopped by n1's gc: it still prepares.
	if err := l.Prepare(context.Background(), n2); err != nil {
		t.Errorf("n2's step after n1's gc: %v", err)
	}
}
