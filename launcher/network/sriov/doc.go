// Package sriov passes one SR-IOV virtual function (VF) of a fabric NIC
// (a ConnectX adapter on InfiniBand or RoCE) into a step's microVM by VFIO,
// so that the guest does RDMA on the fabric with its own driver. It is
// checked against fake sysfs trees only: no SR-IOV adapter was at hand,
// so no VF has been bound, passed or driven for real.
//
// The launcher calls, per step and node, where [network.sriov] pfs is set:
//
//	p, err := sriov.NewPlan(ctx, sriov.Request{Config: cfg.Network.SRIOV, ClaimDir: sriov.DefaultClaimDir(runtimeDir, node),
//	        Owner: node + "/" + stepID, StateDir: stateDir})   // claims a VF
//	// write p (JSON) into the step directory, log p.Mapping() and p.Notes
//	err = p.Bind(ctx)                          // changes a driver only with allow_rebind
//	dev, err := p.Device()                     // driver.SandboxConfig.Devices, after the GPUs' ones
//	files := p.VFIOGroupFiles()                // to the VMM, with the GPUs' ones
//	modules := p.Guest().Modules               // into the guest's initramfs
//	err = p.Release(ctx)                       // at stop, also from a fresh process with the JSON plan
//	freed, err := sriov.GC(ctx, claimDir, pci.Roots{}, nil)   // gc: claims whose step left no state
//
// and `slurm-microvm nics` shows the same checks per configured PF (Inspect).
//
// Facts this rests on (Linux's Documentation/ABI/testing/sysfs-bus-pci
// and the kernel's sysfs layout; not measured on an adapter here):
//
//   - A PF with SR-IOV has sriov_totalvfs and sriov_numvfs; each enabled
//     VF is a PCI function of its own, linked from the PF as virtfn<n> and
//     back as physfn. While mlx5_core has a VF the host names its interface
//     (net/<if>) and RDMA device (infiniband/<dev>, with
//     infiniband_verbs/uverbs<n> for /dev/infiniband/uverbs<n>).
//   - ConnectX-6 Dx, ConnectX-7 and later VFs are 15b3:101e ("ConnectX
//     Family mlx5Gen Virtual Function"); the fakes use a ConnectX-7 PF
//     (15b3:1021, InfiniBand class 0x0207).
//   - QEMU 7.2 takes the planned arguments and fails only at the vfio-pci
//     realize ("vfio /sys/bus/pci/devices/0000:3b:00.2: no such host
//     device", TestQEMUAcceptsVFArgs), places the device at 00.0 of its
//     own root port, and itself refuses a second root port with a chassis
//     number already taken ("Can't add chassis slot", TestQEMUVFBesideGPU).
//   - The node's Debian 6.1 kernel has mlx5_core, mlx5_ib and ib_uverbs as
//     modules, which resolve with their dependencies (ib_core, mlxfw,
//     psample, pci_hyperv_intf) for the guest's initramfs
//     (TestGuestModulesResolve).
//
// Design decisions (alternative, and why not):
//
//   - A VF by VFIO: the guest gets a PCI function of the adapter and runs
//     mlx5_core/mlx5_ib itself, so verbs, UCX and NCCL see a real HCA at
//     near-native latency. Not the PF (one job would take the whole
//     adapter, the host's own fabric traffic included), not macvtap or
//     virtio-net over the step network (no RDMA), and not SoftRoCE (RDMA
//     semantics at TCP speed).
//
//   - Fabric isolation is the site's: a VF is on whatever VLAN or
//     partition the site put it on before the step. This package never
//     configures the fabric. A site that fences tenants on the fabric sets,
//     per VF and before it is handed out (e.g. from the prolog, with the
//     job's VLAN or partition): for Ethernet/RoCE, on the host,
//     `ip link set <pf-if> vf <n> vlan <vid> spoofchk on trust off` (the
//     PF tags and filters the VF's traffic, so the guest cannot leave the
//     VLAN or spoof its MAC) and `... vf <n> mac <addr>`; for InfiniBand,
//     `ip link set ib0 vf <n> node_guid <g> port_guid <g>` and
//     `... vf <n> state auto`, and the subnet manager (OpenSM
//     partitions.conf, UFM) puts that GUID into the job's partition key as
//     a limited member. Without that, a VF is on the adapter's default VLAN
//     or partition (0x7fff) and reaches every other port on it: the step
//     network's host-side fencing does not apply to RDMA traffic.
//
//   - Node-local claim files, not Slurm GRES, by default: a VF is claimed
//     at step start by creating <claim dir>/<VF>.json (owner, state
//     directory, driver to restore) under an flock on <claim dir>/.lock,
//     so steps starting together get different VFs and a VF whose claim
//     cannot be read is never handed out. The claim outlives the process
//     that made it (an flock held for the step would vanish with a crashed
//     supervisor while its VMM might still hold the VF); Release removes
//     it only once the VFIO group is closed and the VF is back, and GC
//     frees the claims of steps whose state directory is gone. The
//     alternative a site can choose instead is to declare the VFs as a
//     GRES (gres.conf Name=vf File=/dev/vfio/<group>, --gres=vf:1), which
//     makes Slurm schedule and account for them and lets its devices
//     cgroup keep a VM from opening another step's VF, as the recommended
//     GPU style does. Not the default: every node's gres.conf and
//     slurm.conf change (and slurmctld restarts), the group numbers change
//     whenever VFs are re-created, and users would have to ask for a VF in
//     every multi-node job. The cost of claims: the scheduler does not
//     count VFs, so a node with more concurrent VF steps than VFs refuses
//     the extra step at start (ErrNoFreeVF) instead of queueing it.
//
//   - Group rule as for GPUs: every non-bridge member of the VF's IOMMU
//     group must be the VF itself. A VF sharing its group with the PF or
//     other VFs (no ACS above the adapter) is refused (ErrSharedGroup),
//     naming them; passing the group would give the VM the PF. Not an ACS
//     override patch (it only pretends isolation).
//
//   - Drivers as for GPUs (package pci, driverctl's way): the recommended
//     setup binds the VFs to vfio-pci at boot (driverctl set-override, or
//     sriov_drivers_autoprobe=0 before sriov_numvfs and driver_override
//     per VF), so no step changes a driver. With allow_rebind a step moves
//     a VF from mlx5_core to vfio-pci and back, only after checking that
//     the host does not use it: its interface is down (no IFF_UP) and no
//     process holds its /dev/infiniband/uverbs<n>; a VF in use is passed
//     over (a plan note) for the next. A VF whose VFIO group is open
//     belongs to a VM this node did not claim for and is passed over too.
//
//   - QEMU: q35 (launcher/qemu's PCIArgs: VFIO pins all guest memory, so
//     it is preallocated as for GPUs) with the VF at 00.0 of its own
//     pcie-root-port "nic0-port"; the chassis comes from the caller
//     (after the GPUs' 1..n). io-reserve=0 and rombar=0: VFs have memory
//     BARs only and no expansion ROM. Not on pcie.0 (a root-complex
//     integrated endpoint has no link for the driver to train and report).
//
// Not done here: more than one VF per step (multi-rail), VF selection by
// NUMA node or by the step's CPUs, per-job VLAN or partition setup, and
// switchdev/representor mode. The guest image must bring rdma-core
// (libibverbs with the mlx5 provider) for user-space RDMA; the guest's
// interface and RDMA device names are its own (the host's names are not
// carried over).
package sriov
