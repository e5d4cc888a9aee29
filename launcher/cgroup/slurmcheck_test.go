package cgroup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckSlurm(t *testing.T) {
	const good = "CgroupPlugin=cgroup/v2\nConstrainCores=yes\nConstrainRAMSpace=yes\nConstrainDevices=yes\n"
	const slurm = "ClusterName=x\nProctrackType=proctrack/cgroup\nTaskPlugin=task/affinity,task/cgroup\nNodeName=n1 CPUs=2 TaskPlugin=bogus\n"
	for _, tt := range []struct {
		name           string
		mode           Mode
		slurm, cgroup  string // "" writes no file
		unified        string // hybrid: unified/cgroup.controllers
		missing, probs []string
	}{
		{name: "v2, everything set", mode: ModeV2, slurm: slurm, cgroup: good},
		{name: "v2, case and comments", mode: ModeV2, slurm: slurm, cgroup: "cgroupplugin=autodetect # here\nconstraincores=YES\nCONSTRAINRAMSPACE=yes\nconstraindevices=yes\n"},
		{name: "v2, memory and devices not constrained", mode: ModeV2, slurm: slurm, cgroup: "CgroupPlugin=cgroup/v2\nConstrainCores=yes\n#ConstrainRAMSpace=yes\n",
			missing: []string{"ConstrainDevices=yes", "ConstrainRAMSpace=yes"}},
		{name: "no cgroup.conf: Slurm's defaults", mode: ModeV2, slurm: slurm, missing: []string{"ConstrainCores=yes", "ConstrainDevices=yes", "ConstrainRAMSpace=yes"}},
		{name: "no task/cgroup, linuxproc", mode: ModeV1, slurm: "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/affinity\n", cgroup: strings.Replace(good, "cgroup/v2", "cgroup/v1", 1),
			missing: []string{"ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup"}},
		{name: "cgroup/v2 on a v1 node", mode: ModeV1, slurm: slurm, cgroup: good, probs: []string{"CgroupPlugin=cgroup/v2", "slurmd cannot start"}},
		{name: "cgroup/v1 on a v2 node", mode: ModeV2, slurm: slurm, cgroup: strings.Replace(good, "cgroup/v2", "cgroup/v1", 1), probs: []string{"CgroupPlugin=cgroup/v1"}},
		{name: "unknown plugin", mode: ModeV2, slurm: slurm, cgroup: strings.Replace(good, "cgroup/v2", "cgroup/v3", 1), probs: []string{"CgroupPlugin=cgroup/v3"}},
		{name: "hybrid, hugetlb on unified: fine", mode: ModeHybrid, slurm: slurm, cgroup: strings.Replace(good, "cgroup/v2", "autodetect", 1), unified: "hugetlb"},
		{name: "hybrid, memory on unified", mode: ModeHybrid, slurm: slurm, cgroup: strings.Replace(good, "cgroup/v2", "autodetect", 1), unified: "memory pids", probs: []string{"hybrid hierarchy with memory on the unified side"}},
		{name: "no cgroup file system", mode: ModeNone, slurm: slurm, cgroup: good, probs: []string{"no cgroup file system"}},
		// Slurm's parser: spaces, quotes, booleans, several pairs a line,
		// continuation, unprefixed plugin names.
		{name: "Slurm's syntax", mode: ModeV2, slurm: "ClusterName=x ProctrackType = \"proctrack/cgroup\"\nTaskPlugin=affinity,\\\ncgroup # c\n",
			cgroup: "CgroupPlugin = \"cgroup/v2\"\nConstrainCores=true ConstrainRAMSpace=1\nConstrainDevices=YES\n"},
		{name: "spaced plugin on the wrong node", mode: ModeV1, slurm: slurm, cgroup: "CgroupPlugin = cgroup/v2\nConstrainCores=yes\nConstrainRAMSpace=yes\nConstrainDevices=yes\n", probs: []string{"CgroupPlugin=cgroup/v2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			conf := filepath.Join(dir, "slurm.conf")
			write := func(p, s string) {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write(conf, tt.slurm)
			if tt.cgroup != "" {
				write(filepath.Join(dir, "cgroup.conf"), tt.cgroup)
			}
			mount := filepath.Join(dir, "cgroup")
			write(filepath.Join(mount, "unified", "cgroup.controllers"), tt.unified+"\n")
			c := CheckSlurm(conf, tt.mode, mount)
			if len(c.Missing) != len(tt.missing) {
				t.Errorf("missing %q, want %q", c.Missing, tt.missing)
			}
			for i, m := range tt.missing {
				if i < len(c.Missing) && !strings.HasPrefix(c.Missing[i], m) {
					t.Errorf("missing[%d] = %q, want it to name %s", i, c.Missing[i], m)
				}
			}
			if len(c.Problems) != 0 && len(tt.probs) == 0 || len(c.Problems) == 0 && len(tt.probs) != 0 {
				t.Fatalf("problems %q, want ones with %q", c.Problems, tt.probs)
			}
			for _, p := range tt.probs {
				if !strings.Contains(strings.Join(c.Problems, "\n"), p) {
					t.Errorf("problems %q lack %q", c.Problems, p)
				}
			}
			if c.Settings["TaskPlugin"] == "bogus" {
				t.Error("a node line's TaskPlugin word was read as the top-level key")
			}
			if c.Hierarchy != tt.mode.String() || c.SlurmConf != conf {
				t.Errorf("hierarchy %q, slurm.conf %q", c.Hierarchy, c.SlurmConf)
			}
		})
	}
}
