package runtime

import (
	"errors"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
)

// newKata returns the Kata driver (launcher/kata).
func newKata(cfg *config.Config, o Options) (driver.Driver, error) {
	return nil, errors.New("runtime \"kata\": the Kata driver is not in this build yet")
}
