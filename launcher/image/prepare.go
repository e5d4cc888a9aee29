package image

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/slurm-microvm/slurm-microvm/launcher/image/auth"
)

// Options says whose image is prepared and where it is cached.
type Options struct {
	// UID, GID and Groups are the job user's credentials. Local paths are
	// read by a helper process running with exactly these, and the cache
	// is per UID.
	UID, GID uint32
	Groups   []uint32
	// CacheRoot holds one cache directory per uid (DefaultCacheRoot when
	// empty).
	CacheRoot string
	// Insecure allows plain http to a registry on a loopback address.
	Insecure bool
	// Auth says where the user's registry credentials are read, as the
	// user (package auth); the zero value reads the default locations in
	// the home directory the passwd database gives for UID.
	Auth auth.Env
	// Logger receives debug and info records (discarded when nil).
	Logger *slog.Logger
	// Helper is the command line of the helper child, before its
	// operation (see RunHelper). Default: this executable followed by
	// DefaultHelperArgs. Tests point it at their own binary.
	Helper []string
	// HelperEnv is added to the helper's (otherwise minimal) environment.
	HelperEnv []string
	// Compression is mkfs.erofs' -z argument ("lz4", "lz4hc", ...); empty
	// builds an uncompressed disk (fastest to build and to read).
	Compression string
	// MkfsErofs and Unsquashfs override the tools' paths (looked up in
	// PATH when empty).
	MkfsErofs, Unsquashfs string
	// Limits bound what a conversion writes (DefaultLimits() for zero
	// fields); passing one is ErrLimit.
	Limits Limits
}

// Config is the part of an OCI image config the guest needs to start a
// task. Empty for squashfs and directory images, which carry none.
type Config struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	User       string   `json:"user,omitempty"`
}

// Image is a prepared image: a read-only erofs disk holding the image's
// root filesystem, and its config.
type Image struct {
	Ref    string // what the user passed
	Kind   Kind
	Digest string // sha256:<hex>: the cache key (see doc.go for what it hashes per kind)
	Disk   string // path of the erofs disk in the cache, readable by root only
	Size   int64  // bytes of Disk
	Config Config
	Cached bool // the disk was already in the cache: nothing was converted
}

func (o Options) withDefaults() (Options, error) {
	if o.CacheRoot == "" {
		o.CacheRoot = DefaultCacheRoot
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if len(o.Helper) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return o, fmt.Errorf("find the launcher executable for the image helper: %w", err)
		}
		o.Helper = append([]string{exe}, DefaultHelperArgs...)
	}
	if o.MkfsErofs == "" {
		o.MkfsErofs = "mkfs.erofs"
	}
	if o.Unsquashfs == "" {
		o.Unsquashfs = "unsquashfs"
	}
	o.Limits = o.Limits.withDefaults()
	return o, nil
}

// Check validates ref quickly without converting anything: the reference's
// syntax; for a local path, that it exists, is readable by the user (o.UID;
// the calling process itself when it runs as that user, as `validate` does
// from srun) and is a complete image of a known kind; for a registry
// reference, that the registry knows it (an unreachable registry is only
// logged: the compute node may reach what the login node cannot).
func Check(ctx context.Context, ref string, o Options) error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	if !isLocal(ref) {
		// On the submit side (running as the user, in the user's
		// directory) a bare name that is also a file there is almost
		// surely meant as that file: refuse before the job is queued,
		// even when the registry cannot be reached from here.
		if os.Geteuid() == int(o.UID) {
			if _, serr := os.Lstat(ref); serr == nil {
				return newErr(ref, ErrInvalidRef, "this is read as a registry reference, but a file or directory of that name is here",
					fmt.Sprintf("to use the local image, write ./%s (a local image path is absolute or starts with ./ or ../)", ref), nil)
			}
		}
		return withRef(ref, checkRegistry(ctx, ref, o))
	}
	p, err := localPath(ref)
	if err != nil {
		return err
	}
	if os.Geteuid() == int(o.UID) {
		_, err = probePath(p, false)
	} else {
		_, err = o.probe(ctx, p, false)
	}
	return withRef(ref, err)
}

// Prepare returns the erofs disk of ref for o.UID, converting it on first
// use and caching it under CacheRoot/<uid>/. Concurrent calls for the same
// image (in any process) convert it once; the others wait and reuse it.
// Errors are *Error (test with errors.Is against ErrNotFound, ErrPermission,
// ErrCorrupt, ErrUnsupported, ErrInvalidRef, ErrChanged, ErrRegistry,
// ErrLimit), or a wrapped error of the host (disk full, tools missing).
func Prepare(ctx context.Context, ref string, o Options) (*Image, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	var img *Image
	if isLocal(ref) {
		img, err = prepareLocal(ctx, ref, o)
	} else {
		img, err = prepareRegistry(ctx, ref, o)
	}
	if err != nil {
		return nil, withRef(ref, err)
	}
	return img, nil
}

// source is what a converter needs: it fills work/rootfs, within b, and
// returns the config. It runs with the digest's lock held.
type source func(ctx context.Context, work, rootfs string, b budget) (Config, error)

// prepareCached is the cache protocol shared by every kind: look up, lock,
// look up again, convert into a work directory, build the disk, commit.
//
// need is what the image is expected to take in the cache (bytes; 0 when
// unknown): before converting, Prune makes that much room if it can.
func prepareCached(ctx context.Context, ref string, kind Kind, digest string, need int64, o Options, convert source) (*Image, error) {
	h, err := digestHex(digest)
	if err != nil {
		return nil, newErr(ref, errHelper, "bad digest", "", err)
	}
	var dir string
	hit := func() (*Image, bool) {
		m, disk, ok := lookup(dir, h)
		if !ok {
			return nil, false
		}
		fi, err := os.Stat(disk)
		if err != nil {
			return nil, false
		}
		o.Logger.Debug("image cache hit", "ref", ref, "digest", digest, "disk", disk)
		return &Image{Ref: ref, Kind: kind, Digest: digest, Disk: disk, Size: fi.Size(), Config: m.Config, Cached: true}, true
	}
	var lk *digestLock
	// A prune or `image rm` removes the user's directory once empty: one
	// removed between userDir and the lock file's creation is made again.
	for try := 0; ; try++ {
		if dir, err = userDir(o.CacheRoot, o.UID, true); err != nil {
			return nil, err
		}
		if try == 0 {
			if img, ok := hit(); ok {
				return img, nil
			}
		}
		lk, err = lockDigest(ctx, dir, h)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || try > 2 {
			return nil, err
		}
	}
	// Runs after the work directory is removed: a conversion that made no
	// disk takes its lock file with it.
	defer func() {
		if err := unlockDigest(lk, dir, h); err != nil {
			o.Logger.Warn("image cache", "err", err)
		}
	}()
	if img, ok := hit(); ok {
		return img, nil
	}
	// Make room: the least recently used images no step holds go first,
	// the user's past user_cache_mib and anyone's past cache_mib, for
	// about what this image will take (the size the probe saw).
	if pr, err := Prune(ctx, o.CacheRoot, PruneOptions{UID: o.UID, All: true, Limits: o.Limits, Logger: o.Logger, keep: h, need: need}); err != nil {
		o.Logger.Warn("prune the image cache before a conversion", "err", err)
	} else if len(pr.Removed) > 0 {
		o.Logger.Info("pruned the image cache", "images", len(pr.Removed), "freed_bytes", pr.FreedBytes)
	}
	start := time.Now()
	work, cfg, unpacked, err := o.convertInto(ctx, dir, h, ref, kind, digest, convert)
	if isCacheFull(err) {
		// The image needed more room than the probe's guess (its
		// unpacked tree, which the guess cannot see): every image no
		// step holds goes, least recently used first, and the
		// conversion runs once more. A second failure is the cache
		// being full of images in use, as its error says.
		o.Logger.Info("the image cache had no room for the conversion: pruning every image no step holds and converting again", "ref", ref, "err", err)
		if work != "" {
			_ = os.RemoveAll(work)
		}
		if _, perr := Prune(ctx, o.CacheRoot, PruneOptions{UID: o.UID, All: true, Limits: o.Limits, Logger: o.Logger, keep: h, need: max(o.Limits.UserCacheBytes, o.Limits.CacheBytes)}); perr != nil {
			o.Logger.Warn("prune the image cache for a conversion", "err", perr)
		}
		work, cfg, unpacked, err = o.convertInto(ctx, dir, h, ref, kind, digest, convert)
	}
	if work != "" {
		defer os.RemoveAll(work)
	}
	if err != nil {
		return nil, err
	}
	disk := filepath.Join(work, "disk.erofs")
	m := &cacheMeta{Version: metaVersion, Ref: ref, Kind: kind, Digest: digest, Config: cfg, Created: time.Now().UTC(), ConvertSeconds: time.Since(start).Seconds()}
	final, err := commit(dir, h, work, disk, m)
	if err != nil {
		return nil, fmt.Errorf("store image %s in the cache: %w", digest, err)
	}
	fi, err := os.Stat(final)
	if err != nil {
		return nil, err
	}
	// The disk may have come out larger than the probe's guess.
	if _, err := Prune(ctx, o.CacheRoot, PruneOptions{UID: o.UID, All: true, Limits: o.Limits, Logger: o.Logger, keep: h}); err != nil {
		o.Logger.Warn("prune the image cache after a conversion", "err", err)
	}
	o.Logger.Info("converted image", "ref", ref, "digest", digest, "disk", final, "bytes", fi.Size(),
		"unpack_s", unpacked.Seconds(), "total_s", time.Since(start).Seconds())
	return &Image{Ref: ref, Kind: kind, Digest: digest, Disk: final, Size: fi.Size(), Config: cfg}, nil
}

// convertInto converts the image into a new work directory of dir (the
// caller removes work, returned whenever it was made, also with an error):
// convert fills its rootfs within the cache's budget measured now, mkfs
// builds work/disk.erofs, and the tree is removed. unpacked is the time
// convert took. An error for which isCacheFull holds is the budget's.
func (o Options) convertInto(ctx context.Context, dir, h, ref string, kind Kind, digest string, convert source) (work string, cfg Config, unpacked time.Duration, err error) {
	b, err := newBudget(o.CacheRoot, o.UID, o.Limits)
	if err != nil {
		return "", Config{}, 0, err
	}
	start := time.Now()
	if work, err = newWorkDir(dir, h); err != nil {
		return "", Config{}, 0, err
	}
	rootfs := filepath.Join(work, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return work, Config{}, 0, err
	}
	o.Logger.Info("converting image", "ref", ref, "kind", kind, "digest", digest)
	if cfg, err = convert(ctx, work, rootfs, b); err != nil {
		return work, Config{}, 0, err
	}
	unpacked = time.Since(start)
	disk := filepath.Join(work, "disk.erofs")
	if err := o.mkfs(ctx, work, rootfs, disk); err != nil {
		return work, Config{}, 0, err
	}
	if fi, err := os.Stat(disk); err == nil && fi.Size() > b.space {
		return work, Config{}, 0, b.quotaErr()
	}
	if err := os.RemoveAll(rootfs); err != nil {
		return work, Config{}, 0, fmt.Errorf("remove unpacked image: %w", err)
	}
	return work, cfg, unpacked, nil
}

// mkfs builds the erofs disk from the unpacked tree. -x-1 stores no xattrs
// (the host's security labels must not leak into images); owners, modes and
// mtimes come from the tree.
func (o Options) mkfs(ctx context.Context, work, rootfs, disk string) error {
	tool, err := exec.LookPath(o.MkfsErofs)
	if err != nil {
		return fmt.Errorf("build erofs disk: %w (install erofs-utils)", err)
	}
	args := []string{tool, "--quiet", "-x-1"}
	if o.Compression != "" {
		args = append(args, "-z"+o.Compression)
	}
	args = append(args, disk, rootfs)
	out, err := o.runConfined(ctx, work, args)
	if err != nil {
		return fmt.Errorf("build erofs disk: %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func prepareLocal(ctx context.Context, ref string, o Options) (*Image, error) {
	p, err := localPath(ref)
	if err != nil {
		return nil, err
	}
	pr, err := o.probe(ctx, p, true)
	if err != nil {
		return nil, err
	}
	return prepareCached(ctx, ref, pr.Kind, pr.Digest, pr.Size, o, func(ctx context.Context, work, rootfs string, b budget) (Config, error) {
		// The helper runs as the user, who can make it send anything: what
		// it sends is bounded by what the probe saw and by the limits.
		if err := b.checkProbe(pr); err != nil {
			return Config{}, err
		}
		s, err := o.stream(ctx, p)
		if err != nil {
			return Config{}, err
		}
		var cfg Config
		switch pr.Kind {
		case KindRootfs:
			err = unpackTree(ctx, s, rootfs, pr, b, o)
		case KindSquashfs:
			var sq string
			sq, err = copyVerified(ctx, s, filepath.Join(work, "image.sqsh"), pr.Digest, pr.Size)
			if err == nil {
				err = s.finish(nil)
				s = nil
			}
			if err == nil {
				err = o.unsquash(ctx, work, sq, rootfs, b)
			}
		default: // docker archive, OCI archive, OCI layout (streamed as a tar)
			var tarPath string
			tarPath, err = copyVerified(ctx, s, filepath.Join(work, "image.tar"), "", pr.Size)
			if err == nil {
				err = s.finish(nil)
				s = nil
			}
			if err == nil {
				cfg, err = unpackArchive(ctx, tarPath, rootfs, pr.Digest, b, o)
				os.Remove(tarPath)
			}
		}
		if s != nil {
			err = s.finish(err)
		}
		return cfg, err
	})
}

// unpackTree extracts a root filesystem directory streamed by the helper,
// checking that the tree digest of what arrived is the one probed. The
// bytes and entries the probe counted bound the stream.
func unpackTree(ctx context.Context, s *helperStream, rootfs string, pr probeResult, b budget, o Options) error {
	x, err := newExtractor(rootfs, o.Logger)
	if err != nil {
		return err
	}
	defer x.Close()
	x.bytes = []*bound{probedBound(pr.Size, "bytes of files"), b.imageBound()}
	x.entries = []*bound{probedBound(pr.Entries, "entries"), b.entryBound()}
	th := newTreeHeaderHasher()
	if err := x.extractStream(ctx, s, th.add); err != nil {
		return err
	}
	if got := th.digest(); got != pr.Digest {
		return newErr("", ErrChanged, "the directory changed while it was read", "run again once it is no longer being written", nil)
	}
	return nil
}

// copyVerified copies the stream into a new root-owned file; when want is
// set, the sha256 of the bytes must be it. A stream longer than the probed
// size is refused (ErrChanged) as soon as it passes it.
func copyVerified(ctx context.Context, r io.Reader, dst, want string, probed int64) (string, error) {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, h), &boundedReader{ctx: ctx, r: r, b: probedBound(probed, "bytes")})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if keepErr(err) {
			return "", err
		}
		return "", fmt.Errorf("copy image: %w", err)
	}
	if want != "" && "sha256:"+hex.EncodeToString(h.Sum(nil)) != want {
		return "", newErr("", ErrChanged, "the file changed while it was read", "run again once it is no longer being written", nil)
	}
	return dst, nil
}

// unpackArchive flattens the image in the tar at tarPath (docker save, or
// an OCI layout as a tar) into rootfs and returns its config.
func unpackArchive(ctx context.Context, tarPath, rootfs, want string, b budget, o Options) (Config, error) {
	f, err := os.Open(tarPath)
	if err != nil {
		return Config{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Config{}, err
	}
	a, err := indexTar(f, fi.Size())
	if err != nil {
		return Config{}, err
	}
	info, err := a.inspect()
	if err != nil {
		return Config{}, err
	}
	if info.digest.String() != want {
		return Config{}, newErr("", ErrChanged, "the image changed while it was read", "run again once it is no longer being written", nil)
	}
	img, err := imageFromTar(tarPath, a, info)
	if err != nil {
		return Config{}, err
	}
	return unpackImage(ctx, img, rootfs, b, o)
}

// unpackImage applies img's layers into rootfs, oldest first (each layer
// checked against its diff_id, whiteouts applied, see extractor), within
// b: each layer's uncompressed stream, the bytes of files and the entries
// of all layers together.
func unpackImage(ctx context.Context, img v1.Image, rootfs string, b budget, o Options) (Config, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return Config{}, newErr("", ErrCorrupt, "cannot read the image config", "", err)
	}
	if _, ok := img.(verifiedImage); !ok {
		img = verifiedImage{Image: img, diffIDs: cf.RootFS.DiffIDs}
	}
	layers, err := img.Layers()
	if err != nil {
		return Config{}, classifyExtract(err)
	}
	x, err := newExtractor(rootfs, o.Logger)
	if err != nil {
		return Config{}, err
	}
	defer x.Close()
	x.layered = true
	x.bytes = []*bound{b.imageBound()}
	x.entries = []*bound{b.entryBound()}
	for i, l := range layers {
		if err := applyLayer(ctx, x, l, b.layerBound(i+1, len(layers))); err != nil {
			return Config{}, classifyExtract(err)
		}
	}
	if err := x.finish(); err != nil {
		return Config{}, err
	}
	c := cf.Config
	return Config{Env: c.Env, WorkingDir: c.WorkingDir, Entrypoint: c.Entrypoint, Cmd: c.Cmd, User: c.User}, nil
}

// applyLayer applies one layer, reading its uncompressed stream to the end:
// the diff_id is checked there, after the tar's trailer.
func applyLayer(ctx context.Context, x *extractor, l v1.Layer, lb *bound) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	r := &boundedReader{ctx: ctx, r: rc, b: lb}
	if err := x.applyLayer(ctx, r); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, r)
	return err
}

// classifyExtract keeps *Error as is and marks other failures of reading
// layers (mutate.Extract's "unsafe tar path", gzip errors) as corrupt.
func classifyExtract(err error) error {
	if keepErr(err) {
		return err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err
	}
	return newErr("", ErrCorrupt, "cannot unpack the image layers", "", err)
}

// unsquash extracts a squashfs file (already copied into the root-owned
// work directory) with unsquashfs confined to the work directory, and drops
// device nodes like the tar extractor does.
func (o Options) unsquash(ctx context.Context, work, sq, rootfs string, b budget) error {
	tool, err := exec.LookPath(o.Unsquashfs)
	if err != nil {
		return fmt.Errorf("unpack squashfs: %w (install squashfs-tools)", err)
	}
	if err := o.checkSquashfs(ctx, tool, work, sq, b); err != nil {
		return err
	}
	if err := os.Remove(rootfs); err != nil { // unsquashfs creates it
		return err
	}
	args := []string{tool, "-no-progress", "-quiet", "-no-xattrs", "-strict-errors", "-d", rootfs, sq}
	out, err := o.runConfined(ctx, work, args)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return err
		}
		return newErr("", ErrCorrupt, "unsquashfs failed: "+strings.TrimSpace(lastLines(string(out), 3)), "the squashfs file is damaged; rebuild it", err)
	}
	os.Remove(sq)
	return filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeDevice != 0 {
			o.Logger.Debug("skip device node", "name", strings.TrimPrefix(p, rootfs))
			return os.Remove(p)
		}
		return nil
	})
}

// checkSquashfs lists the squashfs file (unsquashfs -lln, confined like
// the extraction) and refuses it when its regular files' sizes or its
// entries pass b: unsquashfs writes what the listing shows, and a squashfs
// compresses a file of zeros to almost nothing. Hard links count once per
// name (more than unsquashfs writes).
func (o Options) checkSquashfs(ctx context.Context, tool, work, sq string, b budget) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd, err := o.confinedCmd(ctx, work, []string{tool, "-lln", "-no-progress", sq})
	if err != nil {
		return err
	}
	stderr := &tailBuffer{max: 16 << 10}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("list squashfs: %w", err)
	}
	bytes, entries := b.imageBound(), b.entryBound()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var lerr error
	for lerr == nil && sc.Scan() {
		// "-rw-r--r-- 0/0   1234 2024-01-01 12:00 squashfs-root/etc/passwd"
		f := strings.Fields(sc.Text())
		if len(f) < 3 || len(f[0]) != 10 || !strings.ContainsRune("-dlcbps", rune(f[0][0])) {
			continue // the rest of a name with a newline in it
		}
		if lerr = entries.add(1); lerr != nil || f[0][0] != '-' {
			continue
		}
		n, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil || n < 0 {
			lerr = newErr("", ErrCorrupt, "unsquashfs lists a file of size "+strconv.Quote(f[2]), "the squashfs file is damaged; rebuild it", nil)
			continue
		}
		lerr = bytes.add(n)
	}
	if lerr == nil && sc.Err() != nil {
		lerr = newErr("", ErrCorrupt, "cannot read the listing of the squashfs file", "the squashfs file is damaged; rebuild it", sc.Err())
	}
	if lerr != nil {
		cancel()
	}
	werr := cmd.Wait()
	if lerr != nil {
		return lerr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if werr != nil {
		if e, ok := decodeHelperError(stderr.b); ok {
			return e
		}
		return newErr("", ErrCorrupt, "unsquashfs cannot list the file: "+strings.TrimSpace(lastLines(string(stderr.b), 3)), "the squashfs file is damaged; rebuild it", werr)
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}
