// Package e2e runs real `srun --microvm` steps on a real one-node Slurm
// (slurmctld, slurmd, munge from Debian) with the plugin in plugstack.conf,
// booting real microVMs (TCG on machines without hardware KVM).
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/slurm-microvm/slurm-microvm/test/harness"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

var jobLine = regexp.MustCompile(`JOB=(\d+)`)

func jobOf(t *testing.T, out string) int {
	t.Helper()
	m := jobLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no JOB= line in %q", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func TestE2E(t *testing.T) {
	e := harness.Setup(t)
	img := "--microvm=" + e.Image

	e.Run(t, "os-release is the image's", func(t *testing.T) {
		out, errOut, code := e.Srun(t, "", img, "cat", "/etc/os-release")
		if code != 0 || !strings.Contains(out, e.ImageName) {
			t.Fatalf("exit %d, stdout %q, stderr %q: want the image's os-release", code, out, errOut)
		}
	})

	e.Run(t, "guest kernel", func(t *testing.T) {
		out, errOut, code := e.Srun(t, "", img, "uname", "-r")
		if code != 0 || strings.TrimSpace(out) != e.Kernel {
			t.Fatalf("exit %d, stdout %q, stderr %q: want guest kernel %q", code, out, errOut, e.Kernel)
		}
	})

	e.Run(t, "one VM per step per node", func(t *testing.T) {
		out, errOut, code := e.Srun(t, "", "-n2", img, "sh", "-c", "echo JOB=$SLURM_JOB_ID; echo $SLURM_PROCID $(cat /proc/sys/kernel/random/boot_id)")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		boots := map[string]bool{}
		ranks := map[string]bool{}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) == 2 {
				ranks[f[0]] = true
				boots[f[1]] = true
			}
		}
		if len(ranks) != 2 || len(boots) != 1 || boots[e.HostBoot] {
			t.Fatalf("ranks %v boot ids %v (host %s): want 2 ranks sharing one guest boot id\n%s", ranks, boots, e.HostBoot, out)
		}
		e.WaitClean(t, jobOf(t, out))
	})

	e.Run(t, "exit status", func(t *testing.T) {
		_, _, code := e.Srun(t, "", img, "sh", "-c", "exit 7")
		if code != 7 {
			t.Fatalf("exit %d, want 7", code)
		}
	})

	e.Run(t, "killed by signal", func(t *testing.T) {
		_, errOut, code := e.Srun(t, "", img, "sh", "-c", "kill -TERM $$")
		if code == 0 || !strings.Contains(errOut, "Terminated") {
			t.Fatalf("exit %d, stderr %q: want srun to report the task killed by signal 15", code, errOut)
		}
	})

	e.Run(t, "stdin", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd, err := e.C.Command(ctx, "", "srun", img, "cat")
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdin = strings.NewReader("hi\n")
		out, err := cmd.Output()
		if err != nil || string(out) != "hi\n" {
			t.Fatalf("echo hi | srun cat: %q, %v", out, err)
		}
	})

	e.Run(t, "srun --pty gives the workload a terminal", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd, err := e.C.Command(ctx, "", "srun", "--pty", img, "sh", "-c", "test -t 0 && test -t 1 && echo TTY-OK $(stty size)")
		if err != nil {
			t.Fatal(err)
		}
		ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 31, Cols: 97})
		if err != nil {
			t.Fatal(err)
		}
		defer ptmx.Close()
		var out bytes.Buffer
		_, _ = io.Copy(&out, ptmx) // EIO when srun exits
		_ = cmd.Wait()
		if !strings.Contains(out.String(), "TTY-OK 31 97") {
			t.Fatalf("output %q: want a terminal of 31x97 in the guest", out.String())
		}
	})

	e.Run(t, "command not found exits 127", func(t *testing.T) {
		_, errOut, code := e.Srun(t, "", img, "no-such-command")
		if code != 127 || !strings.Contains(errOut, "no-such-command: command not found") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})

	e.Run(t, "non-root user", func(t *testing.T) {
		out, errOut, code := e.Srun(t, "microvmtest", img, "sh", "-c", "echo JOB=$SLURM_JOB_ID; id -u; echo $IMAGE_VAR")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if !strings.Contains(out, "\n"+strconv.Itoa(e.TestUID)+"\n") || !strings.Contains(out, "from-image") {
			t.Fatalf("stdout %q: want uid %d and the image's environment", out, e.TestUID)
		}
		e.WaitClean(t, jobOf(t, out))
	})

	e.Run(t, "bad input fails before queueing", func(t *testing.T) {
		corrupt := harness.Root + "/images/corrupt.tar"
		data, _ := os.ReadFile(e.Image)
		if err := os.WriteFile(corrupt, data[:len(data)/3], 0o644); err != nil {
			t.Fatal(err)
		}
		private := harness.Root + "/images/private.tar"
		if err := os.WriteFile(private, data, 0o600); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name, user, image, want string
		}{
			{"missing file", "", "/nonexistent/image.tar", "/nonexistent/image.tar"},
			{"corrupt archive", "", corrupt, "corrupt.tar"},
			{"unreadable for the user", "microvmtest", private, "private.tar"},
			{"unknown registry reference", "", "docker://127.0.0.1:1/no/such:image", "127.0.0.1:1/no/such:image"},
		}
		for _, tt := range tests {
			e.Run(t, tt.name, func(t *testing.T) {
				_, errOut, code := e.Srun(t, tt.user, "--microvm="+tt.image, "true")
				if code == 0 || !strings.Contains(errOut, tt.want) {
					t.Fatalf("exit %d, stderr %q: want a failure naming %q", code, errOut, tt.want)
				}
				if strings.Contains(errOut, "queued and waiting") || strings.Contains(errOut, "job ") && strings.Contains(errOut, "has been allocated") {
					t.Errorf("the job was queued before the error: %q", errOut)
				}
			})
		}
	})

	e.Run(t, "scancel reaches the workload and nothing is left", func(t *testing.T) {
		scancelTrapped(t, e, img)
	})

	e.Run(t, "scancel of the step leaves nothing", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		run, job := startSrun(t, e, ctx, img, "sh", "-c", trapLoop("TERM"))
		if err := e.C.Scancel(ctx, strconv.Itoa(job)+".0"); err != nil {
			t.Fatal(err)
		}
		run.wait(t, ctx)
		e.WaitClean(t, job)
	})

	e.Run(t, "srun's Ctrl-C signal runs the workload's trap; double Ctrl-C ends the step and nothing is left", func(t *testing.T) {
		// srun's double Ctrl-C forwards SIGINT and at once SIGKILL
		// (srun job_force_termination), on a bare node as in a VM:
		// measured on the bare test node, a shell waiting for `sleep`
		// never ran its INT trap before the SIGKILL, and a busy shell
		// did only because its trap needs no round trip. In a microVM
		// the SIGINT crosses the exec process, the supervisor and the
		// agent, so it cannot beat a SIGKILL sent a millisecond later.
		// What the VM must keep is that the Ctrl-C signal reaches the
		// workload's trap: `scancel --signal=INT` of the step sends the
		// same SIGINT to the task with no SIGKILL behind it, and the
		// trap records itself in a writable share (srun stops relaying
		// output at the second Ctrl-C). Then the double Ctrl-C must end
		// the step with nothing left.
		out := harness.DataDir + "/rw/ctrl-c"
		if err := os.MkdirAll(out, 0o777); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(harness.DataDir) })
		_ = os.Chmod(harness.DataDir, 0o755)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		workload := "echo JOB=$SLURM_JOB_ID; trap 'echo TRAPPED-INT >>/out/trap' INT; echo up >/out/ready; echo READY; while :; do sleep 0.2; done"
		run, job := startSrun(t, e, ctx, img, "--microvm-mounts="+out+":/out:rw", "sh", "-c", workload)
		if _, err := os.Stat(out + "/ready"); err != nil {
			t.Fatalf("the workload cannot write to its share: %v", err)
		}
		if _, _, code, err := e.C.Run(ctx, "", "scancel", "--signal=INT", strconv.Itoa(job)+".0"); err != nil || code != 0 {
			t.Fatalf("scancel --signal=INT: exit %d, %v", code, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		var b []byte
		for time.Now().Before(deadline) {
			if b, _ = os.ReadFile(out + "/trap"); string(b) == "TRAPPED-INT\n" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if string(b) != "TRAPPED-INT\n" {
			t.Errorf("the workload's INT trap did not run once (its record: %q; stdout %q)", b, run.stdout())
		}
		// Two SIGINTs within a second: srun sends Ctrl-C, then SIGKILL.
		_ = run.cmd.Process.Signal(syscall.SIGINT)
		time.Sleep(200 * time.Millisecond)
		_ = run.cmd.Process.Signal(syscall.SIGINT)
		run.wait(t, ctx)
		e.WaitClean(t, job)
	})

	e.Run(t, "a forged SLURM_STEP_GPUS gets no GPU", func(t *testing.T) {
		// The user sets SLURM_STEP_GPUS in the environment srun passes
		// to the step, naming GPU 1, which Slurm did not allocate: alone
		// (no --gres) and beside a one-GPU allocation (Slurm gives GPU
		// 0). The step may be refused ("not allocated to this step") or
		// run without any GPU, but GPU 1 is never planned for
		// passthrough: no VFIO device on QEMU's command line, no GPU
		// plan in the step's state, no error of the planner about it.
		const forged = "/dev/fakegpu1"
		for _, tc := range []struct {
			name string
			args []string
		}{
			{"without --gres", nil},
			{"beside --gres=gpu:fake:1", []string{"--gres=gpu:fake:1"}},
		} {
			e.Run(t, tc.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
				defer cancel()
				args := append(append([]string{}, tc.args...), img, "sh", "-c",
					"echo JOB=$SLURM_JOB_ID; echo CVD=$CUDA_VISIBLE_DEVICES; echo READY; sleep 3")
				cmd, err := e.C.Command(ctx, "", "srun", args...)
				if err != nil {
					t.Fatal(err)
				}
				cmd.Env = append(cmd.Env, "SLURM_STEP_GPUS=1")
				var so, se bytes.Buffer
				cmd.Stdout, cmd.Stderr = &so, &se
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				var passthrough []string
				done := make(chan error, 1)
				go func() { done <- cmd.Wait() }()
				for waiting := true; waiting; {
					select {
					case <-done:
						waiting = false
					case <-time.After(100 * time.Millisecond):
						passthrough = append(passthrough, gpuEvidence()...)
					}
				}
				if len(passthrough) > 0 {
					t.Errorf("GPU passthrough was set up for a forged SLURM_STEP_GPUS:\n  %s", strings.Join(passthrough, "\n  "))
				}
				stderr := se.String()
				refused := strings.Contains(stderr, "not allocated to this step")
				if strings.Contains(stderr, forged) && !refused {
					t.Errorf("stderr %q: the forged GPU %s was planned (an error about it other than the refusal)", stderr, forged)
				}
				if !refused && strings.Contains(so.String(), "CVD=") && !strings.Contains(so.String(), "CVD=\n") {
					t.Errorf("stdout %q: the guest was given GPUs", so.String())
				}
				t.Logf("stdout %q, stderr %q", so.String(), stderr)
			})
		}
	})

	e.Run(t, "time limit ends the step and nothing is left", func(t *testing.T) {
		if testing.Short() {
			prereq.OptIn(t, "-short: waits for a one-minute time limit")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		run, job := startSrun(t, e, ctx, "--time=1", img, "sh", "-c", trapLoop("TERM"))
		run.wait(t, ctx)
		if !strings.Contains(run.stdout(), "TRAPPED-TERM") {
			t.Errorf("stdout %q: the time limit's TERM did not reach the workload", run.stdout())
		}
		e.WaitClean(t, job)
	})

	e.Run(t, "sbatch runs steps in VMs, not the batch script", func(t *testing.T) {
		dir := t.TempDir()
		_ = os.Chmod(dir, 0o755)
		outFile := dir + "/out"
		script := fmt.Sprintf("#!/bin/sh\n#SBATCH --microvm=%s\n#SBATCH --output=%s\necho BATCH $(cat /proc/sys/kernel/random/boot_id)\nsrun sh -c 'echo STEP $(cat /proc/sys/kernel/random/boot_id) $(cat /etc/os-release | head -1)'\nsrun sh -c 'echo STEP $(cat /proc/sys/kernel/random/boot_id)'\n", e.Image, outFile)
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		job, err := e.C.Sbatch(ctx, "", script)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.C.WaitJob(ctx, job); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(outFile)
		out := string(b)
		var batch string
		steps := map[string]bool{}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "BATCH" {
				batch = f[1]
			}
			if len(f) >= 2 && f[0] == "STEP" {
				steps[f[1]] = true
			}
		}
		if batch != e.HostBoot {
			t.Errorf("batch script boot id %q, want the host's %q (the batch step is not wrapped)\n%s", batch, e.HostBoot, out)
		}
		if len(steps) != 2 || steps[e.HostBoot] {
			t.Errorf("step boot ids %v: want two distinct guest boots\n%s", steps, out)
		}
		e.WaitClean(t, job)
	})

	e.Run(t, "GPU step on a host without VFIO fails cleanly before booting", func(t *testing.T) {
		out, errOut, code := e.Srun(t, "", "--gres=gpu:fake:2", img, "sh", "-c", "echo SHOULD-NOT-RUN")
		if code == 0 || strings.Contains(out, "SHOULD-NOT-RUN") {
			t.Fatalf("exit %d, stdout %q: the step must fail", code, out)
		}
		if !strings.Contains(errOut, "/dev/fakegpu") {
			t.Fatalf("stderr %q: want one line naming the device", errOut)
		}
		if strings.Contains(errOut, "qemu") || strings.Contains(errOut, "console") {
			t.Errorf("stderr %q: no VM may boot", errOut)
		}
		t.Logf("srun stderr: %s", errOut)
		// No job id is printed (the workload never ran): the step's
		// state must be gone all the same (e.Run's NothingLeft).
		// SLURM_STEP_GPUS set by the user, without --gres: refused as
		// not allocated (the step's devices cgroup is the record).
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd, err := e.C.Command(ctx, "", "srun", img, "echo", "SHOULD-NOT-RUN")
		if err != nil {
			t.Fatal(err)
		}
		cmd.Env = append(cmd.Env, "SLURM_STEP_GPUS=0")
		var so, se bytes.Buffer
		cmd.Stdout, cmd.Stderr = &so, &se
		// Slurm may drop the variable for a step without GPUs (it does
		// on this cluster, whose node has GRES); then the step runs
		// without any GPU. What must never happen is a GPU plan from it.
		err = cmd.Run()
		refused := strings.Contains(se.String(), "not allocated to this step")
		ranPlain := err == nil && strings.Contains(so.String(), "SHOULD-NOT-RUN") && !strings.Contains(se.String(), "GPU")
		if !refused && !ranPlain {
			t.Errorf("SLURM_STEP_GPUS=0 without --gres: err %v, stdout %q, stderr %q: want a refusal or a plain CPU step", err, so.String(), se.String())
		}
		// A step without GPUs on the same node is unaffected.
		if out, _, code := e.Srun(t, "", img, "echo", "fine"); code != 0 || out != "fine\n" {
			t.Errorf("plain step after the GPU failure: exit %d, %q", code, out)
		}
	})

	e.Run(t, "GPU driver", func(t *testing.T) { gpuDriverTests(t, e) })

	e.Run(t, "mounts", func(t *testing.T) { mountTests(t, e) })

	e.Run(t, "MPI", func(t *testing.T) { mpiTests(t, e) })

	e.Run(t, "environment fallbacks", func(t *testing.T) { envFallbackTests(t, e) })

	e.Run(t, "see what runs", func(t *testing.T) { opsTests(t, e) })

	e.Run(t, "run without Slurm", func(t *testing.T) {
		cmd := exec.Command(e.Launcher, "--config", e.Config, "run", "--image", e.Image, "--", "sh", "-c", "cat /etc/os-release; exit 3")
		out, _ := cmd.Output()
		if cmd.ProcessState.ExitCode() != 3 || !strings.Contains(string(out), e.ImageName) {
			t.Fatalf("exit %d, stdout %q", cmd.ProcessState.ExitCode(), out)
		}
	})
}

// started is a srun running in the background whose stdout is watched.
type started struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	done chan error
}

func (s *started) stdout() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// startSrun runs srun args in the background and waits until its stdout
// shows "READY", returning the job id the workload printed (JOB=<id>).
func startSrun(t *testing.T, e *harness.Env, ctx context.Context, args ...string) (*started, int) {
	t.Helper()
	cmd, err := e.C.Command(ctx, "", "srun", args...)
	if err != nil {
		t.Fatal(err)
	}
	return startUntilReady(t, ctx, cmd, os.Stderr)
}

// startUntilReady starts cmd and returns once its stdout shows READY, with
// the job id it printed as JOB=N; stderr nil sends its stderr to the same
// record as stdout.
func startUntilReady(t *testing.T, ctx context.Context, cmd *exec.Cmd, stderr io.Writer) (*started, int) {
	t.Helper()
	s := &started{cmd: cmd, done: make(chan error, 1)}
	pr, pw, _ := os.Pipe()
	cmd.Stdout, cmd.Stderr = pw, stderr
	if stderr == nil {
		cmd.Stderr = pw
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	ready := make(chan int, 1)
	go func() {
		buf := make([]byte, 4096)
		sent := false
		for {
			n, err := pr.Read(buf)
			s.mu.Lock()
			s.out.Write(buf[:n])
			text := s.out.String()
			s.mu.Unlock()
			if !sent && strings.Contains(text, "READY") {
				ready <- jobOfNoFail(text)
				sent = true
			}
			if err != nil {
				s.done <- cmd.Wait()
				return
			}
		}
	}()
	select {
	case job := <-ready:
		return s, job
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		t.Fatalf("workload never started: %q", s.stdout())
	}
	return nil, 0
}

// wait waits for srun to end.
func (s *started) wait(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-s.done:
	case <-ctx.Done():
		_ = s.cmd.Process.Kill()
		t.Fatalf("srun did not end; stdout %q", s.stdout())
	}
}

// trapLoop is a workload that prints its job id and READY, runs until a
// signal, and prints TRAPPED-<SIG> from its trap.
// scancelTrapped cancels the job of a step whose workload traps TERM: the
// trap must run and nothing of the job be left. It returns the job.
func scancelTrapped(t *testing.T, e *harness.Env, img string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	run, job := startSrun(t, e, ctx, img, "sh", "-c", trapLoop("TERM"))
	if err := e.C.Scancel(ctx, strconv.Itoa(job)); err != nil {
		t.Fatal(err)
	}
	run.wait(t, ctx)
	if !strings.Contains(run.stdout(), "TRAPPED-TERM") {
		t.Errorf("stdout %q: the workload's TERM trap did not run", run.stdout())
	}
	e.WaitClean(t, job)
	return job
}

func trapLoop(sig string) string {
	return "echo JOB=$SLURM_JOB_ID; trap 'echo TRAPPED-" + sig + "; exit 0' " + sig + "; echo READY; while :; do sleep 0.2; done"
}

// gpuEvidence lists signs of GPU passthrough on this host now: a GPU plan
// in a step's state, a VFIO device on a QEMU command line.
func gpuEvidence() []string {
	var out []string
	plans, _ := filepath.Glob(harness.RuntimeDir + "/*/gpu*.json")
	for _, p := range plans {
		b, _ := os.ReadFile(p)
		out = append(out, "GPU plan "+p+": "+string(b))
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if cmd := strings.ReplaceAll(string(b), "\x00", " "); strings.Contains(cmd, "qemu-system") && strings.Contains(cmd, "vfio-pci") {
			out = append(out, "QEMU with VFIO: "+cmd)
		}
	}
	return out
}

func jobOfNoFail(out string) int {
	m := jobLine.FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
