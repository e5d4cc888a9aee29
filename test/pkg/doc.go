// Package pkg tests the Debian package (`make deb`, hack/mkdeb) the way an
// admin meets it: TestPackageInstallStepPurge builds it, installs it with
// dpkg -i into this machine's real system, runs one `srun --microvm` step
// on the local test cluster whose plugstack.conf is exactly the line the
// package's postinst printed (so the package's own plugin, launcher, agent
// and conffile run the step), then removes and purges it and checks that
// no path of `dpkg -L` remains (only the conffile and the step logs after
// the remove). TestPrerm* run the maintainer scripts alone.
//
// The test restores the machine whatever happens: every path the package
// or its purge touches that existed before (a `make install` of the same
// plugin path, /etc/slurm/microvm.toml, the default cache) is moved aside
// next to itself first and moved back at the end, after a purge that
// runs even when the test failed.
//
// Design decision: dpkg into the real root, as CI on a fresh machine does,
// not dpkg --root into a chroot: the step needs the real slurmd to load
// the installed plugin from Slurm's plugin directory, and the purge check
// means something only against the real file system the scripts act on.
package pkg
