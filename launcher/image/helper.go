package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/slurm-microvm/slurm-microvm/launcher/image/auth"
	"golang.org/x/sys/unix"
)

// DefaultHelperArgs follow the executable on the default helper command
// line: the hidden CLI subcommand (`slurm-microvm image helper OP ARGS`) whose
// action is RunHelper.
var DefaultHelperArgs = []string{"image", "helper"}

// helperErrPrefix starts the one stderr line by which a helper reports a
// classified error to its parent.
const helperErrPrefix = "slurm-microvm-image-error "

// helperEnv is the whole environment of a helper child: nothing of root's
// environment reaches a process that runs as the user.
var helperEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}

// RunHelper is the child side of the helper, for the hidden CLI subcommand
// (and for tests, which re-execute their own binary). args is one of
//
//	probe PATH     detect, validate and digest PATH; print a JSON probeResult
//	check PATH     the same without the digest (Check on behalf of a user)
//	stream PATH    write PATH to stdout: a file's bytes, or a directory as a
//	               tar (an OCI layout: its regular files; a root filesystem:
//	               everything, as writeTreeTar does)
//	auth ENV REGISTRY REPO
//	               find the user's credential for REGISTRY/REPO in the
//	               sources of ENV (JSON of auth.Env); print a JSON auth.Result
//	confine DIR -- ARGV...
//	               (root, in a fresh mount namespace) make every mount
//	               read-only except DIR, then exec ARGV
//
// The parent runs probe, check, stream and auth with the job user's credentials,
// so PATH is opened with exactly the user's rights. It returns the exit
// status; a failure is one line on stderr that the parent decodes back into
// an *Error.
func RunHelper(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if err := runHelper(ctx, args, stdout); err != nil {
		writeHelperError(stderr, err)
		return 1
	}
	return 0
}

func runHelper(_ context.Context, args []string, stdout io.Writer) error {
	if len(args) < 2 {
		return fmt.Errorf("image helper: want OP ARG..., got %q", args)
	}
	switch args[0] {
	case "probe", "check":
		r, err := probePath(args[1], args[0] == "probe")
		if err != nil {
			return err
		}
		return json.NewEncoder(stdout).Encode(r)
	case "stream":
		return streamPath(args[1], stdout)
	case "auth":
		if len(args) != 4 {
			return fmt.Errorf("image helper auth: want ENV REGISTRY REPO, got %d arguments", len(args)-1)
		}
		var env auth.Env
		if err := json.Unmarshal([]byte(args[1]), &env); err != nil {
			return fmt.Errorf("image helper auth: bad ENV: %w", err)
		}
		// A home directory that cannot be looked up is in res.Tried.
		res, _ := auth.Lookup(env, args[2], args[3])
		return json.NewEncoder(stdout).Encode(res)
	case "confine":
		if len(args) < 4 || args[2] != "--" {
			return fmt.Errorf("image helper confine: want DIR -- ARGV..., got %q", args[1:])
		}
		return confineExec(args[1], args[3:])
	}
	return fmt.Errorf("image helper: unknown operation %q", args[0])
}

// streamPath writes p to w: see RunHelper.
func streamPath(p string, w io.Writer) error {
	fi, err := os.Stat(p)
	if err != nil {
		return pathErr(p, err)
	}
	if fi.IsDir() {
		if _, err := os.Lstat(filepath.Join(p, "oci-layout")); err == nil {
			return writeLayoutTar(p, w)
		}
		_, err := writeTreeTar(p, w)
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return pathErr(p, err)
	}
	defer f.Close()
	// Root bounds the stream by the probed size whatever this sends; this
	// only makes the honest case's error clearer.
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return newErr("", ErrChanged, "the image is no longer a regular file", "run again once it is no longer being replaced", err)
	}
	if _, err := io.Copy(w, f); err != nil {
		return pathErr(p, err)
	}
	return nil
}

// walkLayout calls fn for each member of the tar that writeLayoutTar makes
// of an OCI layout directory, with its tar name: directories (never
// entered through a symlink) and regular files (symlinks to them followed,
// as the user). The stream and its bound (layoutStreamBound) share this
// walk, so the bound always covers what is streamed.
func walkLayout(dir string, fn func(full, name string, fi fs.FileInfo) error) error {
	return filepath.WalkDir(dir, func(full string, d fs.DirEntry, err error) error {
		if err != nil {
			return pathErr(full, err)
		}
		rel, err := filepath.Rel(dir, full)
		if err != nil || rel == "." {
			return err
		}
		fi, err := os.Stat(full)
		if err != nil {
			return pathErr(full, err)
		}
		switch {
		case fi.IsDir():
			if d.Type()&fs.ModeSymlink != 0 {
				return nil // WalkDir does not descend; do not half-copy
			}
		case !fi.Mode().IsRegular():
			return nil
		}
		return fn(full, filepath.ToSlash(rel), fi)
	})
}

// writeLayoutTar writes the directories and regular files of an OCI layout
// directory (symlinks to regular files are followed, as the user) as a tar.
func writeLayoutTar(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := walkLayout(dir, func(full, name string, fi fs.FileInfo) error {
		if fi.IsDir() {
			return tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: 0o755, Format: tar.FormatPAX})
		}
		f, err := os.Open(full)
		if err != nil {
			return pathErr(full, err)
		}
		defer f.Close()
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: fi.Size(), Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
			return pathErr(full, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// layoutStreamBound returns the most bytes the tar of writeLayoutTar can
// have for dir: per member a header block, a PAX header block and records
// (the name, the size), the data rounded up to blocks; two zero blocks at
// the end.
func layoutStreamBound(dir string) (int64, error) {
	blocks := func(n int64) int64 { return (n + 511) / 512 * 512 }
	total := int64(1024)
	err := walkLayout(dir, func(_, name string, fi fs.FileInfo) error {
		total += 1024 + blocks(int64(len(name))+128)
		if fi.Mode().IsRegular() {
			total += blocks(fi.Size())
		}
		return nil
	})
	return total, err
}

// confineExec runs in a private mount namespace (the parent unshared it):
// it makes every mount read-only except DIR and executes argv, so that a
// path-traversal bug in a tool handling untrusted data (unsquashfs,
// mkfs.erofs) cannot write outside DIR even though it runs as root.
func confineExec(dir string, argv []string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("confine: bind %s: %w", dir, err)
	}
	err := unix.MountSetattr(unix.AT_FDCWD, "/", unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY})
	switch {
	case err == nil:
		err = unix.MountSetattr(unix.AT_FDCWD, dir, unix.AT_RECURSIVE, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY})
	case errors.Is(err, unix.ENOSYS):
		// Kernels before 5.12: remount every mount read-only, one by one.
		err = remountAllReadOnly(dir)
	}
	if err != nil {
		return fmt.Errorf("confine: make mounts read-only: %w", err)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	return unix.Exec(path, argv, os.Environ())
}

func remountAllReadOnly(dir string) error {
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		var st unix.Statfs_t
		if err := unix.Statfs(m.Mountpoint, &st); err != nil {
			continue // hidden by another mount
		}
		keep := uintptr(st.Flags) & (unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME | unix.MS_NODIRATIME | unix.MS_RELATIME)
		flags := unix.MS_BIND | unix.MS_REMOUNT | keep
		if m.Mountpoint != dir {
			flags |= unix.MS_RDONLY
		}
		if err := unix.Mount("", m.Mountpoint, "", flags, ""); err != nil {
			return fmt.Errorf("remount %s: %w", m.Mountpoint, err)
		}
	}
	return nil
}

// helperError is the wire form of an *Error on the helper's stderr.
type helperError struct {
	Class  string `json:"class"`
	Detail string `json:"detail"`
	Hint   string `json:"hint,omitempty"`
	Cause  string `json:"cause,omitempty"`
}

var classNames = map[error]string{
	ErrNotFound:    "not-found",
	ErrPermission:  "permission",
	ErrCorrupt:     "corrupt",
	ErrUnsupported: "unsupported",
	ErrInvalidRef:  "invalid-ref",
	ErrChanged:     "changed",
	ErrRegistry:    "registry",
	ErrLimit:       "limit",
}

func writeHelperError(w io.Writer, err error) {
	he := helperError{Class: "other", Detail: err.Error()}
	var e *Error
	if errors.As(err, &e) {
		he = helperError{Class: classNames[e.Class], Detail: e.Detail, Hint: e.Hint}
		if e.Err != nil {
			he.Cause = e.Err.Error()
		}
	}
	b, _ := json.Marshal(he)
	fmt.Fprintf(w, "%s%s\n", helperErrPrefix, b)
}

// decodeHelperError finds the error line in a helper's stderr.
func decodeHelperError(stderr []byte) (*Error, bool) {
	for _, line := range bytes.Split(stderr, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte(helperErrPrefix))
		if !ok {
			continue
		}
		var he helperError
		if json.Unmarshal(rest, &he) != nil {
			continue
		}
		e := &Error{Class: ErrCorrupt, Detail: he.Detail, Hint: he.Hint}
		for c, n := range classNames {
			if n == he.Class {
				e.Class = c
			}
		}
		if he.Class == "other" {
			e.Class = errHelper
		}
		if he.Cause != "" {
			e.Err = errors.New(he.Cause)
		}
		return e, true
	}
	return nil, false
}

// errHelper classifies a helper failure that is not about the image
// (a bug or a broken installation).
var errHelper = errors.New("image helper failed")

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

// helperCmd builds the command line of a helper run. asUser runs it with
// the job user's uid, gid and groups (root required unless the caller is
// that user already).
func (o *Options) helperCmd(ctx context.Context, asUser bool, args ...string) (*exec.Cmd, *tailBuffer, error) {
	argv := append(append([]string{}, o.Helper...), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(append([]string{}, helperEnv...), o.HelperEnv...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	if asUser {
		euid := uint32(os.Geteuid())
		switch {
		case euid == 0:
			cmd.SysProcAttr.Credential = &syscall.Credential{Uid: o.UID, Gid: o.GID, Groups: o.Groups}
		case euid != o.UID:
			return nil, nil, newErr("", ErrPermission, fmt.Sprintf("reading an image as uid %d needs root (running as uid %d)", o.UID, euid), "run the launcher as root, or as the job's user", nil)
		}
	}
	stderr := &tailBuffer{max: 64 << 10}
	cmd.Stderr = stderr
	return cmd, stderr, nil
}

// helperResult turns a finished helper's wait error into the package's.
func helperResult(args []string, werr error, stderr *tailBuffer) error {
	if werr == nil {
		return nil
	}
	if e, ok := decodeHelperError(stderr.b); ok {
		return e
	}
	return newErr("", errHelper, fmt.Sprintf("helper %s failed: %s", strings.Join(args, " "), strings.TrimSpace(string(stderr.b))), "", werr)
}

// probe runs `helper probe|check PATH` as the job's user.
func (o *Options) probe(ctx context.Context, p string, digest bool) (probeResult, error) {
	op := "check"
	if digest {
		op = "probe"
	}
	cmd, stderr, err := o.helperCmd(ctx, true, op, p)
	if err != nil {
		return probeResult{}, err
	}
	out, werr := cmd.Output()
	if err := helperResult([]string{op, p}, werr, stderr); err != nil {
		return probeResult{}, err
	}
	var r probeResult
	if err := json.Unmarshal(out, &r); err != nil {
		return probeResult{}, newErr("", errHelper, "helper "+op+" printed bad JSON", "", err)
	}
	return r, nil
}

// helperStream is the stdout of `helper stream PATH` run as the job's user.
type helperStream struct {
	cmd    *exec.Cmd
	out    io.ReadCloser
	stderr *tailBuffer
	cancel context.CancelFunc
	args   []string
}

func (o *Options) stream(ctx context.Context, p string) (*helperStream, error) {
	ctx, cancel := context.WithCancel(ctx)
	cmd, stderr, err := o.helperCmd(ctx, true, "stream", p)
	if err != nil {
		cancel()
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, newErr("", errHelper, "cannot start the image helper", "", err)
	}
	return &helperStream{cmd: cmd, out: out, stderr: stderr, cancel: cancel, args: []string{"stream", p}}, nil
}

func (s *helperStream) Read(p []byte) (int, error) { return s.out.Read(p) }

// finish ends the child and returns the first error that explains the
// outcome: the child's own (e.g. a file it could not read), else the
// consumer's (consumeErr), else a failure of the child without a message.
// When the consumer stopped early the child is killed.
func (s *helperStream) finish(consumeErr error) error {
	if consumeErr == nil {
		// Let the child finish writing (a tar has trailing padding), but
		// never wait for more than a little: a stream is not endless.
		if n, _ := io.CopyN(io.Discard, s.out, 1<<20); n == 1<<20 {
			s.cancel()
			consumeErr = newErr("", ErrCorrupt, "the stream goes on after its end", "", nil)
		}
	} else {
		s.cancel()
	}
	werr := s.cmd.Wait()
	s.cancel()
	if werr != nil {
		if e, ok := decodeHelperError(s.stderr.b); ok {
			return e
		}
	}
	if consumeErr != nil {
		return consumeErr
	}
	return helperResult(s.args, werr, s.stderr)
}

// runConfined runs argv (a host tool working on untrusted data in dir) as
// root in a mount namespace where everything but dir is read-only; when not
// root there is nothing to protect from the tool and it runs directly. It
// returns the tool's combined output for error messages.
func (o *Options) runConfined(ctx context.Context, dir string, argv []string) ([]byte, error) {
	out := &tailBuffer{max: 16 << 10}
	cmd, err := o.confinedCmd(ctx, dir, argv)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Run()
	if err != nil {
		if e, ok := decodeHelperError(out.b); ok {
			return out.b, e
		}
	}
	return out.b, err
}

// confinedCmd is the command runConfined runs, for callers that read its
// output as it comes.
func (o *Options) confinedCmd(ctx context.Context, dir string, argv []string) (*exec.Cmd, error) {
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		c, _, err := o.helperCmd(ctx, false, append([]string{"confine", dir, "--"}, argv...)...)
		if err != nil {
			return nil, err
		}
		c.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
		cmd = c
	} else {
		cmd = exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = helperEnv
	}
	cmd.Dir = dir
	return cmd, nil
}
