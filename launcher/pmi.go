package launcher

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/mpi/pmi"
)

// guestPMIFD is the descriptor number a rank gets for PMI-2 in the guest.
const guestPMIFD = 3

// withPMI carries the task's PMI into the guest (facts in mpi/pmi):
//
//   - PMI-2 (srun --mpi=pmi2): the task inherited PMI_FD from slurmstepd;
//     the rank gets the other end of a relay as fd 3, and PMI_FD=3.
//   - PMIx (srun --mpi=pmix): the server listens on the host's loopback;
//     the agent listens on the guest's, every PMIX_SERVER_URI* names the
//     guest listener (the agent substitutes its actual port for the host
//     address), and each connection is relayed to the host server by this
//     process, which runs as the job's user like the rank would.
//
// A task without PMI is left alone; a PMI environment that cannot be
// relayed is an error, so ranks never start as N singletons.
func withPMI(spec driver.ProcessSpec) (driver.ProcessSpec, error) {
	info, err := pmi.Detect(spec.Env)
	if err != nil {
		return spec, fmt.Errorf("PMI: %w", err)
	}
	switch info.Kind {
	case pmi.KindPMI2:
		env, err := pmi.RewritePMI2(spec.Env, guestPMIFD)
		if err != nil {
			return spec, fmt.Errorf("PMI-2: %w", err)
		}
		f := os.NewFile(uintptr(info.FD), "PMI_FD")
		if f == nil {
			return spec, fmt.Errorf("PMI-2: PMI_FD=%d is not open in this task", info.FD)
		}
		if _, err := f.Stat(); err != nil {
			return spec, fmt.Errorf("PMI-2: PMI_FD=%d is not open in this task: %w", info.FD, err)
		}
		spec.Env = env
		spec.FDs = append(spec.FDs, driver.FDForward{GuestFD: guestPMIFD, Host: f})
	case pmi.KindPMIx:
		// The URIs keep the host address; the agent replaces it by the
		// guest listener's.
		env, err := pmi.RewritePMIx(spec.Env, pmi.PMIxGuest{URI: info.Network + "://" + info.Address, TmpDir: "/tmp"})
		if err != nil {
			return spec, fmt.Errorf("PMIx: %w", err)
		}
		network, addr := info.Network, info.Address
		listen := "127.0.0.1:0"
		if network == "tcp6" {
			listen = "[::1]:0"
		}
		spec.Env = env
		spec.Listeners = append(spec.Listeners, driver.ListenerForward{
			Listen: listen, Replace: addr,
			Dial: func(ctx context.Context) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			},
		})
	}
	return spec, nil
}
