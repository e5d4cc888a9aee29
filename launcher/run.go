package launcher

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// Run boots a sandbox for s in this process, runs argv in it as a task
// would, and tears everything down before returning, whatever happened.
// It needs no Slurm: `slurm-microvm run`.
func (l *Launcher) Run(ctx context.Context, s *Spec, argv, env []string, stdio Stdio) (driver.ExitStatus, error) {
	// Signals that come during the boot wait for the process (see Exec).
	sigs := catchSignals()
	defer signal.Stop(sigs)
	d := s.Dir(l.Config)
	defer os.Remove(d.Root) // only when no other step uses it: nothing left behind
	if err := l.Prepare(ctx, s); err != nil {
		return driver.ExitStatus{}, err
	}
	defer os.RemoveAll(d.Path())
	defer l.Config.Mounts.RemoveScratch(s.ID.String())
	if s.Debug {
		// Runs before the removal above: show the guest console.
		defer func() {
			if b, err := os.ReadFile(d.File(state.ConsoleLog)); err == nil && stdio.Err != nil {
				fmt.Fprintf(stdio.Err, "--- guest console (%s) ---\n%s", s.ID, b)
			}
		}()
	}
	log := l.log().With("step", s.ID.String())
	sb, release, err := l.boot(ctx, s, d, log, newTimings(log))
	if err != nil {
		return driver.ExitStatus{}, err
	}
	defer release()
	defer sb.Stop(context.Background())
	if err := sb.Listen(); err != nil {
		return driver.ExitStatus{}, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = sb.Serve(sctx) }()
	c, err := l.attach(ctx, d.Path())
	if err != nil {
		return driver.ExitStatus{}, err
	}
	defer c.Close()
	return execIn(ctx, c, driver.ProcessSpec{Argv: argv, Env: TaskEnv(env), Cwd: s.Workdir}, stdio, sigs)
}
