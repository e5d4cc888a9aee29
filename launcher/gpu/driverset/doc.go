// Package driverset finds the node's installed NVIDIA driver as a guest
// needs it and copies it into an immutable cache entry that the launcher
// shares read-only into GPU steps' microVMs:
//
//	cache := "/var/cache/slurm-microvm/drivers"
//	s, cached, err := driverset.DiscoverCached(ctx, driverset.Options{Root: "/", KernelRelease: guestRelease}, cache)
//	// errors.Is(err, driverset.ErrNoDriver): a GPU step on this node fails before boot with err
//	log.Info("driver set", "set", s.Summary(), "notes", s.Notes)
//	b, err := driverset.Build(ctx, s, cache)
//	release, err := driverset.Use(ctx, b) // held for the step's life: pruning skips b
//	// errors.Is(err, driverset.ErrPruned): another step's Build pruned b meanwhile; Build again
//	defer release()
//	// guest: insmod b.Modules in order with their Params, firmware_class.path=<share>/b.FirmwareDir,
//	// b.LibDir ahead of the image's libraries, b.BinDir on PATH
//
// What a set is made of, all read under Root ("/", or a driver
// container's root such as the GPU Operator's /run/nvidia/driver):
//
//   - kernel modules: Root/lib/modules/<release>/modules.dep, the files
//     whose name holds "nvidia" read for their ELF .modinfo; the asked
//     modules (DefaultModules: nvidia, nvidia_uvm) by modinfo name, their
//     modules.dep dependencies first. vermagic must name the guest's
//     release; every NVIDIA module must carry nvidia's version.
//   - firmware: each modinfo firmware= entry, searched where the kernel
//     searches (lib/firmware/updates/<release>, lib/firmware/updates,
//     lib/firmware/<release>, lib/firmware; plain, then .zst, then .xz);
//     without declarations, every file of lib/firmware/nvidia/<version>.
//     The open modules need it (GSP on every GPU): missing is an error;
//     for the proprietary ones a Note (Hopper and later need it).
//   - libraries: the compute and utility set of NVIDIA's container
//     toolkit (Libraries) found through Root/etc/ld.so.cache, each the
//     file of exactly the modules' version; libcuda and libnvidia-ml are
//     required, others of another version are left out with a Note.
//   - tools: Binaries from the usual bin directories (nvidia-smi missing
//     is a Note).
//
// # Design decisions (each with the alternative and why not)
//
// Module names from .modinfo, read with debug/elf. modules.dep names
// files, and Debian's DKMS renames them (nvidia-current.ko is the module
// "nvidia"), so a file name says nothing certain. Running modinfo(8)
// instead would exec a host tool per module, find nothing in a driver
// container's root unless told its module directory, and parse output
// meant for people; the section is a list of NUL-separated key=value
// strings (include/linux/moduleparam.h) that debug/elf hands over.
//
// Decompression here, with the libraries launcher/assets uses
// (therootcompany/xz, klauspost/compress/zstd, compress/gzip), not its
// helper: assets' readModule is unexported and reads by path (following
// links out of a driver root), and the boot-set code in assets is where
// the driver set's modules will be consumed, so importing assets from
// here would invite an import cycle. Modules are stored decompressed:
// the guest loads them with finit_module whatever its kernel's
// CONFIG_MODULE_DECOMPRESS, and a module signature, computed over the
// uncompressed object before compression, stays valid.
//
// ld.so.cache parsed here (ldcache.go) rather than `ldconfig -p` or a
// directory scan. `ldconfig -p` of another root needs -r, which chroots
// (root only) and runs the host's glibc tool over a foreign tree; a
// directory scan would hard-code library paths that differ between
// distributions (/usr/lib64, /usr/lib/x86_64-linux-gnu, .../nvidia/current)
// and miss the site's ld.so.conf.d. The cache is what the dynamic linker
// itself reads, and what libnvidia-container uses. The parser checks
// every count and offset against the data and is fuzzed
// (FuzzParseLDCache); its tests compare it with `ldconfig -p` over caches
// the real ldconfig wrote, in the new and the compat layouts.
//
// Symbolic links resolved inside Root by this package, then every file
// opened one component at a time with O_NOFOLLOW (rootfs.go). Absolute
// targets are re-rooted, relative ones climb from the link's directory,
// a ".." above Root is an error that names the link, and at most 40 links
// are followed (Linux's MAXSYMLINKS). The open repeats no resolution, so
// a link put in place after it fails the open. Alternatives:
// filepath.EvalSymlinks follows links out of Root (a driver container's
// /usr/lib/libcuda.so.1 -> /usr/lib/... would read the host's); openat2
// with RESOLVE_IN_ROOT needs Linux 5.6 (RHEL 8's 4.18 lacks it) and clamps
// ".." at the root silently, where an escaping link in a driver tree is a
// fault worth naming.
//
// The user-space driver matched by the version in its real file's name
// (libcuda.so.550.54.15, the name NVIDIA's installer and packages give
// every library of a driver), rather than by reading each library's
// contents, which carry no version note. A mismatch is the classic
// "CUDA driver version is insufficient": refused for libcuda and
// libnvidia-ml, left out with a Note for the optional ones.
//
// Every Discover error wraps ErrNoDriver, configuration mistakes (a
// parameter for a module not loaded) included: for the launcher each
// means that no driver set can be built for a GPU step on this node, and
// the text says which input to change.
//
// Cache keys from file identity (path, size, mtime in ns, inode, device)
// plus the release and module parameters, not from content: hashing the
// ~1 GiB of a driver would cost seconds on every step, while a package
// manager or installer that replaces a file gives it a new inode and
// mtime. LoadedVersion and Notes stay out of the key (loading the driver
// does not change the files); set.json records the set as first built.
//
// Hard links when the source is a root-owned regular file, not writable
// by group or others, of exactly the entry's mode (0644; 0755 for tools),
// on the cache's file system; copies otherwise. Linking saves a
// driver's size per entry and is safe: only root can change such a file,
// and root can change the cache anyway. The link is made from the open
// descriptor (/proc/self/fd/N), so the inode hashed is the inode linked.
// Requiring the exact mode keeps the promise that every entry file is
// 0644/0755 whatever the source (NVIDIA's installer makes its libraries
// 0755: those are copied).
//
// Publication by renaming a finished cacheDir/.tmp-* directory, not a
// build lock held for the whole build: builders of different keys never
// wait for each other, a concurrent builder of the same key loses the
// rename and uses the winner's entry, and no reader ever sees half an
// entry. Each builder holds a flock on its own .tmp-* directory and
// creates it under cacheDir/.lock; the next builder, under the same lock,
// removes the .tmp-* nobody holds (a dead builder's).
//
// Pruning keeps the newest two entries and every entry held by Use: a
// shared flock on <entry>/.inuse, which a pruner's exclusive non-blocking
// flock cannot take. Alternatives: reference-count files (a crashed step
// leaves its count forever; a flock dies with its process), or no
// pruning (each driver update leaves ~1 GiB). An entry being pruned is
// first renamed to a .tmp-* name, so Build never finds it half removed,
// and Use checks that the .inuse it locked is still the entry's. A
// pruning failure does not fail the build: it is a Built.Notes line.
//
// Discovery remembered (DiscoverCached), not repeated at every step:
// reading the modules' .modinfo decompresses each NVIDIA .ko.xz in full
// (1-2 s for a real nvidia.ko, estimated from the xz rate here), and the
// launcher pays it before every GPU boot otherwise. The record,
// cacheDir/discovered-<options hash>.json, holds the identity (size,
// mtime, inode, device) of every file the set names, of modules.dep and
// ld.so.cache (depmod and ldconfig run at every driver installation), of
// every directory searched for firmware and tools (a new file changes its
// mtime), and the loaded driver's version by content. Any difference is a
// new discovery. Not an inotify watch (needs a daemon) and not a fixed
// lifetime (a driver upgrade would be missed until it passes). One record
// per distinct [gpu.driver] configuration, so they are not pruned.
package driverset
