package fs

import (
	"fmt"
	"path"
	"strings"
)

// Where a mount spec comes from, as named in errors.
const (
	// OptionName is the srun/sbatch/salloc option.
	OptionName = "--microvm-mounts"
	// EnvVar is the environment fallback read where the option is not
	// given (same syntax).
	EnvVar = "SLURM_MICROVM_MOUNTS"
)

// Mount flags (the third field of an entry, '+'-separated).
const (
	FlagRO       = "ro"       // read-only, enforced by the host (default)
	FlagRW       = "rw"       // writable, where the policy allows it
	FlagOptional = "optional" // a missing source skips the entry instead of failing
)

// Mount is one entry of a mount spec.
type Mount struct {
	// Source is the host path, absolute, exactly as written (after
	// $HOME/$USER expansion for site entries); symlinks and ".." in it are
	// resolved when the source is opened, never lexically.
	Source string
	// Destination is the guest path, absolute and lexically cleaned
	// (path.Clean), never "/".
	Destination string
	// ReadOnly is true unless the entry says rw.
	ReadOnly bool
	// Optional entries whose source does not exist are skipped.
	Optional bool
}

// SpecError is a malformed mount spec. Its text names the origin, the rule
// and the entry:
//
//	--microvm-mounts: destination "data" must be absolute (entry 2 of "/a:/b,/c:data")
type SpecError struct {
	Origin string // OptionName, EnvVar, "mounts.site[2]", ...
	Entry  int    // 1-based index of the entry; 0 when about the whole value
	Input  string // the whole value
	Msg    string
	// Err is the class (ErrRefused, ErrConflict, ErrNotAllowed, ...) or
	// the system error behind the message; nil for syntax errors.
	Err error
}

// Unwrap returns Err.
func (e *SpecError) Unwrap() error { return e.Err }

func (e *SpecError) Error() string {
	if e.Entry == 0 {
		return fmt.Sprintf("%s: %s (in %q)", e.Origin, e.Msg, e.Input)
	}
	return fmt.Sprintf("%s: %s (entry %d of %q)", e.Origin, e.Msg, e.Entry, e.Input)
}

// Parse reads a mount spec:
//
//	SRC[:DST[:FLAGS]][,SRC[:DST[:FLAGS]]...]
//
// SRC and DST are absolute paths; DST defaults to SRC. FLAGS is a
// '+'-separated subset of ro (the default), rw and optional. Inside a
// path, '\,' is a comma, '\:' a colon and '\\' a backslash; any other
// backslash sequence is an error, so a path is never split or altered
// silently. Spaces are ordinary characters (quote them for the shell). A
// NUL, newline or carriage return is refused anywhere.
//
// origin names the value in errors (OptionName, EnvVar, a config key). An
// empty value gives no mounts. Every error is a *SpecError naming the entry.
func Parse(origin, s string) ([]Mount, error) { return parseWith(origin, s, nil) }

// parseWith is Parse with expand applied to each path field after it was
// split and unescaped (site entries expand $HOME and $USER), so that an
// expanded value is never split.
func parseWith(origin, s string, expand func(string) (string, error)) ([]Mount, error) {
	if s == "" {
		return nil, nil
	}
	bad := func(entry int, format string, a ...any) error {
		return &SpecError{Origin: origin, Entry: entry, Input: s, Msg: fmt.Sprintf(format, a...)}
	}
	if i := strings.IndexAny(s, "\x00\n\r"); i >= 0 {
		return nil, bad(entryAt(s, i), "a NUL, newline or carriage return is not allowed in a mount spec")
	}
	entries, err := splitEscaped(s, ',')
	if err != nil {
		return nil, bad(entryAt(s, err.(*escapeError).at), "%s", err.Error())
	}
	var out []Mount
	for i, e := range entries {
		n := i + 1
		if e == "" {
			return nil, bad(n, "empty entry (a ',' too many?)")
		}
		fields, _ := splitEscaped(e, ':') // escapes already checked
		if len(fields) > 3 {
			return nil, bad(n, "too many ':' in %q: an entry is SRC[:DST[:FLAGS]] (write \\: for a colon inside a path)", e)
		}
		for j := range fields {
			fields[j] = unescape(fields[j])
			if expand != nil && j < 2 {
				x, err := expand(fields[j])
				if err != nil {
					return nil, bad(n, "%v", err)
				}
				fields[j] = x
			}
		}
		src := fields[0]
		dst := src
		if len(fields) > 1 {
			dst = fields[1]
		}
		m := Mount{Source: src, ReadOnly: true}
		switch {
		case src == "":
			return nil, bad(n, "empty source")
		case !strings.HasPrefix(src, "/"):
			return nil, bad(n, "source %q must be an absolute path%s", src, spaceHint(src))
		case dst == "":
			return nil, bad(n, "empty destination")
		case !strings.HasPrefix(dst, "/"):
			return nil, bad(n, "destination %q must be absolute%s", dst, spaceHint(dst))
		}
		m.Destination = path.Clean(dst)
		if m.Destination == "/" {
			return nil, bad(n, "destination %q is the guest's root directory, which cannot be replaced", dst)
		}
		if len(fields) == 3 {
			if fields[2] == "" {
				return nil, bad(n, "empty flags after the second ':' (known flags: ro, rw, optional)")
			}
			var mode string
			for _, f := range strings.Split(fields[2], "+") {
				switch f {
				case FlagRO, FlagRW:
					if mode != "" && mode != f {
						return nil, bad(n, "flags %q say both ro and rw", fields[2])
					}
					mode = f
					m.ReadOnly = f == FlagRO
				case FlagOptional:
					m.Optional = true
				default:
					return nil, bad(n, "unknown flag %q (known flags: ro, rw, optional; join several with '+')", f)
				}
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// Format writes mounts in the canonical form of Parse: SRC:DST:MODE[+optional]
// with ',', ':' and '\' escaped, entries joined by ','. Parse(Format(m))
// returns m for every m that Parse can return; Format(Parse(x)) == x for x
// in canonical form.
func Format(ms []Mount) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = m.String()
	}
	return strings.Join(parts, ",")
}

// String is the entry in canonical form (see Format).
func (m Mount) String() string {
	flags := FlagRW
	if m.ReadOnly {
		flags = FlagRO
	}
	if m.Optional {
		flags += "+" + FlagOptional
	}
	return escape(m.Source) + ":" + escape(m.Destination) + ":" + flags
}

var escaper = strings.NewReplacer(`\`, `\\`, `,`, `\,`, `:`, `\:`)

func escape(s string) string { return escaper.Replace(s) }

// unescape undoes escape on a field whose escapes splitEscaped validated.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

type escapeError struct {
	at  int
	msg string
}

func (e *escapeError) Error() string { return e.msg }

// splitEscaped splits s on sep where sep is not escaped; the parts keep
// their escapes. It checks that every backslash starts one of the three
// escapes.
func splitEscaped(s string, sep byte) ([]string, error) {
	var parts []string
	start := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if i+1 >= len(s) {
				return nil, &escapeError{i, `a trailing '\' escapes nothing (write \\ for a backslash)`}
			}
			if c := s[i+1]; c != ',' && c != ':' && c != '\\' {
				return nil, &escapeError{i, fmt.Sprintf(`unknown escape "\%c": only \, \: and \\ exist`, c)}
			}
			i++
		case sep:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:]), nil
}

// entryAt returns the 1-based number of the entry holding byte offset i.
func entryAt(s string, i int) int {
	n := 1
	for j := 0; j < i && j < len(s); j++ {
		if s[j] == '\\' {
			j++
			continue
		}
		if s[j] == ',' {
			n++
		}
	}
	return n
}

func spaceHint(p string) string {
	if strings.HasPrefix(p, " ") {
		return "; spaces are part of the path, do not put any after ','"
	}
	return ""
}

// WorkdirOption is the srun/sbatch option setting the working directory in
// the guest.
const WorkdirOption = "--microvm-workdir"

// ParseWorkdir checks a --microvm-workdir value: "" (use the image's
// WORKDIR, else /) or an absolute guest path without NUL or newline; it is
// returned cleaned. The directory is resolved in the guest like a mount
// destination (guestpath.Resolve), never on the host.
func ParseWorkdir(s string) (string, error) {
	switch {
	case s == "":
		return "", nil
	case strings.ContainsAny(s, "\x00\n\r"):
		return "", fmt.Errorf("%s: %q contains a NUL or newline", WorkdirOption, s)
	case !strings.HasPrefix(s, "/"):
		return "", fmt.Errorf("%s: %q must be an absolute path inside the guest", WorkdirOption, s)
	}
	return path.Clean(s), nil
}
