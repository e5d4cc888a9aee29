package fs

import (
	"errors"
	"strings"
	"testing"
)

var alice = User{Name: "alice", UID: 2001, GID: 2001, Home: "/home/alice"}

func dests(es []Entry) string {
	var s []string
	for _, e := range es {
		s = append(s, e.Destination)
	}
	return strings.Join(s, " ")
}

func TestPlan(t *testing.T) {
	site := Policy{Site: []string{"/lustre/datasets:/lustre/datasets:ro"}}
	for _, tc := range []struct {
		name   string
		p      Policy
		spec   string
		dests  string // destinations in mount order
		errIs  error  // class of the expected error
		errMsg string
		entry  int
	}{
		{name: "proc refused", spec: "/a:/proc", errIs: ErrRefused, errMsg: `destination "/proc" is reserved`, entry: 1},
		{name: "below proc refused", spec: "/x:/y,/a:/proc/sys/x", errIs: ErrRefused, entry: 2},
		{name: "sys refused", spec: "/a:/sys", errIs: ErrRefused, entry: 1},
		{name: "dev/shm refused", spec: "/a:/dev/shm", errIs: ErrRefused, entry: 1},
		{name: "agent dir refused", spec: "/a:/run/microvm/x", errIs: ErrRefused, entry: 1},
		{name: "etc hides hosts", spec: "/a:/etc", errIs: ErrRefused, errMsg: `destination "/etc" would hide /etc/hosts, which is never a mount destination: the launcher writes`, entry: 1},
		{name: "etc/hosts refused", spec: "/a:/etc/hosts", errIs: ErrRefused, errMsg: `destination "/etc/hosts" is reserved`, entry: 1},
		{name: "run hides agent dir", spec: "/a:/run", errIs: ErrRefused, errMsg: `would hide /run/microvm`, entry: 1},
		{name: "below etc is fine", spec: "/a:/etc/myapp", dests: "/etc/myapp"},
		{name: "procfs-like name is fine", spec: "/a:/procdata", dests: "/procdata"},
		{name: "run is fine", spec: "/a:/run/data", dests: "/run/data"},
		{name: "configured refusal", p: Policy{RefusedDestinations: []string{"/opt/site"}}, spec: "/a:/opt/site/x", errIs: ErrRefused, entry: 1},
		{name: "exact duplicates collapse", spec: "/a:/d,/a:/d", dests: "/d"},
		{name: "duplicate destination", spec: "/a:/d,/b:/d", errIs: ErrConflict, errMsg: `already used by entry 1 (/a:/d:ro)`, entry: 2},
		{name: "duplicate destination, other mode", spec: "/a:/d:ro,/a:/d:rw", errIs: ErrConflict, entry: 2},
		{name: "duplicate after cleaning", spec: "/a:/d,/b:/x/../d/", errIs: ErrConflict, entry: 2},
		{name: "parent first", spec: "/a:/x/y/z,/b:/x,/c:/x/y,/d:/w", dests: "/w /x /x/y /x/y/z"},
		{name: "siblings by path", spec: "/a:/b/z,/a:/b/a,/c:/b", dests: "/b /b/a /b/z"},
		{name: "site duplicate collapses", p: site, spec: "/lustre/datasets", dests: "/lustre/datasets"},
		{name: "site destination taken", p: site, spec: "/mine:/lustre/datasets", errIs: ErrConflict, errMsg: "already used by site mount mounts.site[1]", entry: 1},
		{name: "user mount hides part of site mount", p: site, spec: "/mine:/lustre/datasets/imagenet", errIs: ErrConflict, errMsg: "would hide part of it", entry: 1},
		{name: "user mount over site mount's parent", p: site, spec: "/lustre:/lustre", dests: "/lustre /lustre/datasets"},
		{name: "component not prefix for hiding", p: site, spec: "/x:/lustre/datasets2", dests: "/lustre/datasets /lustre/datasets2"},
		{name: "scratch planned", p: Policy{ScratchBase: "/s", ScratchDestination: "/scratch"}, spec: "/a:/scratch/in", dests: "/scratch /scratch/in"},
		{name: "scratch destination taken", p: Policy{ScratchBase: "/s", ScratchDestination: "/scratch"}, spec: "/a:/scratch", errIs: ErrConflict, errMsg: "scratch directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.p.Plan(alice, tc.spec, OptionName, "7.0.0")
			if tc.errIs != nil {
				var se *SpecError
				if !errors.Is(err, tc.errIs) || !errors.As(err, &se) {
					t.Fatalf("Plan(%q) = %v, want %v", tc.spec, err, tc.errIs)
				}
				if !strings.Contains(se.Msg, tc.errMsg) || (tc.entry != 0 && se.Entry != tc.entry) {
					t.Errorf("Plan(%q): %v; want entry %d with %q", tc.spec, err, tc.entry, tc.errMsg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Plan(%q): %v", tc.spec, err)
			}
			if d := dests(got); d != tc.dests {
				t.Errorf("Plan(%q) order %q, want %q", tc.spec, d, tc.dests)
			}
		})
	}
}

func TestPlanSiteExpansion(t *testing.T) {
	p := Policy{Site: []string{"$HOME/data:${HOME}/data:rw", "/apps/$USER:/apps:ro+optional"}}
	u := User{Name: "bob", UID: 3, GID: 3, Home: "/home/we,ird:x"} // passwd can't hold ':', but test the split anyway
	es, err := p.Plan(u, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 || es[0].Source != "/apps/bob" || es[1].Source != "/home/we,ird:x/data" || es[1].Destination != "/home/we,ird:x/data" || es[1].ReadOnly {
		t.Fatalf("expanded %+v", es)
	}
	if !es[0].Optional || es[0].Origin != OriginSite {
		t.Errorf("flags/origin lost: %+v", es[0])
	}
	_, err = Policy{Site: []string{"/x:/y", "$PWD:/d"}}.Plan(u, "", "", "")
	var se *SpecError
	if !errors.As(err, &se) || se.Origin != "mounts.site[2]" || !strings.Contains(se.Msg, "unknown variable $PWD") {
		t.Errorf("unknown variable: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(p *Policy)
		key   string
		index int
		msg   string
	}{
		{name: "defaults", edit: func(p *Policy) {}},
		{name: "full example", edit: func(p *Policy) {
			p.Site = []string{"/lustre/datasets:/lustre/datasets:ro", "/apps:/apps:ro+optional"}
			p.Allowed = []string{"/lustre", "/gpfs", "$HOME", "/scratch/$USER"}
			p.Writable = []string{"$HOME", "/scratch/${USER}"}
			p.RefusedDestinations = []string{"/opt/site"}
		}},
		{name: "site syntax", edit: func(p *Policy) { p.Site = []string{"/a:/b", "/c:data"} }, key: "mounts.site", index: 2, msg: `destination "data" must be absolute`},
		{name: "site refused destination", edit: func(p *Policy) { p.Site = []string{"/x:/proc"} }, key: "mounts.site", index: 1, msg: "reserved"},
		{name: "site conflict", edit: func(p *Policy) { p.Site = []string{"/a:/d", "/b:/d"} }, key: "mounts.site", index: 2, msg: "already used"},
		{name: "site unknown variable", edit: func(p *Policy) { p.Site = []string{"$SCRATCH:/s"} }, key: "mounts.site", index: 1, msg: "unknown variable"},
		{name: "allowed relative", edit: func(p *Policy) { p.Allowed = []string{"/lustre", "lustre"}; p.Writable = nil }, key: "mounts.allowed", index: 2, msg: "absolute"},
		{name: "allowed unknown variable", edit: func(p *Policy) { p.Allowed = []string{"$TMPDIR"}; p.Writable = nil }, key: "mounts.allowed", index: 1, msg: "unknown variable"},
		{name: "writable outside allowed", edit: func(p *Policy) { p.Allowed = []string{"/lustre"}; p.Writable = []string{"/gpfs"} }, key: "mounts.writable", index: 1, msg: "not inside any mounts.allowed"},
		{name: "writable by prefix only", edit: func(p *Policy) { p.Allowed = []string{"/lustre"}; p.Writable = []string{"/lustre2/x"} }, key: "mounts.writable", index: 1},
		{name: "writable inside allowed", edit: func(p *Policy) { p.Allowed = []string{"/lustre"}; p.Writable = []string{"/lustre/proj"} }},
		{name: "refused relative", edit: func(p *Policy) { p.RefusedDestinations = []string{"opt"} }, key: "mounts.refused_destinations", index: 1},
		{name: "scratch base relative", edit: func(p *Policy) { p.ScratchBase = "tmp/x" }, key: "mounts.scratch_base"},
		{name: "scratch off", edit: func(p *Policy) { p.ScratchBase = ""; p.ScratchDestination = "" }},
		{name: "scratch destination refused", edit: func(p *Policy) { p.ScratchDestination = "/dev/scratch" }, key: "mounts.scratch_destination", msg: "refused"},
		{name: "scratch on a site destination", edit: func(p *Policy) { p.Site = []string{"/a:/scratch"} }, key: "mounts.scratch_destination", msg: "already used"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultPolicy()
			tc.edit(&p)
			errs := p.Validate()
			if tc.key == "" {
				if len(errs) > 0 {
					t.Fatalf("Validate: %v", errs)
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("Validate: %d errors %v, want one for %s", len(errs), errs, tc.key)
			}
			var pe *PolicyError
			if !errors.As(errs[0], &pe) || pe.Key != tc.key || pe.Index != tc.index || !strings.Contains(pe.Msg, tc.msg) {
				t.Errorf("Validate: %v; want key %s[%d] with %q", errs[0], tc.key, tc.index, tc.msg)
			}
		})
	}
}

func TestRefusedAboveReserved(t *testing.T) {
	u := User{Name: "u", UID: 1000, GID: 1000, Home: "/home/u"}
	p := DefaultPolicy()
	for _, d := range []string{"/run", "/run/microvm/x", "/run/slurm-microvm/mpi", "/proc/x"} {
		if _, err := p.Plan(u, "/home/u:"+d, OptionName, ""); !errors.Is(err, ErrRefused) {
			t.Errorf("destination %s: err %v, want ErrRefused", d, err)
		}
	}
	if _, err := p.Plan(u, "/home/u:/runner", OptionName, ""); err != nil {
		t.Errorf("/runner is not /run: %v", err)
	}
	// The GPU driver's directory: refused at and below, not above.
	for _, d := range []string{"/usr/local/nvidia", "/usr/local/nvidia/lib64"} {
		if _, err := p.Plan(u, "/home/u:"+d, OptionName, ""); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "GPU driver") {
			t.Errorf("destination %s: err %v, want ErrRefused naming the GPU driver", d, err)
		}
	}
	for _, d := range []string{"/usr/local", "/usr/local/nvidia2"} {
		if _, err := p.Plan(u, "/home/u:"+d, OptionName, ""); err != nil {
			t.Errorf("destination %s: %v", d, err)
		}
	}
}
