package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// SlurmConfPaths are where CheckSlurm looks for slurm.conf when
// SLURM_CONF is unset: Debian's packages' path, then the copy slurmd keeps
// in configless mode (Slurm's "Configless Slurm" guide: /run/slurm/conf).
// cgroup.conf sits beside it (cgroup.conf(5)).
var SlurmConfPaths = []string{"/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf"}

// SlurmCheck says whether Slurm's cgroup configuration on a node gives the
// sandbox the limits the README promises: killed with the step, charged to
// --mem, only the step's devices and CPUs.
type SlurmCheck struct {
	// Hierarchy is the node's (Mode.String); Describe says it in words.
	Hierarchy string `json:"hierarchy"`
	Describe  string `json:"description"`
	// SlurmConf and CgroupConf are the files read ("" when not found).
	SlurmConf  string `json:"slurm_conf"`
	CgroupConf string `json:"cgroup_conf"`
	// Settings are the values that decide it, as the files give them or
	// as Slurm defaults them (cgroup.conf(5), slurm.conf(5)).
	Settings map[string]string `json:"settings"`
	// Missing names each setting that is missing and what the sandbox
	// lacks without it: warnings, the step still runs.
	Missing []string `json:"missing"`
	// Problems are errors: steps on this node fail or run unconstrained.
	Problems []string `json:"problems"`
	// Notes say what was not checked.
	Notes []string `json:"notes,omitempty"`
}

// CheckSlurm reads slurm.conf at slurmConf ("" = $SLURM_CONF, else the
// first of SlurmConfPaths that exists) and cgroup.conf beside it, and
// checks them against the
// node's hierarchy mode (mount is where it is mounted, "" =
// /sys/fs/cgroup). Keys are case-insensitive and "#" starts a comment
// (slurm.conf(5)); Include lines are not followed (noted).
func CheckSlurm(slurmConf string, mode Mode, mount string) SlurmCheck {
	if slurmConf == "" {
		slurmConf = os.Getenv("SLURM_CONF")
	}
	for _, p := range SlurmConfPaths {
		if slurmConf != "" {
			break
		}
		if _, err := os.Stat(p); err == nil {
			slurmConf = p
		}
	}
	if slurmConf == "" {
		slurmConf = SlurmConfPaths[0]
	}
	if mount == "" {
		mount = "/sys/fs/cgroup"
	}
	c := SlurmCheck{Hierarchy: mode.String(), Describe: mode.Describe(), Settings: map[string]string{}, Missing: []string{}, Problems: []string{}}
	// Slurm's defaults (22.05).
	set := map[string]string{
		"cgroupplugin": "autodetect", "constrainramspace": "no", "constraindevices": "no", "constraincores": "no",
		"proctracktype": "proctrack/cgroup", "taskplugin": "task/none",
	}
	names := map[string]string{
		"cgroupplugin": "CgroupPlugin", "constrainramspace": "ConstrainRAMSpace", "constraindevices": "ConstrainDevices",
		"constraincores": "ConstrainCores", "proctracktype": "ProctrackType", "taskplugin": "TaskPlugin",
	}
	cgroupConf := filepath.Join(filepath.Dir(slurmConf), "cgroup.conf")
	for _, f := range []struct {
		path string
		into *string
		keys []string
	}{
		{slurmConf, &c.SlurmConf, []string{"proctracktype", "taskplugin"}},
		{cgroupConf, &c.CgroupConf, []string{"cgroupplugin", "constrainramspace", "constraindevices", "constraincores"}},
	} {
		kv, include, err := readSlurmConf(f.path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			c.Notes = append(c.Notes, fmt.Sprintf("%s not found: Slurm's defaults assumed for %s", f.path, keyList(f.keys, names)))
			continue
		case err != nil:
			c.Problems = append(c.Problems, fmt.Sprintf("%s: %v: not checked (Slurm must read it too)", f.path, err))
			continue
		}
		*f.into = f.path
		if include {
			c.Notes = append(c.Notes, f.path+" has Include lines: settings in the included files are not read")
		}
		for _, k := range f.keys {
			if v, ok := kv[k]; ok {
				set[k] = v
			}
		}
	}
	for k, v := range set {
		c.Settings[names[k]] = v
	}
	yes := func(k string) bool { return slurmBool(set[k]) }
	plugin := strings.ToLower(set["cgroupplugin"])
	if plugin == "v1" || plugin == "v2" {
		plugin = "cgroup/" + plugin
	}
	switch {
	case mode == ModeNone:
		c.Problems = append(c.Problems, "no cgroup file system at "+mount+": no Slurm cgroup plugin can constrain a step, and the sandbox escapes scancel and --mem")
	case plugin == "cgroup/v2" && mode != ModeV2:
		c.Problems = append(c.Problems, fmt.Sprintf("CgroupPlugin=cgroup/v2 in %s, but this node runs %s: slurmd cannot start; use cgroup/v1 or autodetect, or boot the node with the unified hierarchy", cgroupConf, mode.Describe()))
	case plugin == "cgroup/v1" && mode == ModeV2:
		c.Problems = append(c.Problems, fmt.Sprintf("CgroupPlugin=cgroup/v1 in %s, but this node runs %s: use cgroup/v2 or autodetect", cgroupConf, mode.Describe()))
	case plugin != "autodetect" && plugin != "cgroup/v1" && plugin != "cgroup/v2":
		c.Problems = append(c.Problems, fmt.Sprintf("CgroupPlugin=%s in %s: Slurm knows cgroup/v1, cgroup/v2 and autodetect", set["cgroupplugin"], cgroupConf))
	}
	if mode == ModeHybrid {
		if bad, err := HybridControllers(mount); err != nil {
			c.Notes = append(c.Notes, err.Error())
		} else if len(bad) > 0 {
			c.Problems = append(c.Problems, fmt.Sprintf("hybrid hierarchy with %s on the unified side (%s): Slurm's cgroup/v1 cannot constrain them and steps are refused; keep them on v1 or boot with the unified hierarchy",
				strings.Join(bad, ", "), filepath.Join(mount, "unified", "cgroup.controllers")))
		}
	}
	if p := strings.ToLower(set["proctracktype"]); p != "proctrack/cgroup" && p != "cgroup" {
		c.Missing = append(c.Missing, fmt.Sprintf("ProctrackType=proctrack/cgroup (%s has %s): scancel and the step's end do not reach the sandbox's processes through Slurm (the supervisor detaches from slurmstepd); only the plugin's own stop does", slurmConf, set["proctracktype"]))
	}
	var tasks []string
	for _, p := range strings.Split(strings.ToLower(set["taskplugin"]), ",") {
		tasks = append(tasks, "task/"+strings.TrimPrefix(strings.TrimSpace(p), "task/"))
	}
	if !slices.Contains(tasks, "task/cgroup") {
		c.Missing = append(c.Missing, fmt.Sprintf("TaskPlugin=task/cgroup (%s has %s): Slurm sets no memory, device or CPU limit on the step, so none applies to the sandbox", slurmConf, set["taskplugin"]))
	}
	if !yes("constrainramspace") {
		c.Missing = append(c.Missing, fmt.Sprintf("ConstrainRAMSpace=yes (%s): the sandbox's VMM is not held to the step's --mem", cgroupConf))
	}
	if !yes("constraindevices") {
		c.Missing = append(c.Missing, fmt.Sprintf("ConstrainDevices=yes (%s): the step's device cgroup allows every device, not only its GRES", cgroupConf))
	}
	if !yes("constraincores") {
		c.Missing = append(c.Missing, fmt.Sprintf("ConstrainCores=yes (%s): the sandbox's vCPUs are not held to the step's CPUs", cgroupConf))
	}
	slices.Sort(c.Missing)
	return c
}

func keyList(keys []string, names map[string]string) string {
	var out []string
	for _, k := range keys {
		out = append(out, names[k])
	}
	return strings.Join(out, ", ")
}

// slurmPair is one KEY=VALUE of a Slurm configuration line as Slurm's
// parser (src/common/parse_config.c) takes it: spaces around "=", an
// optional "+=" style operator, a double-quoted value or a word.
var slurmPair = regexp.MustCompile(`([A-Za-z][A-Za-z0-9_]*)\s*[-+*/]?=\s*("[^"]*"|[^\s"]+)`)

// slurmBlockKeys start a line whose other pairs belong to that entry
// (slurm.conf(5): nodes, partitions, node sets, front ends, switches).
var slurmBlockKeys = []string{"nodename", "partitionname", "nodeset", "frontendname", "downnodes", "switchname"}

// readSlurmConf reads the top-level KEY=VALUE pairs of a Slurm
// configuration file, keys lower-cased and values unquoted, the last one
// winning; include reports Include lines. Lines continue after a
// trailing "\", "#" starts a comment unless escaped ("\#"). Errors: the
// file unreadable or not a regular file, a line over 1 MiB.
func readSlurmConf(path string) (kv map[string]string, include bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, false, fmt.Errorf("not a regular file")
	}
	kv = map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var cont strings.Builder
	for sc.Scan() {
		line := sc.Text()
		if strings.HasSuffix(line, "\\") {
			cont.WriteString(strings.TrimSuffix(line, "\\"))
			continue
		}
		cont.WriteString(line)
		line = cont.String()
		cont.Reset()
		line = strings.ReplaceAll(line, "\\#", "\x00")
		line, _, _ = strings.Cut(line, "#")
		line = strings.ReplaceAll(line, "\x00", "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if strings.EqualFold(fields[0], "include") {
			include = true
			continue
		}
		pairs := slurmPair.FindAllStringSubmatch(line, -1)
		if len(pairs) == 0 || slices.Contains(slurmBlockKeys, strings.ToLower(pairs[0][1])) {
			continue
		}
		for _, m := range pairs {
			kv[strings.ToLower(m[1])] = strings.Trim(m[2], `"`)
		}
	}
	return kv, include, sc.Err()
}

// slurmBool is Slurm's reading of a yes/no setting (parse_config.c
// s_p_handle_boolean: yes, up, true, 1; case-insensitive).
func slurmBool(v string) bool {
	switch strings.ToLower(v) {
	case "yes", "up", "true", "1":
		return true
	}
	return false
}
