package cluster

import (
	"strings"
	"testing"
)

// TestOCIConf checks the oci.conf of Options.OCIRuntime against what
// Slurm 22.05's slurmstepd accepts (read_oci_conf.c: these keys only; the
// run form wants RunTimeRun, Query, Kill and Delete and neither Create nor
// Start; _generate_pattern knows %% %@ %b %e %j %n %r %s %t %u and dies on
// any other) and against the guide's run examples for each runtime.
func TestOCIConf(t *testing.T) {
	known := map[string]bool{
		"ContainerPath": true, "CreateEnvFile": true, "RunTimeCreate": true, "RunTimeDelete": true,
		"RunTimeKill": true, "RunTimeQuery": true, "RunTimeRun": true, "RunTimeStart": true,
	}
	tests := []struct {
		runtime string
		run     string // RunTimeRun's value
		wantErr bool
	}{
		{"runc", `"runc --rootless=true --root=/run/user/$(id -u %u)/ run %n.%u.%j.%s.%t -b %b"`, false},
		{"crun", `"crun --rootless=true --root=/run/user/$(id -u %u)/ run --bundle %b %n.%u.%j.%s.%t"`, false},
		{"kata", "", true},
		{"", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.runtime, func(t *testing.T) {
			conf, err := OCIConf(tt.runtime)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("OCIConf(%q) = %q, want an error", tt.runtime, conf)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			keys := map[string]string{}
			for _, line := range strings.Split(conf, "\n") {
				if line == "" || strings.HasPrefix(line, "#") {
					continue
				}
				k, v, ok := strings.Cut(line, "=")
				if !ok || !known[k] {
					t.Errorf("line %q: not a Slurm 22.05 oci.conf key", line)
					continue
				}
				keys[k] = v
				for i := 0; i < len(v); i++ {
					if v[i] != '%' {
						continue
					}
					i++
					if i >= len(v) || !strings.ContainsRune("%@bejnrstu", rune(v[i])) {
						t.Errorf("line %q: a pattern Slurm 22.05 does not know at byte %d", line, i)
					}
				}
				if !strings.HasPrefix(v, `"`+tt.runtime+" --rootless=true --root=/run/user/$(id -u %u)/ ") {
					t.Errorf("line %q: want the rootless %s of the guide with the user's /run/user/<uid>/", line, tt.runtime)
				}
			}
			for _, k := range []string{"RunTimeQuery", "RunTimeKill", "RunTimeDelete", "RunTimeRun"} {
				if keys[k] == "" {
					t.Errorf("no %s: Slurm 22.05 rejects a run configuration without it", k)
				}
			}
			for _, k := range []string{"RunTimeCreate", "RunTimeStart"} {
				if keys[k] != "" {
					t.Errorf("%s with RunTimeRun: Slurm 22.05 rejects the mix", k)
				}
			}
			if keys["RunTimeRun"] != tt.run {
				t.Errorf("RunTimeRun=%s, want %s", keys["RunTimeRun"], tt.run)
			}
		})
	}
}
