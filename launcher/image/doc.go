// Package image turns what a user passed as --microvm=IMAGE into a cached,
// read-only erofs disk that the guest mounts as its root filesystem, plus
// the image config (env, entrypoint, cmd, working dir, user).
//
//	img, err := image.Prepare(ctx, "/home/u/pytorch.sqsh", image.Options{UID: 1000, GID: 1000})
//	// img.Disk = /var/cache/slurm-microvm/1000/<sha256 hex>.erofs
//	err = image.Check(ctx, ref, opts) // fast, no conversion: srun-side validation
//
// Sources, detected from content (never from the file name):
//
//	docker save tar         manifest.json (Docker 25+ also writes an OCI layout; that view wins)
//	OCI archive             tar holding oci-layout + index.json
//	OCI layout directory    a directory holding oci-layout
//	squashfs file           magic "hsqs" (what enroot makes)
//	root filesystem dir     any other non-empty directory
//	registry reference      docker://host[:port]/repo:tag, host/repo:tag, host#repo:tag, bare names
//
// Errors are *Error values whose Class is one of the Err* sentinels
// (errors.Is) and whose text names the input, what is wrong and the rule or
// fix: `image "/x/y.tar": no such file (a local image must be an existing
// OCI archive, OCI layout, squashfs file or root filesystem directory)`.
//
// # Design decisions (each with the alternative and why not)
//
// Local or registry. Pyxis' rule: a path is absolute or starts with ./ or
// ../; anything else is a registry reference. Not guessed from file
// existence or an extension: "ubuntu.sqsh" would mean different things in
// different directories, and an image called like a file would be pulled or
// not depending on the cwd.
//
// Reading user-named paths. The launcher is root; a path the user names is
// read by a helper child (the launcher binary re-executed as `image helper`,
// exec.Cmd with SysProcAttr.Credential = the job's uid, gid and groups, an
// empty environment, cwd /, Pdeathsig), whose stdout root consumes: the
// file's bytes, or a directory as a tar. The kernel does the permission
// check, with groups and ACLs, on every path component. Alternatives:
// access(2)/faccessat checks then open as root (a race: the user swaps a
// symlink between check and open); setfsuid(2) on a locked OS thread (Go
// may run other goroutines' syscalls on it, and a bug reads as root);
// checking modes by hand (misses ACLs, groups, and every directory above).
// The child runs as the user, who may ptrace it: everything it sends is
// treated as untrusted image content, which only ever lands in that user's
// own cache.
//
// Digests (the cache key), computed by the helper while probing, then
// recomputed by root from what it received (ErrChanged when they differ):
//   - OCI archive and layout: the image manifest's digest. Manifest and
//     config blobs are hashed on read, layer blobs while read, and every
//     layer's uncompressed bytes are checked against the config's
//     diff_ids, so the digest is a content address.
//   - docker save: the config digest (the image ID). The archive carries no
//     manifest; computing one means hashing every layer on every probe. The
//     config covers the diff_ids, which are verified while unpacking.
//   - registry: the manifest digest of the linux/GOARCH image (an index is
//     resolved), so a moved tag converts again; costs one HEAD/GET per
//     Prepare.
//   - squashfs: sha256 of the file (one sequential read of it).
//   - directory: sha256 over each entry's path, type, mode, uid, gid, size,
//     mtime (ns) and symlink target, in lexical order; like make, a change
//     of content that keeps size and mtime is not seen. Hashing contents
//     would read the whole tree on every job start.
//
// Archives are read in place. indexTar records each tar member's offset by
// seeking over data (a multi-GB archive indexes in milliseconds); an OCI
// archive's blobs are then read straight from the tar (ociTarImage), a
// docker save tar through tarball.Image. The alternative, unpacking an OCI
// archive to a directory and using layout.FromPath, doubles disk use and
// would have root follow symlinks planted among the blobs (a blob linked to
// /etc/shadow). An OCI layout directory is streamed as a tar of its regular
// files (the helper follows symlinks, as the user) and handled the same way.
//
// Applying layers: one after the other, oldest first, into one tree, with
// containerd's rules (archive.Apply; Docker's containerd image store uses
// the same): each member's parent path resolves through the symlinks that
// earlier layers (or earlier members) made, inside the root, so a base
// layer's bin -> usr/bin and a later layer's bin/x put x in usr/bin/x; an
// existing entry is replaced (a directory with everything below it) unless
// both are directories; a directory entry over a symlink that leads to a
// directory merges into it (containerd does so for "bin/" with its
// trailing slash; here without it too, rather than replace /bin of a
// merged-/usr image by an almost empty directory); .wh.NAME removes NAME,
// .wh..wh..opq removes what earlier layers put in its directory and keeps
// what its own layer adds, before or after the marker (tracked by parent
// inode and name, so aliases through symlinks agree); other .wh..wh.
// names (AUFS metadata) are skipped. The alternative used before,
// go-containerregistry's mutate.Extract, flattens newest layer first and
// drops what lies below a non-directory of a later layer: the base
// layer's bin symlink then met the bin/ directory its child had implied
// ("cannot replace"), so common images did not convert. Docker's
// overlay2 graph driver differs (a later layer's bin/ directory hides the
// symlink and everything it led to); containerd's rule is the one images
// are built and tested for today. Each layer's uncompressed stream is
// read to its end, after the tar trailer: the diff_id is checked there.
//
// Unpacking untrusted tars as root: each member's parent directory is
// opened with openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV)
// and the last component is created with *at calls and O_NOFOLLOW /
// AT_SYMLINK_NOFOLLOW; ".." names are refused. Symlinks in a path resolve
// inside the target the way the guest will see them (etc -> /etc puts
// etc/x at ROOT/etc/x; a symlink to a host directory /home/u/x leads to
// ROOT/home/u/x, made there when missing, as containerd's fs.RootPath
// does: the missing part of a path is found by resolving it lexically,
// symlink by symlink, inside the root; nothing else writes there, so it
// cannot change in between). os.Root was the alternative: it reports an
// absolute symlink in a path as an escape instead of resolving it inside
// the root, so images would unpack differently from how they run, and it
// has no lutimes or mknod. openat2 needs Linux 5.6. Owners, modes (setuid,
// sticky), nanosecond mtimes, hard links and fifos are kept; device nodes
// are skipped with a debug record (the guest's /dev is devtmpfs); xattrs
// are not restored (file capabilities such as ping's are lost) and
// mkfs.erofs runs with -x-1 so host security labels never reach an image.
//
// Limits (Options.Limits, microvm.toml [images]): whatever a user names
// makes root write into cache_dir, so every conversion is bounded: the
// unpacked bytes of files (all layers; a file a later layer writes again
// counts again, as `docker image ls` counts layers), each layer's
// uncompressed stream (a gzip or zstd bomb stops there), the entries (the
// inodes), and each user's cache (the disks of that uid). The helper runs
// as the user, who may swap the probed file for /dev/zero, a FIFO or a
// FUSE file, or ptrace the helper: the size the probe reported bounds the
// stream (a longer stream is ErrChanged the moment it passes it), the
// probe's counts bound a directory's stream, and the configured limits
// bound both, since the probe itself is the user's. A squashfs file is
// listed first (unsquashfs -lln, confined) and refused when its files'
// sizes or entries pass the limits: unsquashfs writes what it lists. An
// image the probe already shows too large is refused before any copy.
// Alternatives:
// a filesystem quota on cache_dir (not every node has project quotas, and
// one user would still fill the others' share); RLIMIT_FSIZE (per file
// only, and the extractor is the launcher itself). A conversion's stages
// (the copied file, the unpacked tree, the disk) are each bounded by the
// space left in the user's cache, not together: the peak is about twice
// the image. File data is copied in 1 MiB chunks with ctx checked between
// them, so cancelling stops one multi-gigabyte member promptly.
//
// Squashfs: the helper streams the file into a root-owned work file
// (hashing it), then unsquashfs extracts it as root. Root is needed for
// owners; unsquashfs has had path-traversal bugs (CVE-2021-40153,
// CVE-2021-41072, fixed in 4.5.1), so it runs confined: the helper's
// `confine` operation, in a fresh mount namespace, makes every mount
// read-only (mount_setattr AT_RECURSIVE; per-mount remount before Linux
// 5.12) except the work directory, then execs the tool. mkfs.erofs runs the
// same way. Alternatives: sqfs2tar (squashfs-tools-ng, not packaged here)
// into the tar extractor above would use one extraction path; handing the
// squashfs to the guest as a second disk avoids host parsing entirely but
// gives a slower root filesystem and needs squashfs and its decompressors
// in the initramfs; loop-mounting on the host has the host kernel parse an
// untrusted filesystem. squashfs keeps mtimes in whole seconds.
//
// Disk: mkfs.erofs (erofs-utils 1.5, which has no tar input) on the
// unpacked tree, uncompressed by default: fastest to build and to read
// (Options.Compression selects lz4/lz4hc). erofs beat the alternatives as a
// root filesystem when measured here (mkfs.erofs of a 200 MB Debian
// minbase: 0.9 s; README "Design decisions").
//
// Cache: CacheRoot/<uid>/<hex>.erofs + <hex>.json, per user, root-owned
// (dir 0700, files 0444): one user's private image is never usable by
// another's job, and users cannot read cached disks directly — the launcher
// (root) opens the disk; QEMU opens its drives before -runas drops
// privileges. Concurrent Prepare of one image (threads or processes)
// converts once: flock(2) on <hex>.lock (polled, so ctx cancels the wait),
// lookup again under the lock, convert in tmp-<hex>-<rand>/ on the same
// filesystem, fsync, rename the JSON then the disk (the disk's presence is
// the commit). Work directories left by a crash are removed by the next
// conversion of the same digest under its lock, and by CleanAbandoned,
// which `stop` and `gc` run: it removes every work directory whose digest
// lock it can take (a live conversion holds its lock; a killed one's lock
// died with its process).
//
// Lock files go with their disk: a conversion that makes no disk (refused
// for a limit, failed, cancelled) and `image rm` unlink <hex>.lock, and
// CleanAbandoned unlinks those no process holds whose digest has no disk.
// Otherwise every digest a user ever tries leaves a root-owned inode that
// no quota counts. Unlinking is race-free because only the holder unlinks,
// and every locker, after flock(2) succeeds, compares fstat of its fd with
// lstat of the path and starts again when they differ or the path is gone:
// a process that opened the file before the unlink then never holds the
// old inode's lock alongside one that created the new file. The
// alternative, keeping lock files forever (as before), is simpler but
// unbounded; one lock file per user directory would serialize all of a
// user's conversions.
//
// Pruning (Prune, `slurm-microvm image prune`): the cache has two limits,
// images.user_cache_mib per user and images.cache_mib for all users
// together (disks and their metadata; work directories of conversions in
// progress are bounded per conversion instead). Past a limit, the least
// recently used images go first, among those no running step uses.
//   - The use clock is the disk's mtime: a conversion sets it (commit) and
//     Use sets it to now at every step start. Alternatives: the atime
//     (relatime and noatime mounts make it unreliable), a stamp file per
//     image (one more file to keep consistent and to remove), a log of
//     uses (state to keep and to trim).
//   - In use means a shared flock(2) on the disk: the launcher takes it
//     with Use (Hold = Prepare + Use) before the VMM opens the disk and
//     keeps it until the step's supervisor exits; Prune takes the
//     digest's lock without waiting (a conversion or `image rm` holds
//     it) and then an exclusive non-blocking flock on the disk, and
//     skips the image when either is held. Use checks after its flock
//     that the path still names the locked inode, so a disk pruned
//     between Prepare and Use is ErrPruned and Hold prepares it again.
//     The alternative, reading each step's state directory for the disk
//     it booted, depends on records that a crashed launcher may leave
//     stale (keeping an image forever) or not yet have written (a step
//     starting); a lock dies with its holder. A launcher killed while
//     its VMM runs drops the lock: the VMM keeps its open file, so its
//     guest is unharmed, and the space is freed when it exits.
//   - Where it runs: Prepare, before converting, prunes for the room the
//     probe says the image needs (the user's images past user_cache_mib,
//     anyone's past cache_mib) and again after the commit (the disk may
//     be larger); the conversion is then bounded by what is left of both
//     limits (ErrLimit naming the key when in-use images fill it). The
//     probe's guess is the image's file; its unpacked tree can be many
//     times that (compressed layers, squashfs), so a conversion that runs
//     out of room prunes every image no step holds and runs once more:
//     converting twice costs only where the cache is full, where the
//     alternative, guessing the tree from the file, would either evict
//     too much on every conversion or still fail. The
//     epilog (`gc`) prunes the node's caches when past a limit, at most
//     1024 images within 20 s so it ends promptly; the systemd timer
//     etc/systemd/slurm-microvm-prune.timer prunes daily without bound.
//     Alternatives: only a timer (the cache overflows between runs),
//     only at conversion (a lowered limit waits for the next new image).
//   - `image rm` removes an image even in use (an administrator asked;
//     the running VMM keeps its open file). Removing a user's last image
//     removes the directory; a Prepare that found the directory just
//     before creates it again (lockDigest then meets ENOENT).
//
// Users and the node's cache: CacheRoot/<uid> stays root's 0700, so a
// user cannot list, read or remove their own images there. A non-root
// `image ls`/`image rm` act on the user's personal cache
// (~/.cache/slurm-microvm, what their own non-root `prepare` fills) and
// name the node cache directory and the commands an administrator runs
// (`sudo slurm-microvm image ls|rm --uid UID`); the quota error
// (ErrLimit on user_cache_mib) says the same. Alternatives: an ACL giving
// the uid r-x on its directory (as launcher/state grants --x) would let
// it list, but also open its 0444 disks and hold a removed disk's space
// past `image rm` while uncounted, and needs ACLs on cache_dir; a
// setuid or daemon-backed `image rm` is more privileged code for a rare
// need. An administrator frees the node cache.
//
// Registry credentials are the job user's own, read as that user
// (package auth: containers-auth.json, Docker's config.json, enroot's
// .credentials, in that order): the helper's `auth` operation runs with
// the user's uid, gid and groups and prints the credential on its stdout
// pipe to root, which sends it only to the registry of the reference the
// user named; without one the pull is anonymous. The credential is looked
// up once per Prepare or Check, before the first request, whether or not
// the registry asks for it. Alternatives: root's keychain
// (authn.DefaultKeychain) lends root's credentials to anyone naming a
// private image; opening the user's files as root follows a symlink the
// user planted to another user's file; looking up lazily, on the
// registry's 401, saves a helper run (a few ms) for public images but
// needs an authenticator that starts processes from inside the HTTP
// transport. The credential is never logged (its String and Format
// redact), never in an error (a refusal names the file it came from, and
// without one every file read and what it held), and never in the cache's
// JSON or the step's spec. Options.Insecure permits plain http
// only for loopback registries (go-containerregistry itself already uses
// http for localhost and RFC 1918 addresses).
//
// Check is what `validate` runs in srun, as the user: in-process when the
// caller is o.UID, through the helper otherwise. It never converts: a
// squashfs is checked by its superblock (truncation shows as bytes_used
// beyond the end), an archive by its tar headers and small blobs (not the
// layer contents: a tampered layer is found by Prepare), a directory by a
// metadata walk with access(R_OK) on every file, a registry reference by a
// HEAD request (an unreachable registry is a warning, not an error: the
// compute node may reach what the login node cannot).
//
// A root filesystem directory must be readable by the job's user in full;
// a tree made by debootstrap as root is not (/etc/shadow, /root): the error
// names the first unreadable file. Pack such a tree as a squashfs file or an
// OCI archive instead.
package image
