// Package hostlist expands Slurm hostlist expressions ("n[01-04],big1"),
// as slurm.conf(5), gres.conf(5) and SLURM_STEP_NODELIST write them.
package hostlist

import (
	"fmt"
	"strconv"
	"strings"
)

// maxExpand bounds one hostlist expression (a typo such as [0-99999999]
// must not allocate gigabytes).
const maxExpand = 65536

// Expand expands a Slurm hostlist expression as gres.conf(5) uses
// for NodeName= and File=: a comma-separated list whose items may hold
// bracketed ranges and lists, e.g. "/dev/nvidia[0-3]",
// "/dev/nvidia[0,2-3]", "gpu[01-04],big1". A range keeps the zero padding
// of its lower bound ("[01-10]" gives 01..10). Several bracket groups in one
// item expand to their product, in order. Errors name the expression.
func Expand(expr string) ([]string, error) {
	var out []string
	items, err := splitTopLevel(expr)
	if err != nil {
		return nil, err
	}
	for _, item := range items {
		if item == "" {
			return nil, fmt.Errorf("hostlist %q: empty item", expr)
		}
		names, err := expandItem(item)
		if err != nil {
			return nil, fmt.Errorf("hostlist %q: %w", expr, err)
		}
		out = append(out, names...)
		if len(out) > maxExpand {
			return nil, fmt.Errorf("hostlist %q: more than %d names", expr, maxExpand)
		}
	}
	return out, nil
}

// splitTopLevel splits on commas outside brackets.
func splitTopLevel(s string) ([]string, error) {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
			if depth > 1 {
				return nil, fmt.Errorf("hostlist %q: nested '['", s)
			}
		case ']':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("hostlist %q: ']' without '['", s)
			}
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("hostlist %q: '[' without ']'", s)
	}
	return append(out, s[start:]), nil
}

// expandItem expands one item: text with zero or more [..] groups.
func expandItem(item string) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']') + open
	prefix, body, rest := item[:open], item[open+1:end], item[end+1:]
	values, err := expandRanges(body)
	if err != nil {
		return nil, err
	}
	tails, err := expandItem(rest)
	if err != nil {
		return nil, err
	}
	if len(values)*len(tails) > maxExpand {
		return nil, fmt.Errorf("more than %d names", maxExpand)
	}
	out := make([]string, 0, len(values)*len(tails))
	for _, v := range values {
		for _, t := range tails {
			out = append(out, prefix+v+t)
		}
	}
	return out, nil
}

// expandRanges expands the inside of one bracket: "0-3", "0,2-3", "01-04".
func expandRanges(body string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if lo == "" || (isRange && hi == "") {
			return nil, fmt.Errorf("bad range %q in [%s]", part, body)
		}
		l, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("bad number %q in [%s]", lo, body)
		}
		h := l
		if isRange {
			if h, err = strconv.ParseUint(hi, 10, 32); err != nil {
				return nil, fmt.Errorf("bad number %q in [%s]", hi, body)
			}
		}
		if h < l {
			return nil, fmt.Errorf("range %q in [%s] runs backwards", part, body)
		}
		if h-l >= maxExpand {
			return nil, fmt.Errorf("range %q in [%s] has more than %d values", part, body, maxExpand)
		}
		width := 0
		if len(lo) > 1 && lo[0] == '0' {
			width = len(lo)
		}
		for v := l; v <= h; v++ {
			out = append(out, fmt.Sprintf("%0*d", width, v))
		}
	}
	return out, nil
}
