// Package katacfg reads the settings of a Kata Containers configuration.toml
// that the Kata driver depends on, checks them against what a step needs,
// and gives the sandbox container's sizing annotations.
//
//	cfg, err := katacfg.Load("")   // Kata's search order; cfg.Path says which file
//	for _, p := range katacfg.Check(cfg, katacfg.Need{CPUs: 8, MemoryMiB: 30000, GPUs: 2, FreeMiB: katacfg.StatfsFreeMiB}) {
//		fmt.Println(p) // /etc/kata-containers/configuration.toml:294: runtime.sandbox_cgroup_only: is false: ...; fix: ...
//	}
//	ann, err := katacfg.Annotations(cfg, 8, 30000) // io.katacontainers.config.hypervisor.default_vcpus/default_memory
//
// Everything but Load and StatfsFreeMiB is pure. The key names, sections and
// defaults are Kata 3.x's (src/runtime/config/configuration-qemu.toml.in and
// its siblings; the Go runtime's pkg/oci and virtcontainers, runtime-rs's
// kata-types for runtime.hypervisor_name).
//
// # The rules, and where each comes from
//
//   - runtime.sandbox_cgroup_only = true. Without it Kata's Go runtime
//     keeps only the vCPU threads in the sandbox's cgroup and moves the
//     shim, the VMM's other threads and virtiofsd to an unconstrained
//     overhead cgroup (/kata_overhead/<sandbox>): the step's cgroup (linux.cgroupsPath sits under it) would not hold
//     them, so scancel would not kill them and --mem would not count them.
//   - enable_annotations (of the [hypervisor.<name>] table in use) allows
//     default_vcpus and default_memory. Kata's pkg/oci.addAnnotations
//     refuses a sandbox whose spec carries a hypervisor annotation that no
//     regular expression of the list matches; the match is Go's
//     regexp.MatchString, unanchored ("vcpus" allows default_vcpus), and the
//     same here. The shipped files allow neither.
//   - shared_fs carries files (virtio-fs, virtio-9p): the bundle's root
//     filesystem and the shares reach the guest through it. Kata's
//     confidential configurations set none and pull images in the guest.
//   - GPU steps: cold_plug_vfio = "root-port" or "switch-port" (Kata's
//     spellings; "no-port" is off, "bridge-port" a PCI bridge too small for
//     GPU BARs), hot_plug_vfio = "no-port" (Kata refuses both at once), and
//     pcie_root_port (or pcie_switch_port) at least the devices to plug, at
//     most 16 (Kata's maxPCIeRootPort); runtime.vfio_mode not "vfio", so
//     that the guest's kernel drives the GPUs.
//   - default_maxvcpus and default_maxmemory, where set (non-zero), at least
//     the step's vCPUs and memory: QEMU refuses -smp or -m above the max.
//   - QEMU with virtio-fs keeps guest RAM in a file under file_mem_backend,
//     /dev/shm when unset (Kata: setupFileBackedMem, share=on so virtiofsd
//     can map it). The guest's RAM must fit in that filesystem's free space
//     when the step starts: tmpfs accepts the sparse file and QEMU dies of
//     SIGBUS when the guest touches a page that does not fit. /dev/shm is
//     half the RAM by default, shared by every job on the node.
//
// # Design decisions (each with the alternative and why not)
//
// Own structs, not Kata's. Kata's Go module is not served, and its
// configuration structs pull in virtcontainers. Only the keys the rules
// read are declared; BurntSushi/toml ignores the rest, so a Kata release
// that adds keys does not break the check. A key of the wrong type is an
// error with its line, as Kata would fail too.
//
// Which hypervisor table. Kata's Go runtime ranges over the [hypervisor.*]
// map and keeps whichever it meets last (Go map order), runtime-rs takes
// runtime.hypervisor_name. So: runtime.hypervisor_name when set, else the
// file must hold exactly one table (the shipped files do); several without
// it are an error rather than a guess.
//
// No runtime-level annotation list. Kata 3.x has no enable_annotations in
// [runtime]: the Go runtime (pkg/oci checkAnnotationNameIsValid) and
// runtime-rs (SecurityInfo.is_annotation_enabled) both consult only the
// hypervisor table's list, and io.katacontainers.config.runtime.* keys are
// not filtered by it. Reading a [runtime] list would check a key Kata never
// reads.
//
// Search path. Kata reads /etc/kata-containers/configuration.toml, then the
// defaults its build was configured with: /usr/share/defaults/... for
// distribution packages, /opt/kata/share/defaults/... for the static
// release (kata-deploy). Load tries all three in that order; a site that
// has both installs sets kata.configuration, which the driver also passes
// to the shim as KATA_CONF_FILE, so the check and the shim read one file.
//
// Lines. The TOML decoder keeps key positions to itself (they appear only
// in its errors), so the file is scanned once more for table headers and
// "key =" lines; a key that is absent (a commented-out default) points at
// its table's line, where the admin adds it.
//
// Pluggable free space. Check takes Need.FreeMiB instead of calling
// statfs(2) itself, so the rules are pure and tested with any free space;
// the driver and config check pass StatfsFreeMiB. Nil skips the rule, as
// does MemoryMiB 0 (config check without a step size).
//
// Number of PCIe ports. Recent Kata 3.x releases count the cold-plugged
// devices of the sandbox's VFIO groups and add root ports for them even
// when pcie_root_port is smaller; earlier 3.x releases create exactly
// pcie_root_port ports. The rule asks for the count in the file, which
// works with both; Kata's NVIDIA GPU configurations set it already.
//
// Not checked. Huge-page backed guest RAM (enable_hugepages, hugetlbfs
// sizing is the site's), Cloud Hypervisor's and Dragonball's guest RAM
// (memfd, not a file in /dev/shm), and default_vcpus above the host's CPUs
// (Kata refuses it itself; an allocation cannot exceed the node).
package katacfg
