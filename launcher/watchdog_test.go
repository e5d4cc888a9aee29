package launcher

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/inventory"
	"github.com/slurm-microvm/slurm-microvm/launcher/metrics"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// TestHungGuestFailsStep boots a real microVM, runs a task in it, and
// freezes the guest by stopping its VMM (SIGSTOP: the process lives, the
// guest answers nothing). The supervisor must fail the step within
// agent_hang and a margin, with the reason in the error file, kill the
// VMM, and the task blocked in its Wait must end at once with that
// reason. A guest that answers is never taken as hung: the step first
// runs longer than agent_hang untouched. Before the watchdog the
// supervisor never looked at the agent once the step ran, and the task
// waited until Slurm's time limit.
func TestHungGuestFailsStep(t *testing.T) {
	const ping, hang = time.Second, 4 * time.Second
	r := startRealStep(t, 768, func(c *config.Config) {
		c.Timeouts.AgentPing = config.Duration{Duration: ping}
		c.Timeouts.AgentHang = config.Duration{Duration: hang}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, out, errOut := r.exec(ctx, "sh", "-c", "echo READY; sleep 300")
	waitOutput(t, out, "READY", time.Minute)
	vmm, err := state.ReadProc(r.d.File(state.VMMPidFile))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(hang + 2*ping)
	select {
	case <-r.ended:
		t.Fatalf("the supervisor ended while the guest answered: %v", r.startErr)
	default:
	}
	t0 := time.Now()
	if err := vmm.Signal(unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = vmm.Signal(unix.SIGCONT) }()
	const margin = 6 * time.Second // one ping interval, the kill, a loaded host
	select {
	case <-r.ended:
	case <-time.After(hang + margin):
		t.Fatalf("the supervisor did not notice the hung guest within %s (agent_hang %s)", hang+margin, hang)
	}
	took := time.Since(t0)
	startErr := r.startErr
	t.Logf("hung guest detected after %v: %v", took, startErr)
	var he *AgentHungError
	if !errors.As(startErr, &he) || he.Hang != hang {
		t.Fatalf("Start: %v, want an AgentHungError of %s", startErr, hang)
	}
	if took < hang-ping {
		t.Errorf("detected after %v: before agent_hang (%s) passed", took, hang)
	}
	const want = "the guest agent did not answer for 4s (timeouts.agent_hang): the guest is hung; the microVM was stopped"
	if b, err := os.ReadFile(r.d.File(state.ErrorFile)); err != nil || strings.TrimSpace(string(b)) != want {
		t.Errorf("error file %q (%v), want %q", b, err, want)
	}
	if vmm.Alive() {
		t.Errorf("VMM pid %d still alive after the hang was detected", vmm.Pid)
	}
	// The admin's log says what the VMM did when the guest hung: here its
	// vCPU threads were stopped (state T) and took no CPU.
	if line := regexp.MustCompile(`msg="hung guest" .*vmm=".*CPU 0/[A-Z]+ T [0-9]+ms \+0ms.*guest console: .*`).FindString(r.log.String()); line == "" {
		t.Errorf("supervisor log lacks the hung guest's threads:\n%s", r.log.String())
	} else {
		t.Log(line)
	}
	select {
	case got := <-res:
		if got.err == nil || got.err.Error() != want || !errors.Is(got.err, driver.ErrSandboxExited) {
			t.Errorf("task: status %+v, err %v; want %q (ErrSandboxExited)", got.st, got.err, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the task did not end within 5 s of the supervisor (stderr %q)", errOut.String())
	}
}

// TestGuestOOMReported boots a real microVM of 256 MiB (a step of 448
// MiB, less the VMM's 192) and runs a workload that touches more memory
// than the guest has: the guest kernel's OOM killer kills it. The task
// must end as killed by SIGKILL, as on the host, with the OOM flag set
// and one line on stderr saying why and how big the guest was. Before,
// the task just died by SIGKILL with no reason.
func TestGuestOOMReported(t *testing.T) {
	r := startRealStep(t, 448, func(c *config.Config) {
		c.Resources.VMMOverheadMiB = 192
		c.Resources.OverlayMiB = 64
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// 200 MiB is below the guest's total (so the heuristic overcommit
	// lets the allocation through) but more than is free.
	res, _, errOut := r.exec(ctx, "dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1")
	var got execResult
	select {
	case got = <-res:
	case <-ctx.Done():
		t.Fatal("the task did not end")
	}
	t.Logf("status %+v, err %v, stderr %q", got.st, got.err, errOut.String())
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.st.Signal != unix.SIGKILL || !got.st.OOMKilled {
		t.Errorf("status %+v: want killed by SIGKILL with OOMKilled", got.st)
	}
	const want = "slurm-microvm: the task was killed by the guest's out-of-memory killer: the step's memory is exhausted (guest 256 MiB, from the step's memory allocation, --mem, less the VMM's 192 MiB)"
	if !strings.Contains(errOut.String(), want) {
		t.Errorf("stderr %q lacks %q", errOut.String(), want)
	}
	// The robust path: each process is in a cgroup of its own.
	res, out, _ := r.exec(ctx, "cat", "/proc/self/cgroup")
	if got := <-res; got.err != nil || !strings.HasPrefix(out.String(), "0::/task-") {
		t.Errorf("/proc/self/cgroup in the guest: %q (%v): want a cgroup of its own, 0::/task-N", out.String(), got.err)
	}
	// A task that its own kill -9 ends is not an OOM kill.
	res, _, errOut = r.exec(ctx, "sh", "-c", "kill -KILL $$")
	if got := <-res; got.err != nil || got.st.Signal != unix.SIGKILL || got.st.OOMKilled || strings.Contains(errOut.String(), "out-of-memory") {
		t.Errorf("kill -KILL: status %+v, err %v, stderr %q: want SIGKILL without OOM", got.st, got.err, errOut.String())
	}
}

// TestPhasesLogged: the supervisor of a real step logs one line per phase
// of its start and one for its stop, each with its duration in whole ms
// (msg=phase phase=<name> ms=<int>), in order, and nothing of the task's
// environment.
func TestPhasesLogged(t *testing.T) {
	textfile := filepath.Join(t.TempDir(), "slurm_microvm.prom")
	r := startRealStep(t, 768, func(c *config.Config) { c.Metrics.Textfile = textfile })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const secret = "s3cr3t-phase-value"
	st, err := r.l.Exec(ctx, r.d.Path(), []string{"true"}, []string{"API_TOKEN=" + secret}, Stdio{})
	if err != nil || st.Code != 0 {
		t.Fatalf("true: %+v, %v", st, err)
	}
	// ps's record of the running sandbox: what the supervisor resolved,
	// the first exec timed.
	rec, err := inventory.Read(r.d, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if rec.Phase != inventory.PhaseRunning || rec.VCPUs != 1 || rec.MemoryMiB == 0 || !strings.HasPrefix(rec.ImageDigest, "sha256:") || rec.VMMPid == 0 {
		t.Errorf("inventory of the running sandbox: %+v", rec.Sandbox)
	}
	if _, ok := rec.PhasesMS[PhaseFirstExec]; !ok {
		t.Errorf("sandbox.json phases %v lack %s", rec.PhasesMS, PhaseFirstExec)
	}
	r.stop()
	select {
	case <-r.ended:
	case <-ctx.Done():
		t.Fatal("the supervisor did not stop")
	}
	// The node's metrics count the step, every phase in its histogram.
	var out bytes.Buffer
	if err := metrics.Write(&out, metrics.Options{Textfile: textfile, RuntimeDir: r.l.Config.RuntimeDir}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "slurm_microvm_starts_total 1\n") {
		t.Errorf("metrics.Write: %s", out.String())
	}
	b, err := os.ReadFile(textfile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"slurm_microvm_starts_total 1\n", `slurm_microvm_phase_duration_seconds_count{phase="first_exec"} 1`, `slurm_microvm_phase_duration_seconds_count{phase="stop"} 1`, `slurm_microvm_failures_total{stage="boot"} 0`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics textfile lacks %q:\n%s", want, b)
		}
	}
	log := r.log.String()
	line := regexp.MustCompile(`(?m)^time=\S+ level=INFO msg=phase step=\S+ phase=(\w+) ms=(\d+)$`)
	var got []string
	for _, m := range line.FindAllStringSubmatch(log, -1) {
		got = append(got, m[1])
		t.Logf("%s: %s ms", m[1], m[2])
	}
	want := []string{PhaseGPUs, PhaseShares, PhaseImage, PhaseMPI, PhaseAssets, PhaseNetwork, PhaseBoot, PhaseReady, PhaseStart, PhaseFirstExec, PhaseStop}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("phase lines %q, want %q; log:\n%s", got, want, log)
	}
	if n := strings.Count(log, "msg=phase"); n != len(want) {
		t.Errorf("%d lines with msg=phase, want %d (each of the form phase=<name> ms=<int>)", n, len(want))
	}
	if strings.Contains(log, secret) {
		t.Errorf("the supervisor log holds a value of the task's environment:\n%s", log)
	}
}
