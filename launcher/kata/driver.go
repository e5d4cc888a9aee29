package kata

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata/ctrd"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata/katacfg"
	"github.com/slurm-microvm/slurm-microvm/launcher/kata/shim"
)

// Options configure the driver ([kata] of microvm.toml).
type Options struct {
	// Mode is "shim" (start Shim per step) or "containerd" (through the
	// daemon at ContainerdAddress with RuntimeHandler).
	Mode string
	// Shim is the containerd-shim-kata-v2 binary (PATH lookup when
	// relative).
	Shim string
	// Configuration is Kata's configuration.toml ("" searches Kata's
	// order, katacfg.SearchPath); given to the shim as KATA_CONF_FILE.
	Configuration string
	// ContainerdAddress and RuntimeHandler are for mode "containerd".
	ContainerdAddress, RuntimeHandler string
	// Namespace is the containerd namespace of the sandboxes.
	Namespace string
	// Init is the static guest agent binary (qemu.agent of the config):
	// the sandbox container's init runs it in pause mode.
	Init string
	// StopGrace bounds how long the sandbox's processes get after
	// SIGTERM before SIGKILL when it stops.
	StopGrace time.Duration
}

// Driver is the Kata runtime driver.
type Driver struct {
	o   Options
	cfg *katacfg.Config
}

// New returns a Kata driver.
func New(o Options) *Driver {
	if o.StopGrace <= 0 {
		o.StopGrace = 5 * time.Second
	}
	return &Driver{o: o}
}

// Name is "kata".
func (d *Driver) Name() string { return "kata" }

// Capabilities: devices by Kata's VFIO cold-plug; no PMI forwards (doc.go);
// no share limit of ours (Kata's virtio-fs takes one device for all); no
// placement of ours (doc.go).
func (d *Driver) Capabilities() driver.Capabilities {
	return driver.Capabilities{Forwards: errNoPMI, Placement: noPlacement}
}

const noPlacement = "the kata runtime does not pin vCPUs to the step's CPUs or bind guest memory to its NUMA node (set enable_vcpus_pinning = true in Kata's configuration.toml); the sandbox runs within the step's cpuset"

const errNoPMI = "the kata runtime carries no PMI into the sandbox (the shim's task API carries stdio only): run MPI steps with runtime = \"qemu\" on these nodes, or srun --mpi=none"

// Prepare finds the shim (mode shim) and reads Kata's configuration.toml;
// the step-specific checks (sizing annotations, VFIO ports, /dev/shm) run
// in Start. Errors name the binary or the file.
func (d *Driver) Prepare(ctx context.Context, log *slog.Logger) error {
	if d.o.Mode == "shim" {
		if _, err := exec.LookPath(d.o.Shim); err != nil {
			return fmt.Errorf("kata.shim %q: %w (install Kata Containers' containerd-shim-kata-v2, or set kata.shim)", d.o.Shim, err)
		}
	}
	cfg, err := katacfg.Load(d.o.Configuration)
	if err != nil {
		return fmt.Errorf("kata configuration: %w", err)
	}
	d.cfg = cfg
	if log != nil {
		log.Info("kata configuration", "file", cfg.Path, "summary", cfg.Summary())
	}
	return nil
}

// File names the driver keeps in the state directory.
const (
	recordFile = "kata.json" // record: what Cleanup needs
	kataDir    = "kata"      // bundle, shim sockets, stdio FIFOs
)

// record is what Cleanup needs from another process.
type record struct {
	Mode string `json:"mode"`
	// Shim is the shim's record (mode shim).
	Shim *shim.Record `json:"shim,omitempty"`
	// Containerd is the daemon's container (mode containerd).
	Containerd *ctrdRecord `json:"containerd,omitempty"`
	// Mounts are host mount points to unmount, deepest first (mode
	// containerd; the shim's are in its own mount namespace).
	Mounts []string `json:"mounts,omitempty"`
}

// ctrdRecord names the container of mode containerd.
type ctrdRecord struct {
	Address   string `json:"address"`
	Namespace string `json:"namespace"`
	Runtime   string `json:"runtime"`
	ID        string `json:"id"`
}

func writeRecord(stateDir string, r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := filepath.Join(stateDir, recordFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("record the kata sandbox: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(stateDir, recordFile)); err != nil {
		return fmt.Errorf("record the kata sandbox: %w", err)
	}
	return nil
}

// Cleanup removes what a sandbox of stateDir left, from its record: the
// shim (killed, `delete`d, its sockets removed) or containerd's task and
// container, then the host mounts and the driver's directory. Idempotent.
func (d *Driver) Cleanup(ctx context.Context, stateDir string) error {
	b, err := os.ReadFile(filepath.Join(stateDir, recordFile))
	if errors.Is(err, os.ErrNotExist) {
		return removeTree(filepath.Join(stateDir, kataDir))
	}
	if err != nil {
		return fmt.Errorf("read the kata record: %w", err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("read the kata record %s: %w", filepath.Join(stateDir, recordFile), err)
	}
	var errs []error
	if r.Shim != nil {
		if err := shim.Cleanup(ctx, *r.Shim, nil); err != nil {
			errs = append(errs, err)
		}
	}
	if r.Containerd != nil {
		c := r.Containerd
		if err := ctrd.Cleanup(ctx, ctrd.Options{Address: c.Address, Namespace: c.Namespace, Runtime: c.Runtime, ID: c.ID}); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unmountAll(r.Mounts); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := removeTree(filepath.Join(stateDir, kataDir)); err != nil {
		return err
	}
	return os.Remove(filepath.Join(stateDir, recordFile))
}

// removeTree removes the driver's directory dir, after unmounting
// (detached) every mount found under it in this mount namespace, whether
// or not a record lists it: a share attached by a supervisor killed
// before it recorded it must go as a mount, never have its content
// deleted through it. A mount that stays is an error, and nothing is
// removed then.
func removeTree(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("read the mounts under %s: %w", dir, err)
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].Mountpoint) > len(mounts[j].Mountpoint) })
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s before removing %s: %w", m.Mountpoint, dir, err)
		}
	}
	if left, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir)); err != nil || len(left) > 0 {
		return fmt.Errorf("remove the kata bundle %s: %d mounts still under it (%v): not removed", dir, len(left), err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove the kata bundle: %w", err)
	}
	return nil
}

// sandboxID is the container id of the step id (<job>.<step>.<restart>.
// <node>): "smv-" and the step id where that is a containerd identifier
// (at most 76 letters and digits with single . _ - between them: a node
// name may be 64 bytes or end in '-'), else "smv-" and a digest of it.
// Unique per step and node, as the shim's and runc's state require.
func sandboxID(stepID string) string {
	id := "smv-" + stepID
	if len(id) <= 76 && containerdID.MatchString(id) {
		return id
	}
	sum := sha256.Sum256([]byte(stepID))
	return "smv-" + hex.EncodeToString(sum[:16])
}

var containerdID = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$`)

// identifier makes s a containerd identifier (letters, digits, ._-).
func identifier(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '-'
	}, s)
}
