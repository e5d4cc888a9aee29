package placement

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// CPUSet is a set of host CPU (or NUMA node) numbers, ascending, each once.
type CPUSet []int

// ParseList reads a Linux CPU list as sysfs, cgroupfs and
// /proc/<pid>/status write it ("0-3,8,10-11"; "" is the empty set).
// Errors name the list and the part that is not a number or a range.
func ParseList(s string) (CPUSet, error) {
	seen := map[int]bool{}
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("CPU list %q: %q is not a CPU number", s, part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("CPU list %q: %q is not a range low-high", s, part)
			}
		}
		for i := a; i <= b; i++ {
			seen[i] = true
		}
	}
	out := make(CPUSet, 0, len(seen))
	for i := range seen {
		out = append(out, i)
	}
	sort.Ints(out)
	return out, nil
}

// String writes the set as a Linux list ("0-3,8").
func (c CPUSet) String() string {
	var sb strings.Builder
	for i := 0; i < len(c); {
		j := i
		for j+1 < len(c) && c[j+1] == c[j]+1 {
			j++
		}
		if sb.Len() > 0 {
			sb.WriteByte(',')
		}
		if j == i {
			fmt.Fprint(&sb, c[i])
		} else {
			fmt.Fprintf(&sb, "%d-%d", c[i], c[j])
		}
		i = j + 1
	}
	return sb.String()
}

// Contains says whether cpu is in the set.
func (c CPUSet) Contains(cpu int) bool {
	i := sort.SearchInts(c, cpu)
	return i < len(c) && c[i] == cpu
}

// Intersect is the CPUs in both sets.
func (c CPUSet) Intersect(o CPUSet) CPUSet {
	out := CPUSet{}
	for _, x := range c {
		if o.Contains(x) {
			out = append(out, x)
		}
	}
	return out
}

// Equal says whether both sets hold the same CPUs.
func (c CPUSet) Equal(o CPUSet) bool {
	if len(c) != len(o) {
		return false
	}
	for i := range c {
		if c[i] != o[i] {
			return false
		}
	}
	return true
}
