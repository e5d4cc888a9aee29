package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestTeardownCleansAbandonedConversions: `stop` and `gc` remove the work
// directory that a conversion killed mid-way left in the image cache (no
// process holds its digest lock), even when the step has no state left.
func TestTeardownCleansAbandonedConversions(t *testing.T) {
	for _, args := range [][]string{{"gc", "--job", "7"}, {"stop", "--job", "7", "--step", "0"}} {
		t.Run(args[0], func(t *testing.T) {
			dir := t.TempDir()
			cfg := filepath.Join(dir, "microvm.toml")
			toml := "runtime_dir = \"" + dir + "/run\"\ncache_dir = \"" + dir + "/cache\"\n[mounts]\nscratch_base = \"\"\n"
			if err := os.WriteFile(cfg, []byte(toml), 0o644); err != nil {
				t.Fatal(err)
			}
			work := filepath.Join(dir, "cache", "images", "1000", "tmp-"+strings.Repeat("c", 64)+"-000000000001")
			if err := os.MkdirAll(filepath.Join(work, "rootfs", "usr"), 0o700); err != nil {
				t.Fatal(err)
			}
			app := &cli.App{
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "config"},
					&cli.BoolFlag{Name: "debug"},
				},
				Commands:       []*cli.Command{stopCommand(), gcCommand()},
				ExitErrHandler: func(*cli.Context, error) {},
			}
			if err := app.Run(append([]string{"slurm-microvm", "--config", cfg}, args...)); err != nil {
				t.Fatalf("%s: %v", args[0], err)
			}
			if _, err := os.Stat(work); !os.IsNotExist(err) {
				t.Errorf("abandoned work directory after %s: %v; want removed", args[0], err)
			}
		})
	}
}
