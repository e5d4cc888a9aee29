// Package fs decides which host paths a step's microVM sees and prepares
// them for sharing, enforcing everything on the host: one parser for every
// mount spec, the admin's mount policy, opening sources with the job
// user's credentials, filesystem classification, the per-step scratch
// directory, and the QEMU / file-server command-line pieces. The guest half
// (where a destination lands inside the image) is fs/guestpath.
//
//	p := cfg.Mounts                                   // fs.Policy, [mounts] of microvm.toml
//	errs := p.Validate()                              // config check: *PolicyError per key
//	u, _ := fs.LookupUser(spec.UID, spec.GID, spec.Groups)
//	t, err := p.Resolve(ctx, fs.Request{User: u, Mounts: spec.Mounts, Step: id.String()})
//	// err: *SpecError, e.g. `--microvm-mounts: destination "data" must be absolute (entry 2 of "/a:/b,/c:data")`
//	shares, files := t.NineP(3 + len(otherExtraFiles)) // -fsdev/-device pairs, fds to inherit
//	...start QEMU with files as ExtraFiles, then t.Close()
//	p.RemoveScratch(id.String())                      // at stop (gc: p.RemoveJobScratch(job))
//
// # Spec syntax
//
//	SRC[:DST[:FLAGS]][,SRC[:DST[:FLAGS]]...]     --microvm-mounts, SLURM_MICROVM_MOUNTS, mounts.site
//
// SRC and DST are absolute; DST defaults to SRC (as in pyxis). FLAGS joins
// with '+' (as pyxis does) any of ro (default), rw and optional (skip the
// entry when SRC does not exist). nosuid and nodev always apply and are not
// flags. Inside a path '\,' is a comma, '\:' a colon and '\\' a backslash;
// spaces need no escape (only the shell's quoting). A NUL, newline or
// carriage return is refused anywhere. Errors are *SpecError values naming
// the origin, the rule and the entry. Format writes the canonical form
// (SRC:DST:ro|rw[+optional]); Parse(Format(m)) == m.
//
// # Design decisions (each with the alternative and why not)
//
// Backslash escapes, not a long form. The value travels through srun
// options, an environment variable and TOML strings; one grammar with three
// escapes works in all three with no quoting state. A Docker-style long form
// (src=...,dst=...) still needs CSV quoting for a ',' in a path, and two
// grammars for one option invite a path that means different things in
// each. Any other backslash sequence is an error, so a path is never split,
// shortened or altered silently ("/data,readonly=off:/d" is two entries and
// fails on the second; "/data\,readonly=off:/d" is one path).
//
// Read-only by default. pyxis binds rw by default, but here the guest is
// untrusted and a writable host tree is the one thing it can damage; rw is
// asked for per entry and allowed only inside mounts.writable trees.
//
// Allowed trees are compared by path components on resolved paths. A
// source is first opened as the user following symlinks and ".." the way
// the kernel does (openat2 RESOLVE_NO_MAGICLINKS), its real path read back
// from /proc/self/fd, matched against the allowed trees (resolved the same
// way, as the user), then opened again below that tree with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS and required to be the same inode.
// So /lustre2 is not under /lustre, /lustre/x/../../etc is refused, a
// symlink out of the trees is refused, and a symlink swapped in between
// is caught. Alternatives: RESOLVE_BENEATH on the path as written refuses
// every absolute symlink, including /lustre/proj -> /lustre/fs2/proj and
// links into another allowed tree, which HPC sites have everywhere; a
// lexical path.Clean check treats "link/.." differently from the kernel.
// Site mounts are the admin's and are not limited to the allowed trees, but
// are opened as the user too.
//
// Files the agent writes are refused destinations. The agent writes the
// step's host name into /etc/hosts after the shares are mounted (a share
// mounted later would hide the write), so /etc/hosts and anything above it
// (/etc) are refused at Plan, that is at `validate` before queueing and in
// `mounts`, naming the file; /etc/myapp is fine. Alternative: write
// /etc/hosts before mounting the shares, or skip the write into a share:
// the step would then resolve its own host name from whatever the user's
// tree holds (MPI start-up needs it), and a read-only share would still
// fail a later write; a share over all of /etc also hides the image's
// passwd and ld.so.cache, which is rarely what a user means.
//
// Hiding. Mounts apply parent-first (by depth, then by path). Two entries
// with one destination collapse when identical and are an error otherwise.
// A user mount at or below a site mount's destination is an error: it would
// hide part of what the site promises every step. Everything else may
// nest (a site mount below a user mount, anything below scratch or a user
// mount): the deeper mount is mounted later and covers that part of the
// other. A mount point inside a read-only share must already exist in that
// share's source (the guest cannot create it there); Resolve looks it up
// below the opened source, as the user, without following symlinks, and
// names the directory to create otherwise. Alternative: forbid nesting;
// it would refuse common layouts (site /lustre/datasets under a user's
// /lustre).
//
// Credentials: a locked OS thread with per-thread setfsuid, setfsgid and
// setgroups (raw system calls), not a helper child. The launcher must end
// up holding the opened directory to hand it to QEMU; a helper running as
// the user (launcher/image's choice for streaming image bytes) would have to
// pass descriptors back over SCM_RIGHTS through a re-executed binary. The
// thread approach is sound in Go because a locked thread runs only its
// goroutine, threads created meanwhile are cloned from the runtime's
// template thread (not from the locked one), and a thread whose
// credentials cannot be restored is not unlocked, so the runtime destroys
// it; Go's own syscall.Setgroups/Setfsuid wrappers are process-wide (all
// threads) since Go 1.16 and are not used. Only lookups, opens, fstat and
// faccessat2 run under the user's credentials; TestOpenAsThreadCredentials
// opens a root-only directory as root on other threads while the user's
// opens run and checks neither leaks. The shared descriptor is opened
// O_RDONLY|O_DIRECTORY, not O_PATH: O_PATH needs no permission on the
// directory itself, and a directory only root can read would be shared.
//
// Root-squashed NFS (not testable here: no NFS server can run on this
// machine). The user's own opens work on a root-squashed export, because
// the kernel sends the user's uid; QEMU runs as the job user from its
// first instruction (launcher/qemu: executed with the job's uid, gid and
// groups, not dropped with -runas), so its open of the 9p root
// (open("/proc/self/fd/N", O_DIRECTORY)) and every request after it reach
// the server as the user too. Scratch on such an export cannot be created
// by root at all (scratch_base must be local or not root-squashed).
//
// Guest root and shares. security_model=none makes QEMU apply the guest's
// chown, chmod (setuid and setgid bits included) and mknod with its own
// credentials. QEMU runs with exactly the identity the mount check opened
// the shares with, so a guest root gets EPERM for chown to another uid and
// for device nodes, and can set setuid/setgid only to the job's own uid
// and groups, as the user could on the host (TestGuestRootInShare,
// launcher/qemu). A root QEMU would make all of them root's, and would
// read past every permission inside read-only shares: launcher/qemu refuses
// every share (scratch and the MPI share included) unless QEMU runs as the
// job's user, and config refuses qemu.runas = false while shares are
// possible. Not mapped-xattr (root QEMU, modes kept in xattrs): the host
// would see every file 0600/0700 and a root VMM, and the user's host tools
// would disagree with the guest about modes.
//
// Share count. Each share is one virtio device: a step takes at most
// launcher/qemu's MaxSharesMicrovm (20: 23 usable slots, measured, less the
// root disk, the control channel and the network device) shares on -M microvm,
// counted by `validate` at submit and by config for site mounts, scratch
// and the MPI share together.
//
// What is shared is the opened object. Table.NineP gives QEMU
// path=/proc/self/fd/N of the inherited descriptor, never the user's path:
// QEMU's local 9p backend opens its root once and works relative to that
// descriptor with O_NOFOLLOW afterwards, so renaming or replacing the path
// after Resolve changes nothing (TestResolveSharesTheOpenedObject), and no
// user string reaches the QEMU command line at all. QEMUValue (',' doubled,
// NUL and newline refused) still escapes every path that does reach it.
// virtiofsd's -o options have a second escaping language (libfuse's), so
// VirtiofsdArgs refuses ',' and '\' instead of escaping them.
//
// Sharing mechanism: 9p through QEMU (-fsdev local, security_model=none,
// readonly=on for ro shares, multidevs=remap, QEMU running as the job
// user), not virtio-fs with QEMU 7.2's C virtiofsd. Measured by
// TestShareBench (SMV_SHARE_BENCH=1 go test -run TestShareBench -v ./fs/)
// on this project's machine: 2 shared cores, TCG, -M microvm, 1 vCPU,
// 1.5 GiB guest; a 512 MiB file read in 1 MiB requests; 10,000 4 KiB files
// in 100 directories, listed and read. Host figures are the best of three
// passes from the page cache, guest figures the guest's first pass, which
// reads through that same cache. One run (the third of three), guest/host
// ratio, and the range over the three runs:
//
//	                           512 MiB read                 10,000 small files
//	host                       19019 MB/s                   131119 files/s
//	9p cache=none  (chosen)     1192 MB/s 0.063 (1117-1218)    266/s 0.0020 (220-266)
//	9p cache=loose                91 MB/s 0.005 (91-118)       358/s 0.0027 (254-423)
//	9p passthrough cache=none   1317 MB/s 0.069 (941-1317)     333/s 0.0025 (192-333)
//	virtio-fs cache=auto          98 MB/s 0.005 (90-117)       454/s 0.0035 (386-548)
//	virtio-fs cache=none        1723 MB/s 0.091 (1269-1723)    292/s 0.0022 (255-316)
//
// Under TCG every path that makes the guest CPU copy data (the guest page
// cache: 9p loose, virtio-fs auto) is ten times slower for streaming; with
// no guest cache QEMU or virtiofsd writes into the guest's buffer directly.
// virtio-fs (cache=none) streams 1.0-1.4x faster than 9p and walks small
// files 1.1-1.3x faster (1.7-2.3x with cache=auto, which streams ten times
// slower); the ratios against the host are small either way under
// emulation, and must be measured again under KVM (where published
// measurements favour virtio-fs more) before this is revisited. What
// decided it is enforcement on the host:
//   - read-only: 9p readonly=on is refused by QEMU at the protocol level,
//     for the whole tree including submounts of the source; a guest root
//     that remounts the share rw still gets EROFS for writes and chmod
//     (measured in every run, for the share and for a tmpfs mounted inside
//     the source). virtiofsd 7.2 has no read-only option: it needs a
//     recursive read-only bind in a private mount namespace (a plain
//     "mount --bind -o ro" leaves submounts writable), per share, per step;
//   - identity: QEMU's 9p server runs as the job user (executed with the
//     job's uid, gid and groups; security_model=none: the guest's chown to
//     another uid fails as it would for the user), so the guest's root
//     reaches exactly what the user can, and files it creates belong to
//     the user; the C virtiofsd must run as root and switches its
//     fs credentials to the uid the guest sends, so guest root is host root
//     on a writable share unless it is wrapped in a user namespace;
//   - moving parts: no extra daemon per share, no socket, no shared-memory
//     guest RAM (memory-backend-memfd,share=on maps all guest memory into
//     the daemon), no -global virtio-mmio.force-legacy=false.
//
// 9p cache=none over cache=loose: coherent with the host (other nodes write
// the same Lustre/GPFS files) and fastest for streaming here; loose helps
// small-file trees read more than once (646-775 vs 203-297 files/s on the
// second pass). guestpath.NinePOptions holds the guest's mount options.
//
// Filesystem awareness. ClassifyFile reads the mount id of the opened
// source from /proc/self/fdinfo and finds it in mountinfo
// (moby/sys/mountinfo): exact even for hidden or renamed paths; ClassifyPath
// (deepest mountpoint by components, top of a stack wins) is the fallback
// and what tests feed with fake mountinfo. Lustre, GPFS, NFS, BeeGFS, CephFS
// and the other network or parallel filesystems (and FUSE) are shared
// directly and never used as an overlay layer or image store:
// CheckLocalStore refuses such a cache_dir.
//
// Scratch. <scratch_base>/<job>.<step>.<restart>, created by root with
// mkdirat/fchownat relative to the opened base (never a name resolved
// twice), mode 0700, owned by the user, mounted rw at scratch_destination,
// removed at stop (os.RemoveAll never follows symlinks) unless keep_scratch.
// The base must be root-owned and writable by root only: in a base users
// can write, one could plant a symlink under another step's name. A
// launcher not run as root (a user's `slurm-microvm run`) makes scratch only
// for itself, in a base of its own below its private 0700 run directory;
// the node's root-owned base is not the user's to write.
//
// Left open: single-file mounts (a 9p share is a directory; sharing the
// parent would expose its siblings), and KVM measurements.
package fs
