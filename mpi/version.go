package mpi

import (
	"fmt"
	"path"
	"strconv"
	"strings"
)

// Version is a dotted list of numbers: the numbers after ".so." in a shared
// object's real file name (libmpi.so.40.30.4 -> 40.30.4), or the leading
// numbers of a release string ("4.2.2rc2" -> 4.2.2).
type Version []int

// String renders v as "40.30.4" ("" for none).
func (v Version) String() string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ".")
}

// MarshalText renders v for JSON as its dotted form.
func (v Version) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText reads the dotted form MarshalText writes (a plan recorded
// by the supervisor is read back by each task).
func (v *Version) UnmarshalText(b []byte) error {
	*v = nil
	if len(b) == 0 {
		return nil
	}
	for _, f := range strings.Split(string(b), ".") {
		n, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Errorf("version %q: %q is not a number", b, f)
		}
		*v = append(*v, n)
	}
	return nil
}

// at returns component i and whether it is present.
func (v Version) at(i int) (int, bool) {
	if i < len(v) {
		return v[i], true
	}
	return 0, false
}

// Compare orders two versions component by component, a missing component
// counting as 0: -1, 0 or 1.
func (v Version) Compare(w Version) int {
	for i := 0; i < len(v) || i < len(w); i++ {
		a, _ := v.at(i)
		b, _ := w.at(i)
		switch {
		case a < b:
			return -1
		case a > b:
			return 1
		}
	}
	return 0
}

// fileVersion parses the numbers after ".so." in file name name (its base):
// libmpi.so.40.30.4 -> 40.30.4; libfoo.so -> nil. Parsing stops at the
// first component that is not a number.
func fileVersion(name string) Version {
	base := path.Base(name)
	i := strings.Index(base, ".so.")
	if i < 0 {
		return nil
	}
	return leadingNumbers(strings.Split(base[i+4:], "."))
}

// releaseVersion parses the leading numbers of a release string:
// "4.2.2rc2" -> 4.2.2, "v4.1.4" -> 4.1.4, "2021.6" -> 2021.6.
func releaseVersion(s string) Version {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	parts := strings.Split(s, ".")
	var v Version
	for _, p := range parts {
		j := 0
		for j < len(p) && p[j] >= '0' && p[j] <= '9' {
			j++
		}
		if j == 0 {
			break
		}
		n, err := strconv.Atoi(p[:j])
		if err != nil {
			break
		}
		v = append(v, n)
		if j < len(p) {
			break
		}
	}
	return v
}

func leadingNumbers(parts []string) Version {
	var v Version
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			break
		}
		v = append(v, n)
	}
	return v
}

// Mode is the MPI version rule, named as Sarus names it
// (MPI_COMPATIBILITY_TYPE of its MPI hook).
type Mode string

// The version rules. Source: Sarus, "Native MPI hook (MPICH-based)",
// doc/config/mpi-hook.rst, MPI_COMPATIBILITY_TYPE:
//   - major: "The major numbers (first from the left) must be present and
//     equal. This is equivalent to checking that the soname of the
//     libraries are the same."
//   - full: major as above, and "the host's minor number (second from the
//     left) must be present and greater than or equal to the container's
//     minor number". Sarus then only logs and proceeds when the image's
//     minor is newer; here that is a failure (an older library replacing a
//     newer one may lack what the image was built against).
//   - strict: major as above, and the minor numbers must be present and
//     equal.
//
// Sarus notes the check is "in agreement with the MPICH ABI version number
// schema" (the MPICH ABI Compatibility Initiative, https://www.mpich.org/abi/:
// libmpi.so.12 is the common ABI; a newer minor only adds interfaces).
const (
	ModeMajor  Mode = "major"
	ModeFull   Mode = "full"
	ModeStrict Mode = "strict"
)

// DefaultMode is the rule used when none is configured: full, the one that
// holds for ABI-compatible upgrades (a newer library runs binaries built
// against an older one, not the reverse). Sarus defaults to major.
const DefaultMode = ModeFull

// ParseMode accepts "major", "full" or "strict" ("" means DefaultMode).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case "":
		return DefaultMode, nil
	case ModeMajor, ModeFull, ModeStrict:
		return m, nil
	}
	return "", fmt.Errorf("MPI version mode %q: want major, full or strict", s)
}

// compareVersions applies mode to the host's and the image's file versions
// (the numbers of the real file names). It returns nil when the pair is
// compatible, else an error saying which numbers break which rule.
func compareVersions(mode Mode, host, img Version) error {
	hm, hok := host.at(0)
	im, iok := img.at(0)
	if !hok || !iok {
		return fmt.Errorf("no major version in the file name (host %q, image %q)", host, img)
	}
	if hm != im {
		return fmt.Errorf("major versions differ: host %d, image %d", hm, im)
	}
	if mode == ModeMajor {
		return nil
	}
	hn, hok := host.at(1)
	in, iok := img.at(1)
	if !hok || !iok {
		return fmt.Errorf("mode %s needs minor versions in the file names (host %q, image %q)", mode, host, img)
	}
	switch mode {
	case ModeFull:
		if hn < in {
			return fmt.Errorf("image minor %d is newer than host minor %d (mode full needs host >= image)", in, hn)
		}
	case ModeStrict:
		if hn != in {
			return fmt.Errorf("minor versions differ: host %d, image %d (mode strict needs them equal)", hn, in)
		}
	}
	return nil
}
