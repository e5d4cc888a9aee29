package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReportCommandsJSON: config check, mounts and image check print
// JSON with --json, for a success and a failure, with the exit status of
// their text form.
func TestReportCommandsJSON(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "data")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	mountsConf := write(t, dir, "mounts.toml", fmt.Sprintf("[mounts]\nallowed = [%q]\nscratch_base = \"\"\n", dir))
	badConf := write(t, dir, "bad.toml", "driver = \"qemu\"\n\n[resources]\noverlay_mb = 10\n")
	tests := []struct {
		name  string
		args  []string
		code  int
		check func(t *testing.T, v map[string]any)
	}{
		{"config check: unknown key", []string{"--config", badConf, "config", "check", "--json"}, 1, func(t *testing.T, v map[string]any) {
			p, _ := v["problems"].([]any)
			if v["ok"] != false || v["exists"] != true || len(p) != 1 {
				t.Fatalf("report %v", v)
			}
			pr := p[0].(map[string]any)
			if pr["key"] != "resources.overlay_mb" || pr["line"] != 4.0 || !strings.Contains(pr["message"].(string), "unknown key") {
				t.Errorf("problem %v", pr)
			}
		}},
		{"config check: no file", []string{"--config", filepath.Join(dir, "none.toml"), "config", "check", "--json"}, -1, func(t *testing.T, v map[string]any) {
			if v["exists"] != false || v["runtime_dir"] != "/run/slurm-microvm" {
				t.Errorf("report %v", v)
			}
			if _, ok := v["problems"].([]any); !ok {
				t.Errorf("problems is not an array: %v", v)
			}
		}},
		{"mounts --plan", []string{"--config", mountsConf, "mounts", "--plan", "--uid", "0", "--mounts", src + ":/data", "--json"}, 0, func(t *testing.T, v map[string]any) {
			m := v["mounts"].([]any)
			if len(m) != 1 || v["scratch"] != nil {
				t.Fatalf("mounts %v", v)
			}
			row := m[0].(map[string]any)
			if row["destination"] != "/data" || row["source"] != src || row["read_only"] != true || row["state"] != "planned" {
				t.Errorf("row %v", row)
			}
		}},
		{"mounts resolved", []string{"--config", mountsConf, "mounts", "--uid", "0", "--mounts", src + ":/data", "--json"}, 0, func(t *testing.T, v map[string]any) {
			row := v["mounts"].([]any)[0].(map[string]any)
			if row["state"] != "resolved" || row["resolved"] != src || row["fstype"] == "" {
				t.Errorf("row %v", row)
			}
		}},
		{"image check: missing image", []string{"image", "check", "--json", filepath.Join(dir, "nothere.tar")}, 1, func(t *testing.T, v map[string]any) {
			if v["ok"] != false || v["image"] != filepath.Join(dir, "nothere.tar") || !strings.Contains(v["error"].(string), "nothere.tar") {
				t.Errorf("report %v", v)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runApp(t, tc.args...)
			if tc.code >= 0 && code != tc.code {
				t.Errorf("exit %d, want %d: %s", code, tc.code, out)
			}
			var v map[string]any
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Fatalf("not one JSON object: %v\n%s", err, out)
			}
			tc.check(t, v)
		})
	}
}
