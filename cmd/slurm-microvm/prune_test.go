package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// cacheEntry writes a cache entry of uid as the launcher commits one: a
// disk of size bytes, its metadata, its mtime (the last use) at used.
func cacheEntry(t *testing.T, root string, uid int, n int, size int64, used time.Time) string {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(uid))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.Chmod(root, 0o755)
	h := strings.Repeat(fmt.Sprintf("%x", n%16), 64)
	meta := fmt.Sprintf(`{"version":1,"ref":"./img%d","kind":"rootfs","digest":"sha256:%s","config":{},"created":"2026-01-01T00:00:00Z"}`, n, h)
	if err := os.WriteFile(filepath.Join(dir, h+".json"), []byte(meta), 0o444); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(dir, h+".erofs")
	if err := os.WriteFile(disk, make([]byte, size), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(disk, used, used); err != nil {
		t.Fatal(err)
	}
	return disk
}

// TestImagePrune: `image prune` removes the least recently used images
// past the configured limits and prints them with the bytes freed
// (--json: parseable), --dry-run removes nothing, --all with --uid is a
// usage error; the epilog's `gc` prunes a cache past its limit by itself.
func TestImagePrune(t *testing.T) {
	prereq.Root(t, "the image cache is root's")
	dir := t.TempDir()
	cfg := write(t, dir, "microvm.toml", "runtime_dir = \""+dir+"/run\"\ncache_dir = \""+dir+"/cache\"\n[mounts]\nscratch_base = \"\"\n[images]\nuser_cache_mib = 2\ncache_mib = 3\n")
	root := filepath.Join(dir, "cache", "images")
	now := time.Now()
	const mib1 = 1<<20 - 4096 // with its metadata, just below 1 MiB
	oldest := cacheEntry(t, root, 1000, 1, mib1, now.Add(-3*time.Hour))
	middle := cacheEntry(t, root, 1000, 2, mib1, now.Add(-2*time.Hour))
	newest := cacheEntry(t, root, 1000, 3, mib1, now.Add(-time.Hour))
	other := cacheEntry(t, root, 2000, 4, mib1, now.Add(-4*time.Hour))

	if code, out := runApp(t, "--config", cfg, "image", "prune", "--all", "--uid", "1000"); code != 2 || !strings.Contains(out, "exclude") {
		t.Errorf("--all --uid: exit %d, %q; want 2 and the rule", code, out)
	}
	code, out := runApp(t, "--config", cfg, "image", "prune", "--uid", "1000", "--dry-run", "--json")
	if code != 0 {
		t.Fatalf("dry run: exit %d: %s", code, out)
	}
	var rep pruneReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Images == nil {
		t.Fatalf("dry run output %q: %v", out, err)
	}
	if len(rep.Images.Removed) != 1 || rep.Images.Removed[0].Disk != oldest || !rep.DryRun {
		t.Errorf("dry run = %+v; want the oldest of uid 1000 (%s)", rep.Images, oldest)
	}
	if _, err := os.Stat(oldest); err != nil {
		t.Errorf("dry run removed %s", oldest)
	}
	code, out = runApp(t, "--config", cfg, "image", "prune", "--uid", "1000")
	if code != 0 || !strings.Contains(out, "removed image sha256:1111") || !strings.Contains(out, "1020.2 KiB freed") {
		t.Errorf("prune --uid 1000: exit %d, %q; want the oldest image removed and its bytes freed", code, out)
	}
	for p, want := range map[string]bool{oldest: false, middle: true, newest: true, other: true} {
		if _, err := os.Stat(p); (err == nil) != want {
			t.Errorf("after prune --uid 1000: %s present = %v, want %v", p, err == nil, want)
		}
	}
	// 3 MiB in all is the limit: the epilog prunes uid 2000's (the least
	// recently used of all) only once past it.
	app := &cli.App{
		Flags:          []cli.Flag{&cli.StringFlag{Name: "config"}, &cli.BoolFlag{Name: "debug"}},
		Commands:       []*cli.Command{gcCommand()},
		ExitErrHandler: func(*cli.Context, error) {},
	}
	if err := app.Run([]string{"slurm-microvm", "--config", cfg, "gc", "--job", "7"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("gc within the limits removed %s: %v", other, err)
	}
	cacheEntry(t, root, 3000, 5, mib1, now)
	if err := app.Run([]string{"slurm-microvm", "--config", cfg, "gc", "--job", "7"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(other); err == nil {
		t.Errorf("gc past cache_mib kept the least recently used image %s", other)
	}
	if _, err := os.Stat(filepath.Dir(other)); err == nil {
		t.Errorf("gc left the emptied directory %s", filepath.Dir(other))
	}
}
