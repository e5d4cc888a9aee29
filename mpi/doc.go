// Package mpi decides whether a job step's image may run with the host's
// MPI stack instead of its own, and says how: discovery of MPI, UCX,
// libfabric, PMIx and glibc in a root filesystem, the ABI rules, and the
// injection plan. Package mpi/pmi rewrites the ranks' PMI environment for
// the VM boundary; mpi/mpitest builds and runs the MPI test program.
//
//	rep, err := mpi.Check(ctx, "/", imageRoot, mpi.CheckOptions{Mode: mpi.ModeFull, Program: "/opt/app/solver"})
//	if err := rep.Err(); err != nil { ... }   // errors.Is(err, mpi.ErrUnsafe / mpi.ErrNoImageMPI)
//	rep.Plan.Files   // host file -> guest dir + name, read-only share
//	rep.Plan.Environ(env)   // LD_LIBRARY_PATH=<guest>/lib:..., component paths
//
// `slurm-microvm mpi check --image IMG` (cmd/slurm-microvm/mpi.go) is
// CheckImage: the image is prepared by launcher/image as for a step, its
// erofs disk read in this process (OpenDisk, never mounted), and compared
// with the host.
//
// # The rules (sources in the docstrings of check.go and version.go)
//
//   - Families never mix: Open MPI (libmpi.so.40 defining
//     ompi_mpi_comm_world), the MPICH ABI (libmpi.so.12 / libmpich.so.12:
//     MPICH, Intel MPI, Cray MPICH, MVAPICH; MPICH ABI Compatibility
//     Initiative) and the MPI-5 standard ABI (libmpi_abi).
//   - Version rule of Sarus' MPI hook on the soname chain's file versions
//     (libmpi.so.40.30.4): major, full (host minor >= image minor, the
//     default here), strict (equal minors). Sarus proceeds with a warning
//     when the image's minor is newer under full; here that fails.
//   - Beyond Sarus: every MPI symbol that the image's MPI consumers and the
//     step's program import must be defined by the injected libraries.
//   - UCX: one release for ucp/uct/ucs/ucm; host minor >= image minor.
//     libfabric: the host defines every FABRIC_x.y the image's does. PMIx:
//     client/server cross-version compatible. glibc: every GLIBC_x.y the
//     injected files need exists in the image's C library. Libraries the
//     plan injects that the image also has must define every symbol
//     version the image's copies define. A program's DT_RPATH must not
//     hold an injected library.
//
// # Design decisions (each with the alternative and why not)
//
// Reading a root without executing it. The image is untrusted: ldd runs
// the image's loader, ldconfig -p -r needs the host's ldconfig to
// understand the image's cache format, dlopen-ing the library to call
// MPI_Get_library_version or ucp_get_version_string runs image code in the
// launcher. Instead: the root's own /etc/ld.so.cache is parsed (glibc's
// new format, also behind the old one; ~100 lines, checked against
// ldconfig -p in the tests), then its ld.so.conf with includes, then the
// default directories; ELF facts come from debug/elf (DT_NEEDED, DT_SONAME,
// DT_RUNPATH/RPATH, dynamic symbols with versions, verdef/verneed), and a
// panic of debug/elf on a malformed file is an error, not a crash.
// Version strings are read as data: the string an exported symbol points
// to (ompi_version_string, MPII_Version_string/MPIR_Version_string), the
// literal a `lea rax,[rip+d]; ret` function returns (ucp_get_version_string
// on x86-64), or a pattern in read-only data ("OpenPMIx X.Y.Z" for PMIx,
// "release version X.Y" for glibc, the only N.N.N string for libfabric).
// UCX's uct/ucs/ucm carry no version of their own and are credited with
// libucp's when they sit in the same directory with the same file version.
//
// Symlinks are followed inside the root by our own walk (an absolute
// target means ROOT/target, ".." stops at ROOT), which also yields the
// soname chain for the file version; files are then opened with
// openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS) so the kernel enforces the
// same confinement. os.Root was the alternative: it reports absolute links
// (usual in images: /lib64/ld-linux-x86-64.so.2) as escapes instead of
// resolving them the way the guest will. Directory listings go through the
// resolved path; the trees read are the host's own, an image disk read
// in-process or a private extraction of it, so nothing swaps links under
// us. A Root reads through a small interface (lstat, readlink, open as an
// io.ReaderAt, readdir) with two implementations: a host directory, and
// an erofs disk.
//
// Which consumers are checked for symbols: the program (--program) and
// every object in the image's library search directories that links the
// image's MPI (libhdf5_openmpi, libboost_mpi, coarray runtimes, ...). The
// whole image is not scanned: Python extension modules (mpi4py) and other
// dlopened plugins outside the search path are not covered; pass such a
// module as --program to check it. Symbols checked: MPI_/PMPI_/MPIX_ names
// and anything the replaced image MPI libraries define (Open MPI's
// predefined handles such as ompi_mpi_comm_world are data symbols of
// libmpi). Weak imports are exempt. Data objects that an executable takes
// through COPY relocations (an mpicc-built program's MPI_COMM_WORLD is
// ompi_mpi_comm_world, copied into the executable) look defined in its
// dynamic symbol table; they are read as imports from the relocation
// sections, and the injected definition must also have the size the
// executable reserved. Alternative: trusting the symbol table (what nm -D
// and a plain DynamicSymbols walk show) declared an Open MPI 4 program
// safe under a library without its handles.
//
// Injection through LD_LIBRARY_PATH. The plan's files are shared
// read-only into the guest under one directory (DefaultGuestDir, lib/
// flat by soname) and <dir>/lib is put first in LD_LIBRARY_PATH, which the
// loader searches before the ld.so.cache and the default directories
// wherever the image keeps its own MPI. Alternatives: bind-mounting host
// files over the image's (Sarus' way) needs every path the image keeps an
// MPI under and an overlay over the read-only root in the guest, and
// misses copies outside the known paths; LD_PRELOAD would load MPI (and
// UCX's malloc hooks) into every process of the task, shells included;
// rewriting the guest's ld.so.cache needs ldconfig in the image and a
// writable /etc; /etc/ld.so.preload is global to the guest. The cost of
// LD_LIBRARY_PATH: an executable's DT_RPATH (not DT_RUNPATH) is searched
// first, so a program linked with an old-style rpath to its own MPI keeps
// it; the check reports that case (relink with --enable-new-dtags). The
// environment also sets OMPI_MCA_mca_base_component_path (Open MPI's
// components: the image's were built against the image's libopen-pal and
// must never be opened), UCX_MODULE_DIR (UCX's compiled-in module
// directory is absolute, /usr/lib/x86_64-linux-gnu/ucx, i.e. the image's
// modules), FI_PROVIDER_PATH (libfabric providers, when the host has a
// provider directory) and PMIX_MCA_mca_base_component_path (PMIx
// components); these replace rather than prepend.
//
// What the plan holds: the host MPI library; its DT_NEEDED closure
// resolved on the host as its loader would (DT_RUNPATH/RPATH with $ORIGIN,
// cache, directories); the bindings next to it that the image also has
// (libmpi_mpifh, libmpi_usempif08, libmpichfort, ...: an image binding left
// in place would call the host library's internals); MPICH soname aliases
// the image links (libmpi.so.12 for the host's libmpich.so.12); and the
// dlopened plugins of the stack with their closures: Open MPI components
// (found next to libmpi as openmpi*/ or openmpi/lib/openmpi*/ holding
// mca_*.so), UCX modules (<dir of libucs>/ucx, named by soname because UCX
// loads lib<fw>_<name>.so.<N>), libfabric providers (<libdir>/libfabric),
// PMIx components (<libdir>/pmix). A plugin whose closure does not resolve
// on the host is left out and listed (it cannot load on the host either).
// The C library stays the image's: not only libc, ld.so, libm, libpthread,
// libdl and librt but every glibc library (libresolv, libutil, libanl,
// libmvec, libnss_*, ...), because all objects of one glibc build share
// GLIBC_PRIVATE interfaces and must come from that build. Measured on
// Debian 12: Open MPI 4.1.4 162-168 files (121 components), MPICH 4.0.2
// 18-23 files; Plan.Materialize copies either in about 25 ms (page cache).
//
// Materialize copies instead of linking: a share of symlinks to host
// paths dangles in the guest, and hard links cannot cross filesystems. The
// launcher may cache the copy per plan.
//
// Reading the image: the disk is never mounted. OpenDisk reads it in
// this process with github.com/erofs/go-erofs (pure Go, fuzzed, reads
// mkfs.erofs output): directories, links and inodes through the reader,
// file contents as an io.ReaderAt over the file's data ranges on the disk
// (debug/elf reads only the headers and sections it needs), nothing
// copied. Nothing is created on the host, so nothing is visible to other
// users and nothing is left when the process dies. The reader has no
// decompression: a disk made with mkfs.erofs -z (image prepare
// --compression) is extracted with fsck.erofs --extract into a fresh 0700
// directory under DiskOptions.WorkDir, which the launcher sets to the
// step's state directory so that stop and gc remove it even after a
// crash. Alternatives, and why not: the loop mount used before
// (ro,nosuid,nodev,noexec on a 0700 directory in /tmp) let any local user
// read another user's private image while it was mounted, because the
// image's own root directory (0755) decides access past the mount point,
// an fd opened meanwhile kept it after the lazy unmount, and a supervisor
// killed mid-check left the mount and its loop device forever; a mount in
// a private mount namespace of a child process hides the mount but not
// the loop device (loop devices are global, readable by group disk), and
// needs the whole check to run in that child; extracting every time costs
// a copy of the image per step. The host kernel no longer parses the
// image's filesystem for the check at all; the reader's panics on a
// malformed disk are errors.
//
// Default mode full, not Sarus' major: a newer MPI library runs programs
// built against an older one of the same ABI, not the reverse; a 5.0
// image (libmpi.so.40.40) on a 4.1 host (libmpi.so.40.30) shares the
// soname and passes major while lacking MPI-4 symbols. When a file name
// carries no minor (a library copied under its soname only), full and
// strict compare the release versions instead, if both libraries are the
// same implementation.
//
// Not covered: the host's MPI configuration files (Open MPI's
// openmpi-mca-params.conf, help texts) are not injected, the image's are
// seen; site tuning must come through the environment. InfiniBand
// (libibverbs providers under /usr/lib/x86_64-linux-gnu/libibverbs, /dev
// nodes) is injected as ordinary dependencies without its provider
// directory: it matters only once a VM gets an RDMA device.
package mpi
