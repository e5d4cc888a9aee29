package launcher

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/image"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// envImageHelper makes the test binary the image helper child (the
// hidden `slurm-microvm image helper`), which runs as the job's user.
const envImageHelper = "LAUNCHER_TEST_IMAGE_HELPER"

// testBin is a copy of the test binary that any user can execute (the go
// build cache is not searchable by others), made by the first real step.
// Not in TestMain: tests that re-execute the binary (and end it by a
// signal) would leave a copy each.
var (
	testBinOnce sync.Once
	testBinDir  string
	testBin     string
	testBinErr  error
)

func testBinary(t *testing.T) string {
	t.Helper()
	testBinOnce.Do(func() {
		testBinDir, testBinErr = os.MkdirTemp("", "launcher-test-bin-")
		if testBinErr != nil {
			return
		}
		var exe []byte
		exe, testBinErr = os.ReadFile(os.Args[0])
		if testBinErr == nil {
			testBinErr = os.Chmod(testBinDir, 0o755)
		}
		if testBinErr == nil {
			testBin = filepath.Join(testBinDir, "launcher.test")
			testBinErr = os.WriteFile(testBin, exe, 0o755)
		}
	})
	if testBinErr != nil {
		t.Fatalf("copy the test binary: %v", testBinErr)
	}
	return testBin
}

func TestMain(m *testing.M) {
	if os.Getenv(envImageHelper) == "1" {
		os.Exit(image.RunHelper(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	code := m.Run()
	if testBinDir != "" {
		os.RemoveAll(testBinDir)
	}
	fixture.RemoveAgent()
	os.Exit(code)
}

// realStep is a step whose supervisor (Launcher.Start) runs in this test
// process and boots a real microVM (TCG where the host has no KVM) of a
// busybox image, with no host shares, MPI or network.
type realStep struct {
	l   *Launcher
	s   *Spec
	d   state.Dir
	log *fixture.SyncBuffer
	// ended is closed when Start returned, with startErr.
	ended    chan struct{}
	startErr error
	stop     context.CancelFunc
}

// startRealStep prepares the step (the job's memory memMiB, one vCPU) with
// the configuration tune changed, starts its supervisor and returns once
// the sandbox is ready. Cleanup stops the supervisor and removes
// everything of the step.
func startRealStep(t *testing.T, memMiB uint64, tune func(*config.Config)) *realStep {
	t.Helper()
	fixture.RequireRoot(t) // the VMM and the workload run as nobody
	fixture.Require(t, "qemu-system-x86_64", "mkfs.erofs", "busybox")
	tmp := t.TempDir()
	// The image is opened as the job's user (nobody).
	for _, d := range []string{filepath.Dir(tmp), tmp} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rootfs := filepath.Join(tmp, "rootfs")
	fixture.BusyboxRootfs(t, rootfs, "Launcher Test OS")
	img := filepath.Join(tmp, "busybox.tar")
	fixture.OCIArchive(t, rootfs, img, "launcher-test/busybox:1", v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, WorkingDir: "/"})
	if err := os.Chmod(img, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.RuntimeDir = filepath.Join(tmp, "run")
	cfg.CacheDir = filepath.Join(tmp, "cache")
	cfg.Log.Dir = ""
	cfg.Mounts.ScratchBase = ""
	cfg.MPI.Default = "off"
	cfg.QEMU.Agent = fixture.Agent(t)
	cfg.Timeouts.Boot = config.Duration{Duration: 2 * time.Minute}
	cfg.Timeouts.StopGrace = config.Duration{Duration: 3 * time.Second}
	if tune != nil {
		tune(&cfg)
	}
	logBuf := &fixture.SyncBuffer{}
	l := &Launcher{Config: &cfg, Log: slog.New(slog.NewTextHandler(logBuf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		imageHelper: []string{testBinary(t)}, imageHelperEnv: []string{envImageHelper + "=1"}}
	// A job id no cgroup of this host has: entering its cgroups is a no-op.
	s := &Spec{ID: state.StepID{Job: 4000000000 + uint32(time.Now().UnixNano()%1000000), Step: 0},
		UID: 65534, GID: 65534, Groups: []uint32{65534}, User: "nobody",
		Image: img, MemMiB: memMiB, CPUs: 1, LocalTasks: 1, Hostname: "launcher-test", Network: "none"}
	ctx := context.Background()
	if err := l.Prepare(ctx, s); err != nil {
		t.Fatal(err)
	}
	r := &realStep{l: l, s: s, d: s.Dir(&cfg), log: logBuf, ended: make(chan struct{})}
	sctx, stop := context.WithCancel(ctx)
	r.stop = stop
	go func() {
		r.startErr = l.Start(sctx, s.ID)
		close(r.ended)
	}()
	t.Cleanup(func() {
		stop()
		select {
		case <-r.ended:
		case <-time.After(30 * time.Second):
			t.Error("the supervisor did not return within 30 s of its stop")
		}
		// The supervisor was this process, which Stop would signal.
		_ = os.Remove(r.d.File(state.SupervisorFile))
		if err := l.Stop(context.Background(), s.ID); err != nil {
			t.Errorf("stop: %v", err)
		}
		if t.Failed() {
			t.Logf("supervisor log:\n%s", logBuf.String())
		}
	})
	if err := WaitReady(ctx, r.d.Path(), 3*time.Minute); err != nil {
		t.Fatalf("sandbox not ready: %v\nsupervisor log:\n%s", err, logBuf.String())
	}
	return r
}

// exec runs argv in the step as a task would (Launcher.Exec), in the
// background; the result comes on the returned channel.
func (r *realStep) exec(ctx context.Context, argv ...string) (<-chan execResult, *fixture.SyncBuffer, *fixture.SyncBuffer) {
	out, errOut := &fixture.SyncBuffer{}, &fixture.SyncBuffer{}
	ch := make(chan execResult, 1)
	go func() {
		st, err := r.l.Exec(ctx, r.d.Path(), argv, []string{"HOME=/"}, Stdio{Out: out, Err: errOut})
		ch <- execResult{st, err}
	}()
	return ch, out, errOut
}

type execResult struct {
	st  driver.ExitStatus
	err error
}

// waitOutput waits until b holds want, or fails t after timeout.
func waitOutput(t *testing.T, b *fixture.SyncBuffer, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(b.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output %q lacks %q after %s", b.String(), want, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
