package cgroup

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestRemoveJobDirs: the job's empty directories go, deepest first; a
// non-empty one stays (on a real cgroupfs: one with tasks), other jobs'
// stay. In a plain directory tree, rmdir of a directory with a file
// stands in for a cgroup with tasks.
func TestRemoveJobDirs(t *testing.T) {
	root := t.TempDir()
	mk := func(p string) string {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gone := []string{
		mk("cpuset/slurm_n1/uid_1001/job_5/step_0"),
		mk("memory/slurm_n1/uid_1001/job_5/step_batch"),
	}
	gone = append(gone, filepath.Dir(gone[0]), filepath.Dir(gone[1]))
	busy := mk("freezer/slurm_n1/uid_1001/job_5/step_extern")
	if err := os.WriteFile(filepath.Join(busy, "tasks"), []byte("42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := mk("cpuset/slurm_n1/uid_1001/job_50")
	delegated := mk("user.slice/user-1001.slice/user@1001.service/job_5")
	v2 := mk("system.slice/slurmstepd.scope/job_5/step_0/user/task_0")
	gone = append(gone, v2, filepath.Dir(v2), filepath.Dir(filepath.Dir(v2)), filepath.Dir(filepath.Dir(filepath.Dir(v2))))

	removed, err := RemoveJobDirs(root, 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range gone {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s is still there", d)
		}
		if !slices.Contains(removed, d) {
			t.Errorf("%s not in the removed list %v", d, removed)
		}
	}
	for _, d := range []string{busy, filepath.Dir(busy), other, delegated} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
	if r, err := RemoveJobDirs(filepath.Join(root, "absent"), 5); err != nil || r != nil {
		t.Errorf("absent root: %v, %v", r, err)
	}
}

// TestRemoveJobDirsWait: a step directory that is busy for a moment (the
// tasks of a killed slurmstepd end just after their supervisor) is
// removed once it is free, with its job directory; one still busy when
// the wait ends is reported left.
func TestRemoveJobDirsWait(t *testing.T) {
	root := t.TempDir()
	step := filepath.Join(root, "freezer/slurm_n1/uid_1001/job_7/step_0")
	if err := os.MkdirAll(step, 0o755); err != nil {
		t.Fatal(err)
	}
	// A file keeps the directory from rmdir(2), as tasks keep a cgroup.
	busy := filepath.Join(step, "tasks")
	if err := os.WriteFile(busy, []byte("42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		os.Remove(busy)
	}()
	removed, left, err := RemoveJobDirsWait(context.Background(), root, 7, 5*time.Second)
	if err != nil || len(left) > 0 {
		t.Fatalf("left %v, err %v", left, err)
	}
	if !slices.Contains(removed, step) || !slices.Contains(removed, filepath.Dir(step)) {
		t.Errorf("removed %v, want the step and the job directory", removed)
	}
	stuck := filepath.Join(root, "memory/slurm_n1/uid_1001/job_8/step_0")
	if err := os.MkdirAll(stuck, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stuck, "tasks"), []byte("42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, left, err = RemoveJobDirsWait(context.Background(), root, 8, 300*time.Millisecond)
	if err != nil || !slices.Contains(left, stuck) || !slices.Contains(left, filepath.Dir(stuck)) {
		t.Errorf("left %v, err %v: want the busy step and its job directory", left, err)
	}
}
