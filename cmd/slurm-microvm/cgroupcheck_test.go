package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/cgroup"
)

// TestConfigCheckCgroup: config check names the node's hierarchy, each
// Slurm cgroup setting the sandbox's limits need that is missing (a
// warning), and a plugin that cannot run on this hierarchy (an error).
func TestConfigCheckCgroup(t *testing.T) {
	mode := cgroup.Detect()
	wrong, right := "cgroup/v2", "cgroup/v1"
	if mode == cgroup.ModeV2 {
		wrong, right = right, wrong
	}
	dir := t.TempDir()
	conf := write(t, dir, "microvm.toml", "")
	slurm := write(t, dir, "slurm.conf", "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup,task/affinity\n")
	t.Setenv("SLURM_CONF", slurm)

	write(t, dir, "cgroup.conf", "CgroupPlugin="+right+"\nConstrainCores=yes\nConstrainDevices=yes\n")
	_, out := runApp(t, "--config", conf, "config", "check")
	for _, want := range []string{"cgroup: " + mode.Describe(), "ConstrainRAMSpace=no", "warning: missing ConstrainRAMSpace=yes (" + filepath.Join(dir, "cgroup.conf") + ")"} {
		if !strings.Contains(out, want) {
			t.Errorf("config check output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "warning: missing") != 1 {
		t.Errorf("want exactly one missing setting:\n%s", out)
	}

	write(t, dir, "cgroup.conf", "CgroupPlugin="+wrong+"\nConstrainCores=yes\nConstrainDevices=yes\nConstrainRAMSpace=yes\n")
	code, out := runApp(t, "--config", conf, "config", "check", "--json")
	if code != 1 {
		t.Errorf("CgroupPlugin=%s on a %s node: exit %d, want 1\n%s", wrong, mode, code, out)
	}
	var r configCheckReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r.Cgroup == nil || r.Cgroup.Hierarchy != mode.String() || len(r.Cgroup.Missing) != 0 || r.Cgroup.Settings["CgroupPlugin"] != wrong {
		t.Fatalf("cgroup report %+v", r.Cgroup)
	}
	found := false
	for _, p := range r.Problems {
		if p.Key == "cgroup" && strings.Contains(p.Message, "CgroupPlugin="+wrong) {
			found = true
		}
	}
	if !found {
		t.Errorf("no cgroup problem naming CgroupPlugin=%s: %+v", wrong, r.Problems)
	}
}
