package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// RemoveJobDirs removes the empty cgroup directories of job that Slurm
// left under root (normally /sys/fs/cgroup): ".../job_<job>" and its
// step_* children, in every v1 hierarchy and on the unified one, at most
// six levels down, in Slurm's layout only (cgroup.conf(5):
// [hierarchy/]<prefix>/uid_<uid>/job_<id> on v1,
// .../slurmstepd.scope/job_<id> on v2). A slurmstepd that is killed never removes its job's
// directories, and Slurm does not come back to them. Only directories
// without processes go: rmdir(2) refuses a cgroup that has tasks or
// children (EBUSY), and such a directory is left alone, not an error. It
// returns the directories removed.
//
// Design decision: the job's epilog (`gc --job`) removes them, not the
// supervisor: the supervisor may itself be what was killed, and the
// epilog runs once every process of the job on the node is gone.
func RemoveJobDirs(root string, job uint32) ([]string, error) {
	removed, _, err := removeJobDirs(root, job)
	return removed, err
}

// RemoveJobDirsWait is RemoveJobDirs again every 100 ms until none of the
// job's directories is left or wait has passed (or ctx ended), and returns
// every directory removed and those still left. The epilog's gc calls it
// right after it stopped the job's sandboxes: the step's task processes a
// killed slurmstepd left end a moment after their supervisor, and until
// then their step directory is busy (a single pass left the job's
// directories behind for good).
func RemoveJobDirsWait(ctx context.Context, root string, job uint32, wait time.Duration) (removed, left []string, err error) {
	deadline := time.Now().Add(wait)
	for {
		r, l, err := removeJobDirs(root, job)
		removed = append(removed, r...)
		if err != nil || len(l) == 0 || time.Now().After(deadline) {
			return removed, l, err
		}
		select {
		case <-ctx.Done():
			return removed, l, nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func removeJobDirs(root string, job uint32) (removed, left []string, err error) {
	name := "job_" + strconv.FormatUint(uint64(job), 10)
	var dirs []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return nil
		}
		if !d.IsDir() {
			return nil
		}
		// Slurm's layout only (cgroup.conf(5)): .../uid_<uid>/job_<id>
		// on v1, .../slurmstepd.scope/job_<id> on v2; a job_<id> elsewhere
		// (a user's delegated subtree) is not Slurm's.
		if d.Name() == name && (strings.HasPrefix(filepath.Base(filepath.Dir(p)), "uid_") || filepath.Base(filepath.Dir(p)) == "slurmstepd.scope") {
			_ = filepath.WalkDir(p, func(q string, e fs.DirEntry, err error) error {
				if err == nil && e.IsDir() {
					dirs = append(dirs, q)
				}
				return nil
			})
			return filepath.SkipDir
		}
		if strings.Count(strings.TrimPrefix(p, root), "/") >= 6 {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("find cgroup directories of job %d under %s: %w", job, root, err)
	}
	// Deepest first: a step directory before its job directory.
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	for _, d := range dirs {
		if err := os.Remove(d); err == nil {
			removed = append(removed, d)
		} else if !errors.Is(err, fs.ErrNotExist) {
			left = append(left, d)
		}
	}
	return removed, left, nil
}
