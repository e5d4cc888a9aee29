package poc

import (
	"bufio"
	"context"
	"debug/buildinfo"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultLauncher is the plugin's launcher= default (spank/args.c).
const DefaultLauncher = "/usr/local/bin/slurm-microvm"

// pluginLauncher is the launcher the node's jobs use: the launcher=
// argument of the spank_microvm.so line in Slurm's PlugStackConfig
// (plugstack.conf(5): "required|optional PATH ARGS..."), DefaultLauncher
// when the line has none, "" when no such line is found (then the poc's
// own binary is assumed).
func (r *run) pluginLauncher(ctx context.Context) string {
	conf, _ := r.slurm.ConfigValue(ctx, "PlugStackConfig")
	if conf == "" || conf == "(null)" {
		conf = "/etc/slurm/plugstack.conf"
	}
	return launcherIn(conf, 0)
}

// launcherIn reads plugstack.conf at path (following `include`, a few
// levels deep) for the plugin's launcher.
func launcherIn(path string, depth int) string {
	f, err := os.Open(path)
	if err != nil || depth > 4 {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) >= 2 && fields[0] == "include" {
			matches, _ := filepath.Glob(fields[1])
			for _, m := range matches {
				if l := launcherIn(m, depth+1); l != "" {
					return l
				}
			}
			continue
		}
		if len(fields) < 2 || filepath.Base(fields[1]) != "spank_microvm.so" {
			continue
		}
		for _, a := range fields[2:] {
			if v, ok := strings.CutPrefix(a, "launcher="); ok {
				return v
			}
		}
		return DefaultLauncher
	}
	return ""
}

// hasFaults reports whether the Go binary at path was built with the
// smv_faults tag (its build information, debug/buildinfo), and whether
// that could be read.
func hasFaults(path string) (faults, known bool) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return false, false
	}
	for _, s := range bi.Settings {
		if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), "smv_faults") {
			return true, true
		}
	}
	return false, true
}
