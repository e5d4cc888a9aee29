package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
)

// TestValidateShareLimit: a mount list that makes more host shares than a
// microVM takes is refused at submit by `validate`, naming the limit;
// one share fewer passes the count.
func TestValidateShareLimit(t *testing.T) {
	tmp := t.TempDir()
	// Scratch on and MPI auto (the defaults): two shares besides the
	// user's own.
	cfgPath := filepath.Join(tmp, "microvm.toml")
	conf := fmt.Sprintf("[mounts]\nallowed = [%q]\nscratch_base = %q\n", tmp, filepath.Join(tmp, "scratch"))
	if err := os.WriteFile(cfgPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	mounts := func(n int) string {
		var l []string
		for i := 0; i < n; i++ {
			d := filepath.Join(tmp, fmt.Sprintf("d%d", i))
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			l = append(l, d)
		}
		return strings.Join(l, ",")
	}
	validate := func(spec string) error {
		app := &cli.App{
			Flags:          []cli.Flag{&cli.StringFlag{Name: "config"}},
			Commands:       []*cli.Command{validateCommand()},
			ExitErrHandler: func(*cli.Context, error) {},
		}
		return app.Run([]string{"slurm-microvm", "--config", cfgPath, "validate", "--image", filepath.Join(tmp, "no-such-image"), "--mounts", spec})
	}
	over := qemu.MaxSharesMicrovm - 2 + 1
	err := validate(mounts(over))
	want := fmt.Sprintf("the step would have %d host shares (%d of --microvm-mounts, 0 site mounts, 1 scratch, 1 host MPI with --microvm-mpi=auto): a microVM takes at most %d", over+2, over, qemu.MaxSharesMicrovm)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("validate with %d mounts: %v, want %q", over, err, want)
	}
	// At the limit, the count passes and validate goes on to the image.
	err = validate(mounts(over - 1))
	if err == nil || strings.Contains(err.Error(), "host shares") || !strings.Contains(err.Error(), "--microvm") {
		t.Fatalf("validate with %d mounts: %v, want only the image's error", over-1, err)
	}
}

// TestValidateRefusedDestinations: `validate` refuses at submit the mounts
// the node would refuse at start, naming the rule: the step's scratch
// destination taken by a user mount, /etc (which would hide /etc/hosts,
// which the launcher writes); it creates no scratch directory doing so.
func TestValidateRefusedDestinations(t *testing.T) {
	tmp := t.TempDir()
	scratch := filepath.Join(tmp, "scratch")
	src := filepath.Join(tmp, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(tmp, "microvm.toml")
	conf := fmt.Sprintf("[mounts]\nallowed = [%q]\nscratch_base = %q\nscratch_destination = \"/scratch\"\n", tmp, scratch)
	if err := os.WriteFile(cfgPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mounts, want string
	}{
		{src + ":/scratch", `destination "/scratch" is already used by the step's scratch directory (mounts.scratch_destination "/scratch")`},
		{src + ":/etc", `destination "/etc" would hide /etc/hosts, which is never a mount destination: the launcher writes the step's host name into it`},
		{src + ":/etc/hosts", `destination "/etc/hosts" is reserved`},
		// Passes the mounts, fails on the (missing) image.
		{src + ":/etc/myapp", "--microvm: "},
		{src + ":/scratch/in", "--microvm: "},
	} {
		app := &cli.App{
			Flags:          []cli.Flag{&cli.StringFlag{Name: "config"}},
			Commands:       []*cli.Command{validateCommand()},
			ExitErrHandler: func(*cli.Context, error) {},
		}
		err := app.Run([]string{"slurm-microvm", "--config", cfgPath, "validate", "--image", filepath.Join(tmp, "no-such-image"), "--mounts", tc.mounts})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate --mounts %s: %v, want %q", tc.mounts, err, tc.want)
		}
		if _, err := os.Lstat(scratch); !os.IsNotExist(err) {
			t.Fatalf("validate --mounts %s: scratch base %s: %v, want none created", tc.mounts, scratch, err)
		}
	}
}
