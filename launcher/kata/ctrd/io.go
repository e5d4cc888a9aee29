package ctrd

import (
	"fmt"

	"github.com/containerd/containerd/v2/pkg/cio"

	"github.com/slurm-microvm/slurm-microvm/launcher/kata/taskapi"
)

// fifoIO is a cio.IO over FIFOs the caller made and holds: it hands their
// paths to containerd (the shim opens them by name) and owns nothing, so
// Cancel, Wait and Close have nothing to do. The client's own FIFO sets
// (cio.NewCreator) would create FIFOs in a directory of their own and
// copy them to Go streams in this process; the caller already holds its
// ends (the exec path relays them), so a second copy would only add a hop.
type fifoIO struct{ cfg cio.Config }

func (f fifoIO) Config() cio.Config { return f.cfg }
func (fifoIO) Cancel()              {}
func (fifoIO) Wait()                {}
func (fifoIO) Close() error         { return nil }

// checkIO refuses a stdio set that containerd's runc shim cannot open:
// without a terminal, it opens Stdout and Stderr both, as FIFOs or files,
// once either is set (containerd 1.6-2.x pkg/process/io.go copyPipes), and
// fails on "" with `opening file "" failed`. Kata's shim would take it;
// the rule holds for every runtime so that the runc shim stands in for
// Kata's in the tests. Stdin may be "" (the process gets no stdin).
func checkIO(io taskapi.IO) error {
	if !io.Terminal && (io.Stdout == "") != (io.Stderr == "") {
		return fmt.Errorf("stdio: stdout %q and stderr %q: without a terminal give both FIFOs or neither (containerd's runc shim opens both)", io.Stdout, io.Stderr)
	}
	if io.Terminal && io.Stderr != "" {
		return fmt.Errorf("stdio: stderr %q with a terminal: the terminal carries stderr on stdout, leave stderr empty", io.Stderr)
	}
	return nil
}

// fifoCreator is the cio.Creator for a process whose stdio is io.
func fifoCreator(io taskapi.IO) cio.Creator {
	return func(string) (cio.IO, error) {
		return fifoIO{cio.Config{
			Terminal: io.Terminal,
			Stdin:    io.Stdin,
			Stdout:   io.Stdout,
			Stderr:   io.Stderr,
		}}, nil
	}
}
