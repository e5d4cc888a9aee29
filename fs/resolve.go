package fs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Share is one resolved mount: its source opened with the job user's
// credentials, ready to be handed to the file server.
type Share struct {
	Entry
	// Resolved is the source's path with every symlink and ".." resolved
	// (for logs and messages; never opened again by name).
	Resolved string
	// File is the source directory, opened O_RDONLY|O_DIRECTORY as the
	// user. This object is what is shared: give it to QEMU as an inherited
	// descriptor and ProcFDPath(fd) as the 9p path (see Table.NineP).
	File *os.File
	// FS is the filesystem of the source.
	FS FSInfo
}

// Table is a step's resolved mounts in the order they must be mounted
// (parents first).
type Table struct {
	Shares []Share
	// Skipped are optional entries whose source does not exist.
	Skipped []Entry
	// ScratchDir is the step's scratch directory on the host ("" when none
	// was created); remove it with Policy.RemoveScratch at stop.
	ScratchDir string
}

// Close closes every share's descriptor (QEMU keeps its own after start).
func (t *Table) Close() error {
	var errs []error
	for _, s := range t.Shares {
		if s.File != nil {
			errs = append(errs, s.File.Close())
		}
	}
	return errors.Join(errs...)
}

// Request is one step's mount request.
type Request struct {
	User User
	// Mounts is the user's spec (--microvm-mounts, else the environment
	// fallback); "" for none.
	Mounts string
	// Origin names Mounts in errors: OptionName (default) or EnvVar.
	Origin string
	// Step names the scratch directory ("<job>.<step>.<restart>"); ""
	// creates none and leaves the scratch mount out (validation, `mounts`).
	Step string
}

// Resolve plans the step's mounts (Plan) and opens every source with the
// job user's credentials (OpenDirAs), creating the scratch directory when
// r.Step is set. Rules, each failure a *SpecError naming the entry (with
// ErrNotAllowed, ErrPermission, ErrNotFound, ErrRefused or ErrConflict for
// errors.Is):
//
//   - a user source must resolve, symlinks and ".." included, inside an
//     allowed tree (trees resolved the same way, as the user; trees that do
//     not exist or the user cannot reach are ignored) and is then opened
//     below that tree without following anything: a symlink counts only
//     where it leads, so one out of the trees is refused and one into
//     another allowed tree is fine;
//   - a rw user mount must resolve inside a writable tree, and the user must
//     be allowed to write the directory;
//   - every source (site, scratch, user) is a directory the user can read
//     and search; optional entries whose source does not exist are skipped;
//   - a mount below another share's destination needs its mount point to
//     exist in that share's source when that share is read-only (the guest
//     cannot create it there); it is looked up below the share, as the user,
//     without following symlinks.
//
// On error nothing stays open and a scratch directory created here is
// removed. The caller closes the table after QEMU has started.
func (p Policy) Resolve(ctx context.Context, r Request) (_ *Table, err error) {
	u := r.User
	c := u.Cred()
	entries, err := p.Plan(u, r.Mounts, r.Origin, r.Step)
	if err != nil {
		return nil, err
	}
	allowed := resolveTrees(ctx, u, p.Allowed)
	writable := resolveTrees(ctx, u, p.Writable)

	t := &Table{}
	defer func() {
		if err != nil {
			t.Close()
			if t.ScratchDir != "" {
				p.RemoveScratch(r.Step)
			}
		}
	}()
	for _, e := range entries {
		if e.Origin == OriginScratch {
			if r.Step == "" {
				continue
			}
			dir, err := p.CreateScratch(u, r.Step)
			if err != nil {
				return nil, fmt.Errorf("mounts.scratch_base: %w", err)
			}
			t.ScratchDir = dir
			e.Source = dir
		}
		var trees []string
		if e.Origin == OriginUser {
			trees = []string{}
			for _, a := range allowed {
				trees = append(trees, a.real)
			}
		}
		f, real, _, err := OpenDirAs(ctx, c, e.Source, trees)
		switch {
		case err == nil:
		case e.Optional && errors.Is(err, ErrNotFound):
			t.Skipped = append(t.Skipped, e)
			continue
		case errors.Is(err, ErrNotFound):
			return nil, e.errorf(ErrNotFound, "source %q does not exist (add the optional flag to skip a missing source)", e.Source)
		case errors.Is(err, ErrNotAllowed) && real != "" && real != e.Source:
			return nil, e.errorf(ErrNotAllowed, "source %q resolves to %q, outside the trees you may mount from (%s)", e.Source, real, treeList(allowed))
		case errors.Is(err, ErrNotAllowed):
			return nil, e.errorf(ErrNotAllowed, "source %q is outside the trees you may mount from (%s)", e.Source, treeList(allowed))
		case errors.Is(err, ErrPermission):
			return nil, e.errorf(ErrPermission, "source %q: permission denied for user %s (uid %d)", e.Source, u.Name, u.UID)
		case errors.Is(err, unix.ENOTDIR):
			return nil, e.errorf(err, "source %q is not a directory (only directories can be shared)", e.Source)
		default:
			return nil, e.errorf(err, "source %q: %v", e.Source, err)
		}
		t.Shares = append(t.Shares, Share{Entry: e, Resolved: real, File: f})
		s := &t.Shares[len(t.Shares)-1]
		if e.Origin == OriginUser && !e.ReadOnly {
			w := false
			for _, wt := range writable {
				w = w || underOrAt(real, wt.real)
			}
			if !w {
				return nil, e.errorf(ErrNotAllowed, "source %q may only be mounted read-only (writable trees: %s)", e.Source, treeList(writable))
			}
			if err := CheckWritableAs(ctx, c, f); err != nil {
				return nil, e.errorf(errors.Join(ErrPermission, err), "source %q is mounted rw but user %s cannot write it: %v", e.Source, u.Name, err)
			}
		}
		if s.FS, err = ClassifyFile(f); err != nil {
			return nil, e.errorf(err, "source %q: %v", e.Source, err)
		}
	}
	if err := checkMountPoints(ctx, c, t.Shares); err != nil {
		return nil, err
	}
	return t, nil
}

// checkMountPoints applies the nested-mount rule of Resolve.
func checkMountPoints(ctx context.Context, c Cred, shares []Share) error {
	for i, b := range shares {
		parent := -1
		for j, a := range shares[:i] {
			if a.Destination != b.Destination && underOrAt(b.Destination, a.Destination) &&
				(parent < 0 || len(a.Destination) > len(shares[parent].Destination)) {
				parent = j
			}
		}
		if parent < 0 {
			continue
		}
		a := shares[parent]
		rel := strings.TrimPrefix(strings.TrimPrefix(b.Destination, a.Destination), "/")
		err := asUser(ctx, c, func() error {
			fd, err := openBeneath(int(a.File.Fd()), rel, unix.O_PATH|unix.O_DIRECTORY)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}, nil)
		switch {
		case err == nil:
		case errors.Is(err, unix.ENOENT) && !a.ReadOnly:
			// The guest creates it in the writable share, as the user.
		case errors.Is(err, unix.ENOENT):
			return b.errorf(ErrConflict, "mount point %s lies in read-only %s, whose source has no directory %s: create it on the host or choose another destination",
				b.Destination, a.where(), path.Join(a.Resolved, rel))
		default:
			return b.errorf(errors.Join(ErrNotAllowed, err), "mount point %s lies in %s, and %s in its source is a symlink or not a directory (mount points are never looked up through symlinks): %v",
				b.Destination, a.where(), path.Join(a.Resolved, rel), err)
		}
	}
	return nil
}

// tree is a policy tree as configured and as resolved for the user.
type tree struct{ decl, real string }

// resolveTrees expands and resolves (as u) each tree; trees that do not
// exist or that u cannot reach are left out.
func resolveTrees(ctx context.Context, u User, trees []string) []tree {
	var out []tree
	for _, t := range trees {
		x, err := u.expand(t)
		if err != nil || !strings.HasPrefix(x, "/") {
			continue // Validate reports these
		}
		f, real, err := OpenAs(ctx, u.Cred(), x)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			out = append(out, tree{t, real})
		}
		f.Close()
	}
	return out
}

// treeList names the trees for a message: resolved paths, with the
// configured form where it differs ("/home/alice ($HOME)").
func treeList(ts []tree) string {
	if len(ts) == 0 {
		return "none configured or reachable"
	}
	var parts []string
	for _, t := range ts {
		if t.decl != t.real {
			parts = append(parts, t.real+" ("+t.decl+")")
		} else {
			parts = append(parts, t.real)
		}
	}
	return strings.Join(parts, ", ")
}

// NineP returns the 9p exports of the table's shares, in mount order, with
// tags "smv0", "smv1", ... and paths ProcFDPath(firstFD+i), and the files
// to hand to QEMU so that share i is its descriptor firstFD+i (with
// exec.Cmd, put them in ExtraFiles starting at index firstFD-3). Read-only
// shares get readonly=on; security_model=none, which is safe only because
// QEMU runs with the job's exact uid, gid and groups (launcher/qemu refuses
// shares otherwise).
func (t *Table) NineP(firstFD int) ([]NineP, []*os.File) {
	var out []NineP
	var files []*os.File
	for i, s := range t.Shares {
		tag := "smv" + strconv.Itoa(i)
		out = append(out, NineP{ID: tag, Tag: tag, Path: ProcFDPath(firstFD + i), ReadOnly: s.ReadOnly, SecurityModel: SecurityNone})
		files = append(files, s.File)
	}
	return out, files
}

// String renders the table for people, one share per line:
// destination, mode, origin, source -> resolved, filesystem.
func (t *Table) String() string {
	var b strings.Builder
	for _, s := range t.Shares {
		mode := "rw"
		if s.ReadOnly {
			mode = "ro"
		}
		fmt.Fprintf(&b, "%-24s %s  %-7s %s", s.Destination, mode, s.Origin, s.Source)
		if s.Resolved != s.Source {
			fmt.Fprintf(&b, " -> %s", s.Resolved)
		}
		fmt.Fprintf(&b, "  [%s on %s]\n", s.FS.Type, s.FS.Mountpoint)
	}
	for _, e := range t.Skipped {
		fmt.Fprintf(&b, "%-24s skipped (optional, %s does not exist)\n", e.Destination, e.Source)
	}
	return b.String()
}
