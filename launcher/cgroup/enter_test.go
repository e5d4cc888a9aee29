package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/cgroups/v3/cgroup1"
)

// fakeNode is a cgroup tree under t.TempDir(): dirs made, /proc/<pid>/cgroup
// written with procLines.
func fakeNode(t testing.TB, pid string, procLines []string, dirs ...string) (Roots, string) {
	t.Helper()
	root := t.TempDir()
	mount := filepath.Join(root, "cgroup")
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(mount, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	proc := filepath.Join(root, "proc")
	if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(strings.Join(procLines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return Roots{Mount: mount, Proc: proc}, mount
}

func v1Hierarchy(mount string) cgroup1.Hierarchy {
	return func() ([]cgroup1.Subsystem, error) {
		return []cgroup1.Subsystem{
			cgroup1.NewNamed(mount, "systemd"), cgroup1.NewFreezer(mount), cgroup1.NewCpuset(mount),
			cgroup1.NewMemory(mount), cgroup1.NewDevices(mount), cgroup1.NewCpu(mount),
		}, nil
	}
}

// procsOf reads what was written into dir's cgroup.procs ("" when nothing).
func procsOf(t *testing.T, mount, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(mount, dir, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// On v1 the process moves into step_S of each hierarchy where it sits at
// job level and the step's directory exists; the rest stays, and what is
// not in the step afterwards is reported.
func TestEnterStepV1(t *testing.T) {
	const job = "/slurm_n1/uid_1000/job_42"
	r, mount := fakeNode(t, "77", []string{
		"12:freezer:" + job,
		"11:memory:" + job + "/step_0",
		"10:cpuset:" + job, // no step directory: stays, and is reported
		"9:devices:" + job,
		"8:cpu:/",
		"1:name=systemd:/system.slice/slurmd.service",
		"0::/",
	}, "freezer"+job+"/step_0", "memory"+job+"/step_0", "cpuset"+job, "devices"+job+"/step_0", "cpu", "systemd/system.slice/slurmd.service")
	r.Mode, r.V1 = ModeV1, v1Hierarchy(mount)
	p, err := EnterStep(77, 42, 0, r)
	if err != nil {
		t.Fatal(err)
	}
	var moved []string
	for _, m := range p.Moves {
		moved = append(moved, m.Controller+"="+m.Path)
	}
	slices.Sort(moved)
	want := []string{"devices=" + job + "/step_0", "freezer=" + job + "/step_0"}
	if !slices.Equal(moved, want) {
		t.Errorf("moves %v, want %v", moved, want)
	}
	for _, c := range []string{"freezer", "devices"} {
		if got := procsOf(t, mount, c+job+"/step_0"); got != "77" {
			t.Errorf("%s step cgroup.procs = %q, want 77", c, got)
		}
	}
	if got := procsOf(t, mount, "memory"+job+"/step_0"); got != "" {
		t.Errorf("memory: already in the step, yet written %q", got)
	}
	if !slices.Equal(p.Outside, []string{"cpuset=" + job}) {
		t.Errorf("outside %v, want the cpuset only", p.Outside)
	}
	// Another job's step is never entered.
	p, err = EnterStep(77, 43, 0, r)
	if err != nil || len(p.Moves) != 0 {
		t.Errorf("job 43: moves %+v, err %v; want none", p.Moves, err)
	}
}

// On v2 a process in the step stays; one at job level moves into the
// step's "slurm" leaf; one outside the job is reported.
func TestEnterStepV2(t *testing.T) {
	const job = "/system.slice/n1_slurmstepd.scope/job_42"
	for _, tt := range []struct {
		name, in, wantMove string
		outside            bool
	}{
		{"in the step: nothing moves", job + "/step_0/slurm", "", false},
		{"at job level: into the step's slurm leaf", job, job + "/step_0/slurm", false},
		{"in the job's own slurm dir", job + "/slurm", job + "/step_0/slurm", false},
		{"outside the job", "/system.slice/slurmd.service", "", true},
		{"another step: reported, never moved across steps", job + "/step_1/slurm", "", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, mount := fakeNode(t, "77", []string{"0::" + tt.in}, job+"/step_0/slurm", job+"/step_1/slurm")
			r.Mode = ModeV2
			p, err := EnterStep(77, 42, 0, r)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tt.wantMove == "" && len(p.Moves) != 0:
				t.Errorf("moves %+v, want none", p.Moves)
			case tt.wantMove != "" && (len(p.Moves) != 1 || p.Moves[0].Path != tt.wantMove):
				t.Errorf("moves %+v, want %s", p.Moves, tt.wantMove)
			case tt.wantMove != "" && procsOf(t, mount, tt.wantMove) != "77":
				t.Errorf("%s/cgroup.procs = %q, want 77", tt.wantMove, procsOf(t, mount, tt.wantMove))
			}
			if got := len(p.Outside) > 0; got != tt.outside {
				t.Errorf("outside %v, want outside=%v", p.Outside, tt.outside)
			}
		})
	}
}

// A hybrid node with a controller Slurm needs on its unified side is
// refused, naming the controller; one with other controllers there (this
// project's CI hosts have hugetlb) is handled as v1.
func TestEnterStepHybrid(t *testing.T) {
	for _, tt := range []struct {
		controllers string
		refused     bool
	}{
		{"", false}, {"hugetlb misc", false}, {"hugetlb memory", true}, {"cpuset", true},
	} {
		r, mount := fakeNode(t, "77", []string{"4:memory:/slurm/uid_1/job_42", "0::/"}, "unified", "memory/slurm/uid_1/job_42/step_0")
		if err := os.WriteFile(filepath.Join(mount, "unified", "cgroup.controllers"), []byte(tt.controllers+"\n"), 0o444); err != nil {
			t.Fatal(err)
		}
		r.Mode, r.V1 = ModeHybrid, v1Hierarchy(mount)
		p, err := EnterStep(77, 42, 0, r)
		if tt.refused {
			if !errors.Is(err, ErrHybridController) || !strings.Contains(err.Error(), strings.Fields(tt.controllers)[len(strings.Fields(tt.controllers))-1]) {
				t.Errorf("unified %q: err %v, want ErrHybridController naming it", tt.controllers, err)
			}
			continue
		}
		if err != nil || len(p.Moves) != 1 || p.Moves[0].Controller != "memory" {
			t.Errorf("unified %q: moves %+v, err %v; want the memory move as on v1", tt.controllers, p.Moves, err)
		}
	}
}

func TestModeString(t *testing.T) {
	for m, want := range map[Mode]string{ModeNone: "none", ModeV1: "v1", ModeHybrid: "hybrid", ModeV2: "v2", ModeUnset: "unset"} {
		if m.String() != want || m.Describe() == "" {
			t.Errorf("%d: %q %q", m, m.String(), m.Describe())
		}
	}
}

// The limit is the smallest on the path, "max" and v1's huge value are
// none, and a cgroup without one inherits its parent's.
func TestMemoryLimit(t *testing.T) {
	const job = "/system.slice/n1_slurmstepd.scope/job_42"
	for _, tt := range []struct {
		name  string
		mode  Mode
		files map[string]string
		want  uint64
		file  string
	}{
		{"v2 step limit", ModeV2, map[string]string{job + "/memory.max": "1073741824", job + "/step_0/memory.max": "734003200", job + "/step_0/slurm/memory.max": "max"}, 734003200, job + "/step_0/memory.max"},
		{"v2 job tighter", ModeV2, map[string]string{job + "/memory.max": "524288000", job + "/step_0/memory.max": "734003200"}, 524288000, job + "/memory.max"},
		{"v2 none", ModeV2, map[string]string{job + "/memory.max": "max"}, 0, ""},
		{"v1 step", ModeV1, map[string]string{"memory/slurm/job_42/memory.limit_in_bytes": "9223372036854771712", "memory/slurm/job_42/step_0/memory.limit_in_bytes": "734003200"}, 734003200, "memory/slurm/job_42/step_0/memory.limit_in_bytes"},
		{"v1 none", ModeV1, map[string]string{"memory/slurm/job_42/step_0/memory.limit_in_bytes": "9223372036854771712"}, 0, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lines := []string{"0::" + job + "/step_0/slurm"}
			if tt.mode == ModeV1 {
				lines = []string{"4:memory:/slurm/job_42/step_0", "0::/"}
			}
			r, mount := fakeNode(t, "77", lines)
			r.Mode = tt.mode
			for f, v := range tt.files {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(mount, f)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(mount, f), []byte(v+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			l, err := MemoryLimit(77, r)
			if err != nil {
				t.Fatal(err)
			}
			wantFile := ""
			if tt.file != "" {
				wantFile = filepath.Join(mount, tt.file)
			}
			if l.Bytes != tt.want || l.File != wantFile {
				t.Errorf("limit %d from %q, want %d from %q", l.Bytes, l.File, tt.want, wantFile)
			}
		})
	}
}

// BenchmarkEnterStep is one placement through the library on a fake tree:
// v1 (two hierarchies moved) and v2 (the move into the slurm leaf). The
// cgroup file system's own writes cost the same whoever issues them.
func BenchmarkEnterStep(b *testing.B) {
	const v1job = "/slurm_n1/uid_1000/job_42"
	const v2job = "/system.slice/n1_slurmstepd.scope/job_42"
	for _, tt := range []struct {
		name  string
		mode  Mode
		lines []string
		dirs  []string
	}{
		{"v1", ModeV1, []string{"12:freezer:" + v1job, "11:memory:" + v1job, "10:cpuset:" + v1job + "/step_0", "0::/"},
			[]string{"freezer" + v1job + "/step_0", "memory" + v1job + "/step_0", "cpuset" + v1job + "/step_0"}},
		{"v2", ModeV2, []string{"0::" + v2job}, []string{v2job + "/step_0/slurm"}},
	} {
		b.Run(tt.name, func(b *testing.B) {
			r, mount := fakeNode(b, "77", tt.lines, tt.dirs...)
			r.Mode, r.V1 = tt.mode, v1Hierarchy(mount)
			b.Run("library", func(b *testing.B) {
				for b.Loop() {
					if _, err := EnterStep(77, 42, 0, r); err != nil {
						b.Fatal(err)
					}
				}
			})
			// The hand-written placement this package had before: parse
			// /proc/<pid>/cgroup, write the pid into each step directory.
			b.Run("direct", func(b *testing.B) {
				for b.Loop() {
					f, err := os.Open(filepath.Join(r.Proc, "77", "cgroup"))
					if err != nil {
						b.Fatal(err)
					}
					ms, err := Parse(f)
					f.Close()
					if err != nil {
						b.Fatal(err)
					}
					for _, m := range ms {
						dir := filepath.Join(mount, firstController(m.Controllers), m.Path)
						if filepath.Base(m.Path) != "job_42" {
							continue
						}
						dir = filepath.Join(dir, "step_0")
						if m.Controllers == "" {
							dir = filepath.Join(dir, "slurm")
						}
						if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("77"), 0o644); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		})
	}
}

func TestOOMKills(t *testing.T) {
	for _, tt := range []struct {
		name, line, file, content string
		mode                      Mode
		want                      uint64
		bad                       bool
	}{
		{"v2", "0::/a/step_0/slurm", "a/step_0/slurm/memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n", ModeV2, 1, false},
		{"v1", "4:memory:/slurm/job_1/step_0", "memory/slurm/job_1/step_0/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", ModeV1, 2, false},
		{"v1 old kernel", "4:memory:/slurm/job_1/step_0", "memory/slurm/job_1/step_0/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\n", ModeV1, 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, mount := fakeNode(t, "77", []string{tt.line})
			r.Mode = tt.mode
			if err := os.MkdirAll(filepath.Dir(filepath.Join(mount, tt.file)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(mount, tt.file), []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			n, err := OOMKills(77, r)
			if (err != nil) != tt.bad || n != tt.want {
				t.Errorf("= %d, %v; want %d (error %v)", n, err, tt.want, tt.bad)
			}
		})
	}
}

// A node with no hierarchy: the step runs, reported outside (a warning),
// not failed; a v1 node whose mounts are gone likewise.
func TestEnterStepNoHierarchy(t *testing.T) {
	r, _ := fakeNode(t, "77", []string{"0::/"})
	r.Mode = ModeNone
	p, err := EnterStep(77, 42, 0, r)
	if err != nil || len(p.Outside) != 1 || !strings.HasPrefix(p.Outside[0], "none=") {
		t.Errorf("no hierarchy: %+v, %v; want outside=none and no error", p, err)
	}
	r, _ = fakeNode(t, "77", []string{"4:memory:/slurm/job_42", "0::/"})
	r.Mode = ModeV1
	r.V1 = func() ([]cgroup1.Subsystem, error) { return nil, cgroup1.ErrMountPointNotExist }
	p, err = EnterStep(77, 42, 0, r)
	if err != nil || len(p.Outside) != 1 || !strings.HasPrefix(p.Outside[0], "none=") {
		t.Errorf("v1 without mounts: %+v, %v; want outside=none and no error", p, err)
	}
}
