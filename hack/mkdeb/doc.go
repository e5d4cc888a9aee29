// Command mkdeb builds the Debian package of slurm-microvm (`make deb`)
// with nFPM (github.com/goreleaser/nfpm/v2) used as a library:
//
//	go run . -repo ../.. -version 0~git20261202.abc1234 -o ../../bin/slurm-microvm_..._amd64.deb
//
// from what `make build` and `make man` left in bin/ (the launcher, its
// slurm-microvm-exec link, the static agent, spank_microvm.so, bin/man).
//
// What the package installs (dpkg -L):
//
//	/usr/bin/slurm-microvm, /usr/bin/slurm-microvm-exec -> slurm-microvm
//	/usr/libexec/slurm-microvm/slurm-microvm-agent   static guest agent
//	/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_microvm.so  Debian's Slurm PluginDir
//	/etc/slurm/microvm.toml                          conffile: etc/microvm.toml
//	                                                 with qemu.agent at the
//	                                                 package's agent path
//	/usr/share/man/man1/slurm-microvm*.1.gz, man8/spank-microvm.8.gz
//	/usr/share/bash-completion/completions/slurm-microvm
//	/usr/share/doc/slurm-microvm/{copyright,plugstack.conf}
//	/lib/systemd/system/*  the units of etc/systemd, when the tree has any
//	                       (installed, never enabled or started)
//
// Design decisions (the alternative, and why not):
//
//   - nFPM as a library in a module of its own (hack/mkdeb/go.mod), not
//     dpkg-deb over a staged tree and not the nfpm binary. The library
//     writes the ar/tar layout, md5sums and conffiles list itself, runs as
//     any user (dpkg-deb needs the files staged with root ownership, i.e.
//     fakeroot), and the build stays a Go program pinned in go.sum; no
//     downloaded binary. Its own module keeps nFPM's dependencies (go-git,
//     sprig, PGP) out of the launcher's go.mod and go.sum.
//   - Paths: the package uses Debian's /usr (bin, libexec), `make install`
//     keeps /usr/local (dirs.mk). The shipped conffile points qemu.agent at
//     /usr/libexec/slurm-microvm; mkdeb rewrites exactly that line of
//     etc/microvm.toml and fails if the line is not there, so a change of
//     the example cannot silently ship a config pointing at /usr/local.
//     The plugin's built-in launcher default stays make install's
//     /usr/local/bin/slurm-microvm: the plugstack.conf line the package
//     prints names launcher=/usr/bin/slurm-microvm explicitly.
//   - plugstack.conf is never edited: postinst prints the one line. The
//     plugin is `required`: enabling it is the admin's decision, on each
//     node, once the node's config passes `slurm-microvm config check`.
//   - Depends: qemu-system-x86 (the VMM), erofs-utils (mkfs.erofs: image
//     disks), squashfs-tools (unsquashfs: squashfs images),
//     slurm-client of the Slurm release whose <slurm/spank.h> the plugin
//     was built against (Slurm loads a SPANK plugin of its own major
//     release only). Recommends: slurmd (compute nodes; submit hosts need
//     only srun) and linux-image-amd64 (the default guest kernel is the
//     newest /boot/vmlinuz-*). The test-only packages of
//     hack/setup-debian.sh (MPI, debootstrap, docker-registry, ...) are
//     not dependencies.
//   - Remove and purge (scripts/): removing refuses while a step runs
//     on the node (prerm: a step directory under the configured
//     runtime_dir whose supervisor pid, with its start time, is alive;
//     SLURM_MICROVM_REMOVE_RUNNING=1 overrides), since removing the agent
//     and plugin under a running step fails it at its next exec. Upgrades
//     are not refused: dpkg renames new files over old ones, as make
//     install does. Remove deletes what the launcher derives and can
//     recreate: the cache (/var/cache/slurm-microvm: guest assets,
//     converted images, GPU driver sets) and the runtime directory
//     (/run/slurm-microvm: stop records). It keeps the conffile, the
//     supervisor logs (/var/log/slurm-microvm: the admin's records of
//     ended steps) and the scratch base (/var/lib/slurm-microvm: with
//     keep_scratch it holds users' data). Purge deletes the logs and the
//     scratch base too, and dpkg the conffile:
//     nothing remains (test/pkg TestPackageInstallStepPurge checks every
//     path). Only these default paths are removed: a site that moved
//     cache_dir, runtime_dir, scratch_base or [log] dir elsewhere removes
//     those itself (a moved path may be shared, e.g. a scratch file
//     system).
//   - Version: 0~git<commit time>.<hash> (a Debian version must start
//     with a digit; "0~" sorts below any future release).
package main
