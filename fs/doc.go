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
// user), not virtio-fs with QEMU 7.2's C virtiofsd. Measured side by side
// in one run by test/bench's BenchmarkShares (`make bench`; one variant:
// SMV_SHARE_BENCH_VARIANTS="9p msize=512000 cache=loose" go test -run XXX
// -bench BenchmarkShares -benchtime 1x ./test/bench/) on this project's
// machine: 2 cores shared with other jobs, TCG, -M microvm, 1 vCPU, 1.5 GiB
// guest; a 256 MiB file read in 1 MiB requests, 2,000 4 KiB files in 20
// directories opened, read and closed, the same tree listed and stat'ed,
// each as the guest's first pass (cold) and second (warm), and on a
// writable share a 64 MiB write with fsync and 500 files created. Host
// figures are the best of three passes from the page cache (the guest's
// first pass reads through that same cache): 6,600-8,500 MB/s read,
// 131,000-189,000 files/s, 317,000-561,000 stats/s, 500-570 MB/s write.
// Guest figures, the range over two runs (the noise between runs on this
// machine is up to 2x: the msize=512000 and 1 MiB rows are the same
// configuration), cold/warm:
//
//	                         read MB/s        files/s          stats/s           write MB/s
//	9p msize=131072 none     171-369/116-190   63-120/82-130   152-294/132-379      38-66
//	9p msize=512000 none     233-252/205-237  115-143/84-90    280-353/172-298      81-126
//	9p msize=1 MiB none (*)  379-412/321-449   77-99/70-110     83-269/241-247      75-115
//	9p 512000 loose (ro)      58-66/184-209   168-282/345-527  439-517/5416-6706     5-20
//	9p 512000 mmap (rw)      378-439/344-370   70-76/113-120   110-232/227-333     107-125
//	virtio-fs cache=none     463-545/409-639  107-151/118-149  276-332/260-302      90-106
//	virtio-fs cache=auto      55-83/66-68     198-215/179-230  697-942/678-1499     36-40
//	virtio-fs cache=always    54-81/193-203   182-191/263-264  629-1091/4554-4942   46-52
//	(*) the 6.1 kernel cuts msize to 512000 on virtio ((VIRTQUEUE_NUM-3) pages)
//
// As guest/host ratios, read-only data: 9p cache=none streams at 0.03-0.06
// of the host and opens small files at 0.0004-0.0011 of its rate;
// cache=loose streams at 0.007-0.010 and opens small files at
// 0.0009-0.0022 cold, 0.0018-0.0040 warm; it stats at 0.0008-0.0016 cold
// and 0.010-0.021 warm. Chosen per mount kind (guestpath.NinePOptionsReadOnly
// and guestpath.NinePOptions):
//   - read-only shares (and the GPU driver's share): msize=512000,
//     cache=loose. The small-file rate, by far the larger gap (0.001 of the
//     host against 0.04 for streaming), is 1.4-4.5x cache=none's cold and
//     2.7-7.5x warm; stat walks 1.2-6x cold, 14-50x warm (names and
//     attributes stay in the guest's dcache). It streams 2.6-7.6x slower
//     cold under TCG: the guest CPU copies every byte out of its page
//     cache, which TCG emulates (the warm pass, that copy alone, runs at
//     184-209 MB/s), where cache=none lets QEMU write straight into the
//     reader's buffer; with KVM that copy runs at memory speed (not
//     measured here: no KVM on this machine). Stale data is the price: the
//     guest does not revalidate what it cached, so a file or directory
//     changed on the host after the guest read it may be seen as it was
//     until the step ends (the kernel documents loose as "intended for
//     exclusive, read-only mounts"). Fine for datasets read during a step;
//     a tree another node writes meanwhile is mounted rw, which is
//     coherent. Writes stay impossible: whatever the guest's caches hold, a
//     change reaches the host only as a 9p request, and QEMU refuses every
//     modifying request of a readonly=on fsdev (opens for writing, creates,
//     setattr): EROFS for writes and chmod, also after a guest remount rw,
//     in every BenchmarkShares run and in TestShareMountOptions
//     (launcher/qemu).
//   - writable shares and the step's scratch: msize=512000, cache=mmap.
//     Reads and writes go to the host as with cache=none (coherent with
//     other writers; measured as fast, within the noise), and shared
//     writable mappings work (SQLite's WAL index, LMDB, numpy.memmap), which
//     cache=none refuses with EINVAL (TestShareMountOptions). Not loose:
//     it writes back page by page, 5-20 MB/s against 81-126 (6-21x slower),
//     and would hide other writers' changes. Scratch is private to the step
//     but written more than read, so it takes the writable options; a
//     separate kind for it would need the agent to tell scratch from a
//     user's rw mount for no measured gain.
//   - msize: 512000, the largest the guest kernel takes on virtio; 131072
//     (the kernel's default) needs 4x the requests per MiB and measured
//     lower (within the noise). 1 MiB and more are cut to 512000.
//   - cache=fscache is not offered: it needs a cachefiles store on a guest
//     disk and a daemon in the guest, and the disk would be one more host
//     file per step holding a copy of what the host's page cache holds;
//     loose is its in-memory part. No DAX: QEMU 7.2's vhost-user-fs device
//     has no cache-size (DAX window) property.
//
// virtio-fs measured no clear gain: cache=none streams 1.1-2.3x faster than
// 9p cache=none and mmap (no TCG copy either), but opens small files at the
// same rate; cache=auto/always open small files at 0.7-1.3x 9p loose's rate
// cold and 0.4-0.8x warm, stat 1.4-2.1x faster cold and slower warm
// (0.7-0.9x with always), and stream and write no faster. What decided it
// is enforcement on the host:
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
// Revisit with KVM figures and a virtiofsd that runs unprivileged with a
// read-only option (the Rust virtiofsd; this machine's Debian 12 apt
// sources have no virtiofsd package, only QEMU's C one).
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
