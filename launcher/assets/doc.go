// Package assets builds and caches the guest boot pair for QEMU -M microvm:
// an uncompressed kernel (vmlinux) extracted from the host's Debian bzImage,
// and an initramfs whose /init is the guest agent and which carries the
// kernel modules the agent loads (see package guestmod for the guest side).
//
//	a, err := assets.Ensure(ctx, assets.Options{Agent: "/usr/libexec/slurm-microvm-agent"})
//	// qemu-system-x86_64 -M microvm,... -kernel a.Kernel -initrd a.Initrd \
//	//   -append strings.Join(append(assets.KernelCmdline("tcg"), ...), " ")
//
// # Cache
//
// <CacheDir> (default /var/cache/slurm-microvm/assets) holds
//
//	.lock                         flock(2) held by the one process building
//	kernel-<sha256 of bzImage>/vmlinux
//	<key>/initrd.img, manifest.json
//
// The key hashes every input of the initramfs (kernel image, agent binary,
// module lists, compression, signature stripping, modules.dep and
// modules.softdep, cache format). A new agent rebuilds only the initramfs
// (10-50 ms); the 63 MiB vmlinux is extracted once per kernel image and
// shared. Entries are built in a temporary directory and renamed into place,
// so a reader never sees half an entry; a builder that dies leaves a .tmp-*
// directory the next builder removes (it holds the lock, so no one else is
// building). Files are 0644 and directories 0755 whatever the umask: QEMU
// runs as the job's user. An entry is about 5-13 MB, a kernel 63 MB.
//
// Pruning (Prune; Options.CacheBytes, images.assets_cache_mib): past the
// limit, the least recently used entries go first, then every extracted
// kernel that no remaining entry names. The use clock is the mtime of an
// entry's manifest.json, which every Ensure sets (before it reads the
// entry, so a concurrent Prune sees the use; Prune checks the mtime again
// just before it removes). In use: the VMM reads the kernel and initramfs
// only while it starts (QEMU keeps them in memory, also for a reboot), so
// an entry used within DefaultInUseGrace (15 min, longer than the default
// boot timeout) is never removed, nor the most recently used one. Prune
// works under the build lock. It runs after every build (Ensure with
// CacheBytes), from the epilog's bounded prune and from `slurm-microvm
// image prune --all` (the daily timer). Alternative: a shared flock held
// by the launcher for the step's life, as the image cache does; the
// entry is not needed once the guest booted, and the driver package
// would have to carry the lock to the sandbox's end for no gain.
//
// # Design decisions (alternative, then the reason)
//
// Kernel decompression in Go, found by magic. The payload is located from
// the setup header (payload_offset/payload_length, boot protocol 2.08+) and
// its compression from its magic; xz, zstd and gzip are decoded, bzip2, lzma,
// lzo and lz4 are named in the error. xz uses github.com/therootcompany/xz
// (a maintained fork of xi2/xz, the Go port of XZ Embedded, the kernel's own
// decoder), not github.com/ulikunitz/xz: the kernel compresses with the x86
// BCJ filter (scripts/xz_wrap.sh; `xz -lvv` on Debian's payload shows
// "--x86 --lzma2=dict=32MiB"), which ulikunitz/xz does not implement
// ("unsupported filter count", its issue #20 is open). zstd uses
// github.com/klauspost/compress/zstd, gzip the standard library. Rejected:
// u-root's pkg/boot/bzimage, which does the same but holds the whole image
// and kernel in memory (70+ MB), execs unxz as a fallback and logs through a
// package global; and running extract-vmlinux/xz(1), a run-time dependency
// for 0.8 s of work. The result must be an x86-64 ET_EXEC ELF of the length
// in the payload's trailer. Measured on Debian 12's 6.1.0-57 (8.1 MB xz ->
// 62.9 MiB): 0.75-0.8 s.
//
// Kernel version from the bzImage header (the kernel_version string), not
// from the file name: it is what `uname -r` says in the guest, and so the
// directory guestmod looks in. The default kernel is the newest
// /boot/vmlinuz-* by version order that has a /lib/modules directory.
//
// Modules resolved on the host, loaded by a list in the guest. The host
// reads modules.dep, modules.softdep, modules.alias and modules.builtin and
// writes lib/modules/<release>/microvm.order, dependencies first; the guest
// walks it with finit_module(2). Rejected: u-root's pkg/kmodule in the guest,
// which ignores modules.softdep (erofs needs libcrc32c, which needs a crc32c
// transform loaded first: "softdep libcrc32c pre: crc32c") and would need the
// depmod files in the guest. Soft dependencies are resolved like modprobe
// does, through exact aliases: "crc32c" names both crc32c_intel and
// crc32c_generic; both are packed and marked optional, because crc32c_intel
// needs SSE4.2, which QEMU's default TCG CPU lacks (ENODEV, seen at every TCG
// boot), while under KVM with -cpu host it is the fast one. Compressed
// modules (.ko.xz/.zst/.gz, newer Debian) are decompressed on the host, so
// the guest kernel needs no CONFIG_MODULE_DECOMPRESS. A missing module is an
// error only if it is in Options.Required (default RequiredModules: the
// console, the root disk, erofs and overlay); others are skipped with a debug
// log. The default list yields 23 modules (about 1.5 MB) on Debian 12.
//
// Module signatures stripped by default. Under TCG the guest spends about
// 120 ms (0.39 s -> 0.27 s from "Run /init" to the marker, median of 6)
// verifying the RSA signatures of 23 modules. The guest is untrusted anyway
// and the files come from root-owned /lib/modules on the host, so the
// signature protects nothing here; the cost is the "E" taint flag in the
// guest. Signatures are kept when /boot/config-<release> is missing or has
// CONFIG_MODULE_SIG_FORCE=y, or when Options.KeepModuleSignatures is set (a
// guest command line with module.sig_enforce=1 needs it too).
//
// Uncompressed initramfs (DefaultInitrdCompression). Boot to marker under
// TCG, median of 5, QEMU start included: with the 2.7 MB test /init, 1.668 s
// uncompressed (5.3 MB) vs 1.684 s gzip (2.4 MB); with a 10 MB /init (the
// size a full agent reaches), 1.675 s (12.6 MB) vs 1.840 s gzip (5.6 MB). A
// second run on a busier host (load 3.3 on 2 cores): 1.944 vs 2.066 s and
// 1.747 vs 1.899 s.
// gzip costs guest CPU that TCG emulates slowly and saves only a host page
// cache read. Build time: 12 ms vs 50 ms (2.7 MB /init), 43 ms vs 155 ms
// (10 MB /init). gzip stays available for hosts where disk space matters
// more. The cpio is written with u-root's pkg/cpio (newc), with every parent
// directory as its own record (the kernel drops a file whose directory does
// not exist yet), mtimes 0 and ownership root.
//
// Power-off: unix.Reboot(LINUX_REBOOT_CMD_POWER_OFF). On -M microvm (ACPI on,
// its default) it enters ACPI S5 and QEMU exits with status 0, 10-12 ms after
// the guest's last line; RESTART with -no-reboot is as fast (10-14 ms) but
// is what a panic does too (panic=-1), so QEMU's shutdown reason
// (guest-shutdown vs guest-reset) only tells a clean exit from a crash when
// the agent powers off. HALT never exits QEMU (timed out in all 3 tries).
// Print, then drain the console (ioctl TCSBRK 1, tcdrain) before powering off,
// or the UART's buffered tail is lost.
//
// Kernel command line (KernelCmdline). Measured under TCG, guest uptime at
// the marker, median of 5, on the 2-core machine: console=ttyS0 panic=-1
// tsc_early_khz alone 1.53 s; adding cryptomgr.notests (crypto self-tests)
// 1.10 s; i8042.noaux i8042.nokbd (microvm has no i8042) 1.42 s;
// 8250.nr_uarts=1 1.46 s; tsc=reliable no_timer_check 1.45 s, which also
// keeps the clocksource watchdog from declaring the TSC unstable when
// emulation stalls; all of them 1.15-1.18 s. initcall_blacklist=
// crypto_kdf108_init (the CTR-KDF self-test, which cryptomgr.notests does
// not skip; initcall_debug showed it at 180-210 ms): a bare boot of 2
// vCPUs and 512 MiB 3913 -> 3567 ms (medians of 5 alternating, busy
// machine). Also tried and not kept, no gain seen within the noise:
// blacklisting the block and kprobe tracers, zswap and encrypted keys, and
// apparmor=0. reboot=t is not needed: restart
// and panic exit QEMU as fast without it. Left to the caller: quiet (1.18 ->
// 1.11 s, but the console log is the only record of a failed boot), pci=off
// (1.36 s alone, but it breaks microvm's pcie=on that VFIO devices need),
// rodata=off (1.09 s, weakens the guest kernel). Also measured: -M
// microvm,rtc=off costs 2 s (the kernel waits 1 s twice for the CMOS clock);
// keep the RTC.
//
// tsc_early_khz source (HostTSCkHz): /sys/devices/system/cpu/cpu0/tsc_freq_khz
// where the kernel has it (not here: it is not in mainline), else RDTSC
// calibrated against CLOCK_MONOTONIC_RAW over 20 ms (here 2596139-2596141
// kHz, within 0.0001% of the host kernel's "tsc: Detected 2596.140 MHz"),
// else /proc/cpuinfo "cpu MHz" × 1000 (here 2596140; equal to tsc_khz on a
// host without cpufreq, like this virtual machine, but the current core
// clock on bare metal with a cpufreq driver, so it comes last). Under TCG the
// guest's TSC is the host's (QEMU reads the host TSC), so the host rate is
// the right value.
//
// Boot pair timings on this machine (2 cores shared with other work, TCG,
// QEMU 7.2, 256 MiB, one vCPU, KernelCmdline("tcg")): first console line
// 0.26-0.38 s after QEMU's start, the kernel's "Run /init" at 1.5-1.8 s,
// module loading and the test init 0.25-0.35 s more, so the marker at
// 1.65-1.95 s, and QEMU gone 10-16 ms after it. A cached Ensure costs 10-15
// ms (hashing the kernel image and the agent). TestBootTimings
// (SLURM_MICROVM_BOOT_BENCH=5) repeats these measurements.
//
// Modules load one after the other, in the order file's order, and the
// feature modules (shares, network) when Setup needs them. Measured and
// dropped (TCG, 2 vCPUs, `slurm-microvm run --debug ... true`, the boot
// timeline's modules_ms + setup_ms, medians of 4-5 alternating runs on a
// busy machine): loading each dependency level's modules at once (10 boot
// modules in 4 stages) and the share modules beside the root mount, 1020
// ms, against 1023 ms one after the other: no gain; starting the share
// modules at boot beside the boot set, 1500 ms (modules_ms 560 -> 1270):
// a loss. Module loading patches kernel text (static keys, alternatives)
// under stop_machine and flushes every vCPU's TLB for each mapping
// change, which software emulation makes dear and serialises anyway. The
// one that would pay is a guest kernel with these drivers built in (no
// module at all); it needs a kernel build per site and per CI run (~1 GB
// of source, minutes on 2 cores) and is left for later: Debian's kernel
// stays the one we boot.
package assets
