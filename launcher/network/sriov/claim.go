package sriov

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/flock"
	"github.com/slurm-microvm/slurm-microvm/launcher/pci"
)

// Claim is the node-local record that a step has a VF: the file
// <claim dir>/<VF address>.json. It holds what releasing the VF needs, so
// gc can give back a VF whose step left no state behind.
type Claim struct {
	// VF is the VF's PCI address, PF its physical function's.
	VF string `json:"vf"`
	PF string `json:"pf"`
	// Owner is the claiming step ("<node>/<job>.<step>.<restart>"); only
	// the owner's Release removes the claim.
	Owner string `json:"owner"`
	// StateDir is the owner's state directory: gc's default test for a
	// claim left behind is that it no longer exists.
	StateDir string `json:"state_dir"`
	// Driver is the VF's driver when claimed; Rebind says the step moves
	// it to vfio-pci and back to Driver at release.
	Driver string `json:"driver"`
	Rebind bool   `json:"rebind,omitempty"`
	// VFIOGroupFile is the VF's /dev/vfio/<group>.
	VFIOGroupFile string `json:"vfio_group_file"`
	// PID is the process that claimed; Time when (informational).
	PID  int       `json:"pid"`
	Time time.Time `json:"time"`
}

// lockFile guards the claim directory: taking a VF (scan, check, create
// the claim) and removing claims happen under it, so two steps starting
// together never take the same VF.
const lockFile = ".lock"

func claimPath(dir, vf string) string { return filepath.Join(dir, vf+".json") }

// lockClaims takes the claim directory's lock (creating the directory
// 0700), waiting until ctx ends.
func lockClaims(ctx context.Context, dir string) (func(), error) {
	if dir == "" || !filepath.IsAbs(dir) {
		return nil, &DeviceError{Rule: ErrClaim, Detail: fmt.Sprintf("claim directory %q is not an absolute path", dir)}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, &DeviceError{Rule: ErrClaim, Detail: "create the claim directory", Err: err}
	}
	release, err := flock.Exclusive(ctx, filepath.Join(dir, lockFile), "another step claiming or releasing a VF")
	if err != nil {
		return nil, &DeviceError{Rule: ErrClaim, Err: err}
	}
	return release, nil
}

// ReadClaims lists the claims in dir by VF address; a missing directory
// has none. Files that do not parse are errors (ErrClaim): a VF whose
// claim cannot be read is never handed out.
func ReadClaims(dir string) (map[string]Claim, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]Claim{}, nil
	}
	if err != nil {
		return nil, &DeviceError{Rule: ErrClaim, Detail: "read the claim directory", Err: err}
	}
	out := map[string]Claim{}
	var errs []error
	for _, e := range ents {
		vf, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !pci.ValidBDF(vf) {
			continue
		}
		c, err := readClaim(dir, vf)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[vf] = c
	}
	return out, joinErrors("", errs)
}

func readClaim(dir, vf string) (Claim, error) {
	var c Claim
	b, err := os.ReadFile(claimPath(dir, vf))
	if err != nil {
		return c, &DeviceError{VF: vf, Rule: ErrClaim, Detail: "read " + claimPath(dir, vf), Err: err}
	}
	if err := json.Unmarshal(b, &c); err != nil || c.VF != vf {
		return c, &DeviceError{VF: vf, Rule: ErrClaim, Detail: fmt.Sprintf("%s is not a claim of %s (remove it once no VM uses the VF)", claimPath(dir, vf), vf), Err: err}
	}
	return c, nil
}

// writeClaim creates the claim file (it must not exist), synced, 0600.
// Called under the lock.
func writeClaim(dir string, c Claim) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	p := claimPath(dir, c.VF)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return &DeviceError{VF: c.VF, PF: c.PF, Rule: ErrClaim, Detail: "create " + p, Err: err}
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(p)
		return &DeviceError{VF: c.VF, PF: c.PF, Rule: ErrClaim, Detail: "write " + p, Err: err}
	}
	return nil
}

// removeClaim removes vf's claim if owner holds it; a missing claim is
// fine (idempotent), another owner's is left alone. Called under the lock.
func removeClaim(dir, vf, owner string) error {
	c, err := readClaim(dir, vf)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if c.Owner != owner {
		return nil
	}
	if err := os.Remove(claimPath(dir, vf)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return &DeviceError{VF: vf, Rule: ErrClaim, Detail: "remove " + claimPath(dir, vf), Err: err}
	}
	return nil
}

// StateDirGone is GC's default test of a claim left behind: its owner's
// state directory no longer exists.
func StateDirGone(c Claim) bool {
	if c.StateDir == "" {
		return false
	}
	_, err := os.Stat(c.StateDir)
	return errors.Is(err, fs.ErrNotExist)
}

// GC gives back every VF whose claim in dir is left behind (stale(c);
// nil = StateDirGone): it waits for the VF's VFIO group to be closed,
// moves a rebound VF back to its recorded driver and removes the claim.
// It returns the VFs freed. A VF that cannot be given back keeps its
// claim (ErrRelease) so it is not handed out, and the next gc retries.
func GC(ctx context.Context, dir string, r Roots, stale func(Claim) bool) ([]string, error) {
	return gc(ctx, dir, r, stale, nil)
}

func gc(ctx context.Context, dir string, r Roots, stale func(Claim) bool, w pci.Writer) ([]string, error) {
	if stale == nil {
		stale = StateDirGone
	}
	claims, err := ReadClaims(dir)
	if err != nil && len(claims) == 0 {
		return nil, err
	}
	var freed []string
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	vfs := make([]string, 0, len(claims))
	for vf := range claims {
		vfs = append(vfs, vf)
	}
	sort.Strings(vfs)
	for _, vf := range vfs {
		c := claims[vf]
		if !stale(c) {
			continue
		}
		p := &Plan{Roots: r, ClaimDir: dir, Owner: c.Owner, PF: c.PF,
			VF: VF{BDF: c.VF, VFIOGroupFile: c.VFIOGroupFile, Driver: c.Driver}, Rebind: c.Rebind, write: w}
		if err := p.Release(ctx); err != nil {
			errs = append(errs, err)
			continue
		}
		freed = append(freed, vf)
	}
	return freed, joinErrors("gc VF claims", errs)
}
