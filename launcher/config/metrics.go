package config

import (
	"path/filepath"
	"strings"
)

// Metrics is the [metrics] table: where each step's supervisor leaves the
// node's metrics for Prometheus (launcher/metrics).
type Metrics struct {
	// Textfile is the file node_exporter's textfile collector reads
	// (its --collector.textfile.directory, a name ending in .prom),
	// rewritten at the end of each step; <textfile>.state.json and
	// <textfile>.lock are kept next to it. "": no metrics file.
	Textfile string `toml:"textfile"`
}

// validate checks textfile: "" or an absolute path whose name ends in
// ".prom" (node_exporter reads only those: textfile collector).
func (m Metrics) validate(path string, data []byte) []error {
	t := m.Textfile
	if t == "" {
		return nil
	}
	bad := func(msg string) []error {
		return []error{&Error{Path: path, Line: lineOf(data, []string{"metrics", "textfile"}), Key: "metrics.textfile", Msg: msg}}
	}
	if !filepath.IsAbs(t) {
		return bad(`"` + t + `" must be an absolute path (e.g. "/var/lib/prometheus/node-exporter/slurm_microvm.prom"), or "" for none`)
	}
	if !strings.HasSuffix(t, ".prom") || filepath.Base(t) == ".prom" || filepath.Clean(t) != t {
		return bad(`"` + t + `" must be a clean path to a file whose name ends in ".prom": node_exporter's textfile collector reads only those`)
	}
	return nil
}
