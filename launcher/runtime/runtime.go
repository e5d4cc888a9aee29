// Package runtime turns the configured runtime name (microvm.toml's
// runtime) into a driver.Driver: the one place that names concrete
// drivers, as Kata's NewHypervisor does for its hypervisors. The
// lifecycle (package launcher) and the exec path know only the driver
// interface; a test (TestLayering in this package) keeps package launcher
// from importing launcher/qemu or launcher/kata.
//
// Design decision: that rule is a Go test (go/parser over the package's
// files) rather than golangci-lint's depguard: the same rule, without
// building and running a second linter beside vet and staticcheck in every
// CI run on two cores.
package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// Names are the runtime drivers built in (config's runtime key).
var Names = []string{"qemu", "kata"}

// Options are what the caller adds to the configuration.
type Options struct {
	// Trampoline is the launcher binary: the QEMU driver starts its VMM
	// through it (qemu.Options.Trampoline); "" starts it directly.
	Trampoline string
}

// New returns the driver cfg names (cfg.Driver), set up from cfg.
// Errors: a name no driver has.
func New(cfg *config.Config, o Options) (driver.Driver, error) {
	return byName(cfg, cfg.Driver, o)
}

func byName(cfg *config.Config, name string, o Options) (driver.Driver, error) {
	switch name {
	case "qemu":
		accel := qemu.ResolveAccel(cfg.QEMU.Accel)
		return qemu.New(qemu.Options{
			Binary: cfg.QEMU.Binary, Accel: accel,
			RunAs:       *cfg.QEMU.RunAs,
			Seccomp:     *cfg.QEMU.Seccomp,
			HugePageMiB: hugePageMiB(cfg.QEMU.HugePages),
			BootTimeout: cfg.Timeouts.Boot.Duration,
			StopGrace:   cfg.Timeouts.StopGrace.Duration,
			Trampoline:  o.Trampoline,
			Assets: &assets.Options{
				KernelImage: cfg.QEMU.Kernel, Agent: cfg.QEMU.Agent,
				CacheDir:   filepath.Join(cfg.CacheDir, "assets"),
				CacheBytes: int64(cfg.Images.AssetsCacheMiB) << 20,
			},
		}), nil
	case "kata":
		return newKata(cfg, o)
	}
	return nil, fmt.Errorf("runtime %q is not a runtime driver (known: %s)", name, strings.Join(Names, ", "))
}

// File is the state directory's record of the driver that started the
// step's sandbox (one line: its name).
const File = "runtime"

// Record writes the driver's name into stateDir before it starts the
// sandbox, so that stop and gc clean up with that driver whatever the
// configuration says by then.
func Record(stateDir, name string) error {
	if err := state.WriteFileAtomic(filepath.Join(stateDir, File), []byte(name+"\n"), 0o644); err != nil {
		return fmt.Errorf("record the runtime driver: %w", err)
	}
	return nil
}

// ForState returns the driver that started the sandbox of stateDir (its
// Record); a state without one (the sandbox never started, or a step of
// an older version) gets the configured driver. Errors: a recorded name no
// driver has.
func ForState(cfg *config.Config, stateDir string) (driver.Driver, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, File))
	if errors.Is(err, os.ErrNotExist) {
		return New(cfg, Options{})
	}
	if err != nil {
		return nil, fmt.Errorf("read the runtime driver of %s: %w", stateDir, err)
	}
	return byName(cfg, strings.TrimSpace(string(b)), Options{})
}

// hugePageMiB is qemu.hugepages in MiB; Parse has refused any other value.
func hugePageMiB(size string) uint64 {
	mib, _ := config.HugePageMiB(size)
	return mib
}
