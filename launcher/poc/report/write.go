package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// File names in the report directory.
const (
	JSONName = "report.json"
	HTMLName = "report.html"
)

// Write writes r to dir as report.json (indented, for automation) and
// report.html (one self-contained page for people), creating dir (0755)
// and its parents if needed, and returns the two paths. Both files are
// rendered before either is written, and each is written to a temporary
// file in dir, synced and renamed over the old one: a reader (or a poc
// run interrupted mid-write) sees the previous report or the new one,
// never a half-written file. The files are 0644: a report holds no tenant
// data (see Check). Errors name the path and what was being done; on an
// error no temporary file is left.
func Write(dir string, r *Report) (jsonPath, htmlPath string, err error) {
	if r == nil {
		return "", "", fmt.Errorf("write the poc report to %s: no report", dir)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", "", fmt.Errorf("encode the poc report as JSON: %w", err)
	}
	js = append(js, '\n')
	var page bytes.Buffer
	if err := renderHTML(&page, r); err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("create the poc report directory: %w", err)
	}
	jsonPath, htmlPath = filepath.Join(dir, JSONName), filepath.Join(dir, HTMLName)
	if err := writeFileAtomic(jsonPath, js); err != nil {
		return "", "", err
	}
	if err := writeFileAtomic(htmlPath, page.Bytes()); err != nil {
		return "", "", err
	}
	if err := syncDir(dir); err != nil {
		return "", "", err
	}
	return jsonPath, htmlPath, nil
}

// writeFileAtomic replaces path with data (mode 0644) through a
// temporary file in path's directory and a rename.
func writeFileAtomic(path string, data []byte) (err error) {
	dir, name := filepath.Split(path)
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			err = errors.Join(err, removeIfExists(tmp))
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: sync: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return nil
}

// removeIfExists removes path; one that is already gone is no error.
func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the temporary %s: %w", path, err)
	}
	return nil
}

// syncDir makes the renames in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync the poc report directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync the poc report directory %s: %w", dir, err)
	}
	return nil
}

// CheckDir makes dir (0755) unless it exists and checks that it can hold
// the report safely: a directory (not a symlink) owned by the caller, so
// that Write's files land where the caller asked. Errors name dir and
// the rule.
func CheckDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (a symlink is not followed)", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s is owned by uid %d, not by the caller (uid %d): another user could replace the report", dir, st.Uid, os.Geteuid())
	}
	return nil
}
