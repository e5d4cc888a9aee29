package mpi

import (
	"fmt"
	"io"
	"strings"
)

// WriteText prints the report for people: one block per finding (verdict,
// component, host and image library with path and versions, reason), then
// the plan's size and environment, then the overall verdict.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	subject := r.ImageRoot
	if r.Image != "" {
		subject = fmt.Sprintf("%s (unpacked at %s)", r.Image, r.ImageRoot)
	}
	fmt.Fprintf(&b, "image:   %s\nhost:    %s\nmode:    %s\n", subject, r.HostRoot, r.Mode)
	if r.Program != "" {
		fmt.Fprintf(&b, "program: %s\n", r.Program)
	}
	b.WriteString("\n")
	for _, f := range r.Findings {
		fmt.Fprintf(&b, "%-6s %s\n", "["+string(f.Verdict)+"]", f.Component)
		if f.Host != nil || f.Image != nil {
			fmt.Fprintf(&b, "       host:   %s\n", f.Host.describe())
			fmt.Fprintf(&b, "       image:  %s\n", f.Image.describe())
		}
		fmt.Fprintf(&b, "       reason: %s\n", f.Reason)
		if len(f.Missing) > 0 && f.Verdict != VerdictOK {
			max := len(f.Missing)
			if max > 20 {
				max = 20
			}
			for _, m := range f.Missing[:max] {
				fmt.Fprintf(&b, "         - %s\n", m)
			}
			if len(f.Missing) > max {
				fmt.Fprintf(&b, "         - ... %d more\n", len(f.Missing)-max)
			}
		}
	}
	b.WriteString("\n")
	if r.Plan != nil {
		counts := map[string]int{}
		for _, f := range r.Plan.Files {
			counts[f.Role]++
		}
		var parts []string
		for _, role := range []string{RoleMPI, RoleSibling, RoleDependency, RoleOMPIComp, RoleUCXModule, RoleFIProvider, RolePMIxComp} {
			if counts[role] > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", counts[role], role))
			}
		}
		fmt.Fprintf(&b, "plan: %d files into %s (%s)\n", len(r.Plan.Files), r.Plan.GuestDir, strings.Join(parts, ", "))
		for _, e := range r.Plan.Env {
			if e.Prepend {
				fmt.Fprintf(&b, "  %s=%s:$%s\n", e.Name, e.Value, e.Name)
			} else {
				fmt.Fprintf(&b, "  %s=%s\n", e.Name, e.Value)
			}
		}
		if len(r.Plan.Skipped) > 0 {
			fmt.Fprintf(&b, "  %d plugin(s) left out (unresolvable on the host too)\n", len(r.Plan.Skipped))
		}
	}
	if r.Safe {
		b.WriteString("verdict: injection of the host MPI is safe\n")
	} else {
		fmt.Fprintf(&b, "verdict: injection of the host MPI is NOT safe (%d problem(s))\n", len(r.Problems()))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
