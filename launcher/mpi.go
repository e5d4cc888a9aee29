package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/mpi"
	"github.com/slurm-microvm/slurm-microvm/mpi/pmi"
)

// Files of the MPI injection in the step's state directory.
const (
	mpiPlanFile = "mpi.json" // the injection plan (mpi.Plan), read by exec
	mpiNoteFile = "mpi-note" // why the image's own MPI runs (auto mode)
	mpiDir      = "mpi"      // the plan's files, shared read-only
)

// MPIModes are the values of --microvm-mpi.
var MPIModes = []string{"auto", "host", "image", "off"}

// mpiMode is the step's --microvm-mpi, or the node's default.
func (l *Launcher) mpiMode(s *Spec) string {
	if s.MPI != "" {
		return s.MPI
	}
	return l.Config.MPI.Default
}

// planMPI decides whether the host's MPI stack replaces the image's
// (--microvm-mpi): in auto and host mode it runs `mpi check` on the image
// disk against this host; when it passes, the plan's files are copied into
// the step's state and returned as a read-only share, and the plan is
// recorded for the tasks (their environment). auto falls back to the
// image's MPI, leaving the reason for local task 0 to print; host fails.
// An image without MPI is not an MPI step: nothing to say.
func (l *Launcher) planMPI(ctx context.Context, s *Spec, d state.Dir, disk string, log *slog.Logger) (*driver.Share, error) {
	mode := l.mpiMode(s)
	if mode != "auto" && mode != "host" {
		return nil, nil
	}
	if mode == "auto" && os.Geteuid() != 0 {
		// Auto injects only under Slurm, where the supervisor is root and
		// the cache's disks are readable: a plain `run` keeps the
		// image's MPI unless asked.
		return nil, nil
	}
	// The disk is read in this process, never mounted (a mount would
	// let every local user into the image while it lasts). A compressed
	// disk is extracted into the step's state directory, which stop and
	// gc remove even when this supervisor dies mid-check.
	img, err := mpi.OpenDisk(ctx, disk, mpi.DiskOptions{WorkDir: d.Path()})
	if err != nil {
		return nil, fmt.Errorf("--microvm-mpi=%s: read the image: %w", mode, err)
	}
	defer img.Close()
	// Most images carry no MPI: look at the image alone first and skip
	// the host's discovery (a scan of every host library, ~50 ms).
	if mode == "auto" {
		if st, err := mpi.Discover(ctx, img); err == nil && len(st.MPI) == 0 {
			return nil, nil
		}
	}
	host, err := mpi.OpenRoot("/")
	if err != nil {
		return nil, fmt.Errorf("--microvm-mpi=%s: %w", mode, err)
	}
	defer host.Close()
	rep, err := mpi.CheckRoots(ctx, host, img, mpi.CheckOptions{Mode: mpi.Mode(l.Config.MPI.Version), Logger: log})
	if err != nil {
		return nil, fmt.Errorf("--microvm-mpi=%s: %w", mode, err)
	}
	if !rep.Safe || rep.Plan == nil {
		cerr := rep.Err()
		if cerr == nil {
			cerr = errors.New("no injection plan")
		}
		if mode == "host" {
			return nil, fmt.Errorf("--microvm-mpi=host: %w (run `slurm-microvm mpi check --image %s` for every rule)", cerr, s.Image)
		}
		if !errors.Is(cerr, mpi.ErrNoImageMPI) {
			note := "slurm-microvm: --microvm-mpi=auto: the image's own MPI runs: " + cerr.Error()
			_ = state.WriteFileAtomic(d.File(mpiNoteFile), []byte(note+"\n"), 0o644)
		}
		log.Info("MPI not injected", "mode", mode, "reason", cerr)
		return nil, nil
	}
	dir := d.File(mpiDir)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	if err := rep.Plan.Materialize(ctx, dir); err != nil {
		return nil, fmt.Errorf("--microvm-mpi=%s: %w", mode, err)
	}
	b, err := json.Marshal(rep.Plan)
	if err != nil {
		return nil, err
	}
	if err := state.WriteFileAtomic(d.File(mpiPlanFile), b, 0o644); err != nil {
		return nil, err
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	log.Info("host MPI injected", "mpi", rep.Plan.MPI.Path, "files", len(rep.Plan.Files), "guest", rep.Plan.GuestDir)
	return &driver.Share{Dir: f, Destination: rep.Plan.GuestDir, ReadOnly: true}, nil
}

// taskMPI applies the step's MPI decision to a task's environment: the
// injection plan's variables (LD_LIBRARY_PATH first, component paths), and
// with an explicit MPI mode, PMI must reach a multi-task step. It returns
// the note to print (auto mode's fallback reason) for local task 0.
func taskMPI(stateDir string, s *Spec, env []string) ([]string, string, error) {
	if s.MPI == "host" || s.MPI == "image" {
		if _, err := pmi.Require(pmi.StepTasks(env), env); err != nil {
			return nil, "", fmt.Errorf("--microvm-mpi=%s: %w", s.MPI, err)
		}
	}
	note := ""
	if b, err := os.ReadFile(stateDir + "/" + mpiNoteFile); err == nil {
		note = strings.TrimSpace(string(b))
	}
	b, err := os.ReadFile(stateDir + "/" + mpiPlanFile)
	if errors.Is(err, os.ErrNotExist) {
		return env, note, nil
	}
	if err != nil {
		return nil, "", err
	}
	var plan mpi.Plan
	if err := json.Unmarshal(b, &plan); err != nil {
		return nil, "", fmt.Errorf("read MPI plan: %w", err)
	}
	return plan.Environ(env), note, nil
}
