package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/slurm-microvm/slurm-microvm/fs"
)

// mountsCommand prints the mount table a step would get:
//
//	slurm-microvm mounts --mounts SPEC [--uid U [--gid G] [--groups g1,g2]] [--plan]
//
// It checks the [mounts] policy of the config file, plans the site mounts,
// the scratch directory and SPEC (default: $SLURM_MICROVM_MOUNTS), and,
// unless --plan, opens every source as the user (root may name any --uid;
// others only themselves) and prints where each resolves and on which
// filesystem. No scratch directory is created.
func mountsCommand() *cli.Command {
	return &cli.Command{
		Name:      "mounts",
		Usage:     "print the resolved mount table for a --microvm-mounts value and a user",
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "mounts", Usage: "mount spec SRC[:DST[:FLAGS]][,...] (default: $" + fs.EnvVar + ")"},
			&cli.StringFlag{Name: "uid", Usage: "job user (default: the caller)"},
			&cli.StringFlag{Name: "gid", Usage: "primary gid (default: from passwd)"},
			&cli.StringFlag{Name: "groups", Usage: "supplementary gids, comma separated (default: from the group database)"},
			&cli.BoolFlag{Name: "plan", Usage: "only plan: check syntax and policy, open nothing"},
			&cli.BoolFlag{Name: "json", Usage: "print the table as JSON (mountRow fields)"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := loadConfig(c, true)
			if err != nil {
				return err
			}
			p := cfg.Mounts // validated by loadConfig
			u, err := mountsUser(c)
			if err != nil {
				return cli.Exit(err.Error(), 2)
			}
			spec, origin := c.String("mounts"), fs.OptionName
			if !c.IsSet("mounts") {
				spec, origin = os.Getenv(fs.EnvVar), fs.EnvVar
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			defer w.Flush()
			var scratch *mountRow
			if p.ScratchBase != "" {
				scratch = &mountRow{Destination: p.ScratchDestination, State: "scratch", Origin: "scratch", Source: p.ScratchBase + "/<job>.<step>.<restart>"}
			}
			if c.Bool("plan") {
				entries, err := p.Plan(u, spec, origin, "")
				if err != nil {
					return cli.Exit(err.Error(), 2)
				}
				if c.Bool("json") {
					rows := []mountRow{}
					for _, e := range entries {
						rows = append(rows, mountRow{Destination: e.Destination, ReadOnly: e.ReadOnly, Optional: e.Optional, Origin: string(e.Origin), Source: e.Source, State: "planned"})
					}
					return printMountsJSON(c, rows, scratch)
				}
				fmt.Fprintln(w, "#\tDESTINATION\tMODE\tORIGIN\tSOURCE")
				for i, e := range entries {
					fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", i+1, e.Destination, mode(e.ReadOnly, e.Optional), e.Origin, e.Source)
				}
				return nil
			}
			t, err := p.Resolve(c.Context, fs.Request{User: u, Mounts: spec, Origin: origin})
			if err != nil {
				return cli.Exit(err.Error(), 1)
			}
			defer t.Close()
			if c.Bool("json") {
				rows := []mountRow{}
				for _, s := range t.Shares {
					rows = append(rows, mountRow{Destination: s.Destination, ReadOnly: s.ReadOnly, Origin: string(s.Origin), Source: s.Source, State: "resolved",
						Resolved: s.Resolved, FSType: s.FS.Type, NetworkFS: s.FS.Network})
				}
				for _, e := range t.Skipped {
					rows = append(rows, mountRow{Destination: e.Destination, ReadOnly: e.ReadOnly, Optional: true, Origin: string(e.Origin), Source: e.Source, State: "skipped"})
				}
				return printMountsJSON(c, rows, scratch)
			}
			fmt.Fprintln(w, "#\tDESTINATION\tMODE\tORIGIN\tSOURCE\tRESOLVED\tFSTYPE")
			for i, s := range t.Shares {
				fst := s.FS.Type
				if s.FS.Network {
					fst += " (network)"
				}
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", i+1, s.Destination, mode(s.ReadOnly, false), s.Origin, s.Source, s.Resolved, fst)
			}
			for _, e := range t.Skipped {
				fmt.Fprintf(w, "-\t%s\tskipped\t%s\t%s\t(optional, missing)\t\n", e.Destination, e.Origin, e.Source)
			}
			if p.ScratchBase != "" {
				fmt.Fprintf(w, "+\t%s\trw\tscratch\t%s/<job>.<step>.<restart>\t(created at start)\t\n", p.ScratchDestination, p.ScratchBase)
			}
			return nil
		},
	}
}

// mountRow is one line of `mounts --json`. State is planned (--plan),
// resolved (opened as the user), skipped (optional, missing) or scratch.
type mountRow struct {
	Destination string `json:"destination"`
	Source      string `json:"source"`
	Origin      string `json:"origin"`
	ReadOnly    bool   `json:"read_only"`
	Optional    bool   `json:"optional"`
	State       string `json:"state"`
	Resolved    string `json:"resolved,omitempty"`
	FSType      string `json:"fstype,omitempty"`
	NetworkFS   bool   `json:"network_fs,omitempty"`
}

// printMountsJSON writes {"mounts": rows, "scratch": scratch or null}.
func printMountsJSON(c *cli.Context, rows []mountRow, scratch *mountRow) error {
	enc := json.NewEncoder(c.App.Writer)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Mounts  []mountRow `json:"mounts"`
		Scratch *mountRow  `json:"scratch"`
	}{rows, scratch})
}

func mode(ro, optional bool) string {
	m := "rw"
	if ro {
		m = "ro"
	}
	if optional {
		m += "+optional"
	}
	return m
}

// mountsUser is the job user of `mounts`: --uid or the caller, with gid
// and groups from the flags, else from the user databases.
func mountsUser(c *cli.Context) (fs.User, error) {
	uidS := c.String("uid")
	if uidS == "" {
		uidS = strconv.Itoa(os.Getuid())
	}
	pw, err := user.LookupId(uidS)
	if err != nil {
		if pw, err = user.Lookup(uidS); err != nil {
			return fs.User{}, fmt.Errorf("--uid %s: %w", uidS, err)
		}
	}
	uid, _ := strconv.ParseUint(pw.Uid, 10, 32)
	gidS := c.String("gid")
	if gidS == "" {
		gidS = pw.Gid
	}
	gid, err := strconv.ParseUint(gidS, 10, 32)
	if err != nil {
		return fs.User{}, fmt.Errorf("--gid %q is not a numeric gid", gidS)
	}
	var groups []uint32
	if c.IsSet("groups") {
		if groups, err = parseGids(c.String("groups")); err != nil {
			return fs.User{}, err
		}
	} else if ids, err := pw.GroupIds(); err == nil {
		for _, g := range ids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				groups = append(groups, uint32(n))
			}
		}
	}
	return fs.LookupUser(uint32(uid), uint32(gid), groups)
}
