package fs

import (
	"errors"
	"fmt"
	"os/user"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Policy is the [mounts] section of microvm.toml: what every step gets, what
// users may add, and the per-step scratch directory.
//
//	[mounts]
//	site = ["/lustre/datasets:/lustre/datasets:ro", "/apps:/apps:ro+optional"]
//	allowed = ["/lustre", "/gpfs", "$HOME", "/scratch/$USER"]
//	writable = ["$HOME", "/scratch/$USER"]
//	refused_destinations = ["/opt/site"]
//	scratch_base = "/var/lib/slurm-microvm/scratch"
//	scratch_destination = "/scratch"
//	keep_scratch = false
//
// $HOME and $USER (also ${HOME}, ${USER}) expand to the job user's passwd
// entry, never to the environment; $$ is a dollar sign.
type Policy struct {
	// Site mounts every step gets, one spec (Parse syntax) per element.
	// Their sources are not limited to Allowed but are still opened with the
	// job user's credentials.
	Site []string `toml:"site"`
	// Allowed are the host trees user mounts may come from, compared by
	// path components after resolving symlinks and "..".
	Allowed []string `toml:"allowed"`
	// Writable are the trees a user mount may be rw in; each must lie inside
	// an Allowed tree.
	Writable []string `toml:"writable"`
	// RefusedDestinations are guest paths no mount may cover, on top of
	// BuiltinRefusedDestinations.
	RefusedDestinations []string `toml:"refused_destinations"`
	// ScratchBase holds one writable directory per step, created owned by
	// the job user and removed at stop. "" turns scratch off.
	ScratchBase string `toml:"scratch_base"`
	// ScratchDestination is where the guest sees the scratch directory.
	ScratchDestination string `toml:"scratch_destination"`
	// KeepScratch leaves the scratch directory in place at stop.
	KeepScratch bool `toml:"keep_scratch"`
}

// BuiltinRefusedDestinations can never be mount destinations: the guest's
// root, the kernel filesystems the agent mounts, the agent's own directory,
// the host MPI share and /etc/hosts, which the agent writes after the
// shares are mounted (launcher/agent/guest: the step's host name). "/" is
// refused only as itself; the others with everything below them, and a
// mount above one (/etc, /run) is refused as it would hide it.
var BuiltinRefusedDestinations = append(slices.Clone(GuestReserved), "/run/slurm-microvm", GuestHosts)

// GuestGPUDriver is where a GPU step's guest finds the node's user-space
// GPU driver (lib64/ and bin/, launcher/gpu/driverset): no share may be
// it or lie below it. Unlike the refused destinations, a share above it
// (/usr/local) is allowed: the agent binds the driver before the shares,
// so such a share hides the driver's directories, and only in that step.
const GuestGPUDriver = "/usr/local/nvidia"

// GuestHosts is the guest's hosts file, which the agent writes (the step's
// host name) after mounting the shares: no share may be it or hide it.
const GuestHosts = "/etc/hosts"

// GuestReserved are the paths the guest agent itself owns: the root, the
// kernel filesystems and its own directory. The agent refuses to mount
// over them whatever the host asks; /run/slurm-microvm, refused to users
// on top (BuiltinRefusedDestinations), is where the launcher shares the
// host's MPI stack.
var GuestReserved = []string{"/", "/proc", "/sys", "/dev", "/run/microvm"}

// DefaultPolicy is the policy of a file without a [mounts] section: users may
// mount their home directory read-only; nothing is writable but the step's
// scratch directory (at /scratch); no site mounts. Writable trees are
// opt-in, so that an admin who narrows allowed never finds a default
// writable tree outside it.
func DefaultPolicy() Policy {
	return Policy{
		Allowed:            []string{"$HOME"},
		ScratchBase:        "/var/lib/slurm-microvm/scratch",
		ScratchDestination: "/scratch",
	}
}

// User is the job's user as the policy sees it.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, as Slurm gives them
	Home   string   // from the passwd entry
}

// Cred is the credentials paths are opened with.
func (u User) Cred() Cred { return Cred{UID: u.UID, GID: u.GID, Groups: u.Groups} }

// LookupUser returns the user with uid, taking the name and home directory
// from the passwd database (NSS where the binary is built with cgo) and gid
// and groups as given (Slurm's view of the job).
func LookupUser(uid, gid uint32, groups []uint32) (User, error) {
	pw, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return User{}, fmt.Errorf("look up uid %d in passwd: %w", uid, err)
	}
	if pw.HomeDir == "" || !strings.HasPrefix(pw.HomeDir, "/") {
		return User{}, fmt.Errorf("uid %d (%s): home directory %q in passwd is not an absolute path", uid, pw.Username, pw.HomeDir)
	}
	return User{Name: pw.Username, UID: uid, GID: gid, Groups: slices.Clone(groups), Home: pw.HomeDir}, nil
}

// expand replaces $HOME, ${HOME}, $USER, ${USER} and $$ in s.
func (u User) expand(s string) (string, error) {
	if !strings.Contains(s, "$") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			b.WriteByte(s[i])
			continue
		}
		rest := s[i+1:]
		var name string
		switch {
		case strings.HasPrefix(rest, "$"):
			b.WriteByte('$')
			i++
			continue
		case strings.HasPrefix(rest, "{"):
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				return "", fmt.Errorf("unterminated ${ in %q", s)
			}
			name = rest[1:end]
			i += end + 1
		default:
			n := 0
			for n < len(rest) && (rest[n] == '_' || rest[n] >= 'A' && rest[n] <= 'Z' || rest[n] >= 'a' && rest[n] <= 'z' || n > 0 && rest[n] >= '0' && rest[n] <= '9') {
				n++
			}
			name = rest[:n]
			i += n
		}
		switch name {
		case "HOME":
			b.WriteString(u.Home)
		case "USER":
			b.WriteString(u.Name)
		default:
			return "", fmt.Errorf("unknown variable $%s in %q (known: $HOME, $USER; write $$ for a dollar sign)", name, s)
		}
	}
	return b.String(), nil
}

// Origin says who asked for a mount.
type Origin string

const (
	OriginSite    Origin = "site"    // Policy.Site
	OriginScratch Origin = "scratch" // the per-step scratch directory
	OriginUser    Origin = "user"    // --microvm-mounts / SLURM_MICROVM_MOUNTS
)

// Entry is one planned mount and where it came from.
type Entry struct {
	Mount
	Origin Origin
	// Ref locates the entry for error messages: origin, entry number and
	// the whole value it was part of.
	Ref SpecError
}

// errorf returns a *SpecError about e.
func (e Entry) errorf(err error, format string, a ...any) *SpecError {
	r := e.Ref
	r.Msg = fmt.Sprintf(format, a...)
	r.Err = err
	return &r
}

// where describes the entry inside another entry's message.
func (e Entry) where() string {
	switch e.Origin {
	case OriginSite:
		return fmt.Sprintf("site mount %s (%s)", e.Ref.Origin, e.Mount)
	case OriginScratch:
		return fmt.Sprintf("the step's scratch directory (mounts.scratch_destination %q)", e.Destination)
	}
	return fmt.Sprintf("entry %d (%s)", e.Ref.Entry, e.Mount)
}

// underOrAt reports whether p equals root or lies below it, comparing path
// components ("/lustre2" is not under "/lustre"). Both must be clean
// absolute paths.
func underOrAt(p, root string) bool {
	if root == "/" || p == root {
		return true
	}
	return strings.HasPrefix(p, root) && p[len(root)] == '/'
}

// refused returns the refused destination that d is (or is below), or "".
func (p Policy) refused(d string) string {
	for _, r := range slices.Concat(BuiltinRefusedDestinations, p.RefusedDestinations) {
		r = path.Clean(r)
		if r == "/" {
			if d == "/" {
				return r
			}
			continue
		}
		if underOrAt(d, r) {
			return r
		}
		// A mount above a refused path would hide it (a share on /run
		// covers the agent's /run/microvm).
		if d != "/" && underOrAt(r, d) {
			return r
		}
	}
	return ""
}

// Plan turns the policy and a user's mount spec (origin: OptionName or
// EnvVar) into the step's mount table without touching any file: site
// mounts, the scratch directory (source <scratch_base>/<step>; step ""
// leaves "<step>" in the path) and the user's mounts, checked for refused
// destinations, duplicates and hiding, in the order they must be mounted
// (parents first; siblings by path).
//
// Rules (each error a *SpecError naming the entry):
//   - a destination may not be or lie below a refused destination;
//   - two entries with one destination collapse when source and flags are
//     equal, and are an error otherwise;
//   - a user mount may not lie below a site mount's destination: it would
//     hide part of what the site promises every step. Any mount may lie
//     below a user or scratch mount, and site mounts may lie below user
//     mounts: the deeper one is mounted later and covers that part of the
//     shallower one (whose source must then hold the mount point if it is
//     read-only; Resolve checks that on the host).
func (p Policy) Plan(u User, spec, origin, step string) ([]Entry, error) {
	if origin == "" {
		origin = OptionName
	}
	var all []Entry
	for i, s := range p.Site {
		key := fmt.Sprintf("mounts.site[%d]", i+1)
		ms, err := parseWith(key, s, u.expand)
		if err != nil {
			return nil, err
		}
		for j, m := range ms {
			all = append(all, Entry{Mount: m, Origin: OriginSite, Ref: SpecError{Origin: key, Entry: j + 1, Input: s}})
		}
	}
	if p.ScratchBase != "" {
		name := step
		if name == "" {
			name = "<step>"
		}
		all = append(all, Entry{
			Mount:  Mount{Source: path.Join(p.ScratchBase, name), Destination: path.Clean(p.ScratchDestination)},
			Origin: OriginScratch,
			Ref:    SpecError{Origin: "mounts.scratch_destination", Input: p.ScratchDestination},
		})
	}
	ms, err := Parse(origin, spec)
	if err != nil {
		return nil, err
	}
	for j, m := range ms {
		all = append(all, Entry{Mount: m, Origin: OriginUser, Ref: SpecError{Origin: origin, Entry: j + 1, Input: spec}})
	}

	var out []Entry
	byDst := map[string]int{}
	for _, e := range all {
		if underOrAt(e.Destination, GuestGPUDriver) {
			return nil, e.errorf(ErrRefused, "destination %q is reserved (%s holds the node's GPU driver in GPU steps)", e.Destination, GuestGPUDriver)
		}
		if r := p.refused(e.Destination); r != "" {
			if r != e.Destination && underOrAt(r, e.Destination) {
				return nil, e.errorf(ErrRefused, "destination %q would hide %s, which is never a mount destination%s: mount a directory below %s instead", e.Destination, r, refusedWhy(r), e.Destination)
			}
			return nil, e.errorf(ErrRefused, "destination %q is reserved (%s is never a mount destination%s)", e.Destination, r, refusedWhy(r))
		}
		if i, ok := byDst[e.Destination]; ok {
			o := out[i]
			if o.Source == e.Source && o.ReadOnly == e.ReadOnly {
				out[i].Optional = o.Optional && e.Optional
				continue
			}
			return nil, e.errorf(ErrConflict, "destination %q is already used by %s", e.Destination, o.where())
		}
		if e.Origin == OriginUser {
			for _, o := range out {
				if o.Origin == OriginSite && underOrAt(e.Destination, o.Destination) {
					return nil, e.errorf(ErrConflict, "destination %q is inside %s and would hide part of it", e.Destination, o.where())
				}
			}
		}
		byDst[e.Destination] = len(out)
		out = append(out, e)
	}
	slices.SortStableFunc(out, func(a, b Entry) int {
		if da, db := depth(a.Destination), depth(b.Destination); da != db {
			return da - db
		}
		return strings.Compare(a.Destination, b.Destination)
	})
	return out, nil
}

// refusedWhy says why a refused destination is, where that is not plain
// from its name.
func refusedWhy(r string) string {
	if r == GuestHosts {
		return ": the launcher writes the step's host name into it at start"
	}
	return ""
}

func depth(p string) int { return strings.Count(p, "/") }

// Error classes of a *SpecError, for errors.Is.
var (
	ErrRefused    = errors.New("refused destination")
	ErrConflict   = errors.New("conflicting mounts")
	ErrNotAllowed = errors.New("source not allowed")
	ErrNotFound   = errors.New("source not found")
	ErrPermission = errors.New("permission denied")
)

// PolicyError is a problem in the [mounts] section, named by its key (as
// launcher/config's errors are) and, for lists, the element's 1-based index.
type PolicyError struct {
	Key   string // "mounts.allowed"
	Index int    // 1-based element of a list; 0 for a scalar
	Msg   string
}

func (e *PolicyError) Error() string {
	if e.Index > 0 {
		return fmt.Sprintf("%s[%d]: %s", e.Key, e.Index, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.Key, e.Msg)
}

// validateUser stands in for the job user when the policy is checked
// without one.
var validateUser = User{Name: "user", UID: 1000, GID: 1000, Home: "/home/user"}

// Validate checks the policy without touching the filesystem and returns
// every problem, each a *PolicyError naming the key: syntax of every site
// entry, absolute and known-variable paths, writable trees inside allowed
// ones, refused or conflicting site and scratch destinations. `slurm-microvm
// config check` reports them with the file's line numbers.
func (p Policy) Validate() []error {
	var errs []error
	bad := func(key string, i int, format string, a ...any) {
		errs = append(errs, &PolicyError{Key: key, Index: i, Msg: fmt.Sprintf(format, a...)})
	}
	u := validateUser
	tree := func(key string, i int, s string) (string, bool) {
		x, err := u.expand(s)
		switch {
		case err != nil:
			bad(key, i, "%v", err)
		case strings.ContainsAny(s, "\x00\n\r"):
			bad(key, i, "%q contains a NUL or newline", s)
		case !strings.HasPrefix(x, "/"):
			bad(key, i, "%q must be an absolute path (or start with $HOME)", s)
		default:
			return path.Clean(x), true
		}
		return "", false
	}
	var allowed []string
	for i, s := range p.Allowed {
		if x, ok := tree("mounts.allowed", i+1, s); ok {
			allowed = append(allowed, x)
		}
	}
	for i, s := range p.Writable {
		x, ok := tree("mounts.writable", i+1, s)
		if ok && !slices.ContainsFunc(allowed, func(a string) bool { return underOrAt(x, a) }) {
			bad("mounts.writable", i+1, "%q is not inside any mounts.allowed tree (%s)", s, strings.Join(p.Allowed, ", "))
		}
	}
	for i, s := range p.RefusedDestinations {
		if strings.Contains(s, "$") || !strings.HasPrefix(s, "/") || strings.ContainsAny(s, "\x00\n\r") {
			bad("mounts.refused_destinations", i+1, "%q must be an absolute guest path (no variables)", s)
		}
	}
	if p.ScratchBase != "" {
		if !strings.HasPrefix(p.ScratchBase, "/") || strings.ContainsAny(p.ScratchBase, "$\x00\n\r") || path.Clean(p.ScratchBase) == "/" {
			bad("mounts.scratch_base", 0, "%q must be an absolute directory other than / (no variables), or \"\" for no scratch", p.ScratchBase)
		}
		d := path.Clean(p.ScratchDestination)
		switch {
		case !strings.HasPrefix(p.ScratchDestination, "/") || strings.ContainsAny(p.ScratchDestination, "$\x00\n\r"):
			bad("mounts.scratch_destination", 0, "%q must be an absolute guest path (no variables)", p.ScratchDestination)
		case p.refused(d) != "":
			bad("mounts.scratch_destination", 0, "%q is a refused destination (%s)", p.ScratchDestination, p.refused(d))
		}
	}
	if len(errs) > 0 {
		return errs
	}
	// Site entries and scratch as a plan for a sample user: syntax,
	// variables, refused and conflicting destinations.
	if _, err := p.Plan(u, "", OptionName, ""); err != nil {
		var se *SpecError
		if errors.As(err, &se) && strings.HasPrefix(se.Origin, "mounts.site[") {
			i, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(se.Origin, "mounts.site["), "]"))
			return []error{&PolicyError{Key: "mounts.site", Index: i, Msg: fmt.Sprintf("%s (in %q)", se.Msg, se.Input)}}
		}
		key := "mounts.scratch_destination"
		if se != nil {
			key = se.Origin
		}
		return []error{&PolicyError{Key: key, Msg: errMsg(err)}}
	}
	return nil
}

func errMsg(err error) string {
	var se *SpecError
	if errors.As(err, &se) {
		return se.Msg
	}
	return err.Error()
}
