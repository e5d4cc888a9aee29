package report

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestWriteRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    *Report
	}{
		{"full", sampleReport(120)},
		{"no load", &Report{Cluster: "c", Checks: []Check{{ID: "a.b", Title: "t", Verdict: Pass}}}},
		{"load without samples", &Report{Cluster: "c", Load: &Load{ArrayTasks: 100}}},
		{"empty", &Report{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "not", "yet") // Write creates it
			jsonPath, htmlPath, err := Write(dir, tc.r)
			if err != nil {
				t.Fatalf("Write: %v", err)
			}
			if jsonPath != filepath.Join(dir, "report.json") || htmlPath != filepath.Join(dir, "report.html") {
				t.Errorf("Write returned %s, %s", jsonPath, htmlPath)
			}
			data, err := os.ReadFile(jsonPath)
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid(data) {
				t.Fatalf("report.json is not valid JSON:\n%s", data)
			}
			if !strings.HasPrefix(string(data), "{\n  \"") || !strings.HasSuffix(string(data), "}\n") {
				t.Errorf("report.json is not indented or lacks its final newline:\n%.200s", data)
			}
			var back Report
			if err := json.Unmarshal(data, &back); err != nil {
				t.Fatalf("decode report.json: %v", err)
			}
			if !reflect.DeepEqual(&back, tc.r) {
				t.Errorf("report.json does not round-trip:\n got %+v\nwant %+v", back, *tc.r)
			}
			if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("report directory: %v, mode %v, want 0755", err, fi.Mode().Perm())
			}
			for _, p := range []string{jsonPath, htmlPath} {
				if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o644 || fi.Size() == 0 {
					t.Errorf("%s: %v, mode %v, size %d, want 0644 and not empty", p, err, fi.Mode().Perm(), fi.Size())
				}
			}
			if got := dirNames(t, dir); !slices.Equal(got, []string{"report.html", "report.json"}) {
				t.Errorf("report directory holds %q, want only the two reports (no temporary file)", got)
			}
		})
	}
}

// TestWriteReplaces: a second Write replaces both files in place.
func TestWriteReplaces(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := Write(dir, &Report{Cluster: "first"}); err != nil {
		t.Fatal(err)
	}
	jsonPath, htmlPath, err := Write(dir, &Report{Cluster: "second"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{jsonPath, htmlPath} {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), "first") || !strings.Contains(string(data), "second") {
			t.Errorf("%s still holds the first report", p)
		}
	}
	if got := dirNames(t, dir); !slices.Equal(got, []string{"report.html", "report.json"}) {
		t.Errorf("report directory holds %q", got)
	}
}

func TestWriteErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) string // returns the directory to write
		want  string                    // in the error
		left  []string                  // what dir holds afterwards, nil: not checked
	}{
		{"nil report", func(t *testing.T) string { return t.TempDir() }, "no report", []string{}},
		{"dir is a file", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "file")
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}, "create the poc report directory", nil},
		{"report.html is a directory: no temporary file left", func(t *testing.T) string {
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "report.html"), 0o755); err != nil {
				t.Fatal(err)
			}
			return dir
		}, "replace " /* + dir/report.html */, []string{"report.html", "report.json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.setup(t)
			r := sampleReport(10)
			if tc.name == "nil report" {
				r = nil
			}
			_, _, err := Write(dir, r)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("Write(%s) = %v, want an error naming %s and %q", dir, err, dir, tc.want)
			}
			if tc.left != nil {
				if got := dirNames(t, dir); !slices.Equal(got, tc.left) {
					t.Errorf("after the error %s holds %q, want %q", dir, got, tc.left)
				}
			}
		})
	}
}

// dirNames lists dir's entries, sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestCheckDir(t *testing.T) {
	base := t.TempDir()
	if err := CheckDir(filepath.Join(base, "new", "report")); err != nil {
		t.Errorf("a new directory: %v", err)
	}
	if err := os.Symlink(base, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	if err := CheckDir(filepath.Join(base, "link")); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("a symlink: %v", err)
	}
	if err := os.WriteFile(filepath.Join(base, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckDir(filepath.Join(base, "file")); err == nil {
		t.Error("a file was accepted")
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(base, "other")
		if err := os.Mkdir(other, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := CheckDir(other); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
			t.Errorf("another user's directory: %v", err)
		}
	}
}
