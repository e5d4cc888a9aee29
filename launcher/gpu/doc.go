// Package gpu hands a step's Slurm-allocated GPUs to its microVM by VFIO
// passthrough: whole GPUs, exactly the allocated ones, and back for the
// next job when the step ends.
//
// The launcher calls, in order:
//
//	p, err := gpu.NewPlan(ctx, gpu.Request{StepGPUs: spec.GPUs, NVML: gpunvml.New(), AllowRebind: ..., GuestMemoryMiB: ...})
//	// write p (JSON) into the step directory, log p.Mapping() and p.Notes
//	err = p.Bind(ctx)                          // only changes drivers with AllowRebind
//	devs, hole64 := p.Devices(), p.Hole64()  // driver.SandboxConfig.Devices, PCIHole64 (each driver renders them)
//	// guest env: CUDA_VISIBLE_DEVICES = gpu.GuestCUDAVisibleDevices(host value, len(p.GPUs))
//	err = p.Release(ctx)                       // at stop, also from a fresh process with the JSON plan
//
// and `slurm-microvm gpus` shows the same checks per configured GPU (Inspect).
// Everything reads sysfs, procfs and /dev through Roots, so the tests run
// against fake trees; NVML sits behind the one-method NVML interface, whose
// go-nvml implementation is package gpunvml.
//
// Measured facts this rests on (Debian 12, Slurm 22.05, QEMU 7.2):
//
//   - SLURM_STEP_GPUS holds each GPU's position among the node's Name=gpu
//     device files in gres.conf order, not the number in the file name: with
//     File=/dev/fakegpu3 listed before File=/dev/fakegpu[0-1], a one-GPU step
//     got SLURM_STEP_GPUS=0 and could open only /dev/fakegpu3 (ENXIO: allowed,
//     no driver) while the others gave EPERM. Some Slurm versions wrote the
//     number in the file name instead (gres_common.c's dev_num); for
//     /dev/nvidia[0-N] in ascending order both readings agree.
//   - ConstrainDevices denies only the unallocated GRES files; other devices
//     (/dev/vfio/vfio) stay open to the step, whose devices cgroup the VMM
//     shares.
//   - QEMU refuses to start when the 64-bit PCI hole ends above the guest
//     CPU's phys-bits ("Address space limit 0xffffffffff < 0x23fffffffff
//     phys-bits too low (40)"), and on AMD-vendor CPUs it moves RAM above
//     4 GiB to 1 TiB once the layout reaches the HyperTransport hole.
//   - SeaBIOS 1.16 places two 256 GiB 64-bit BARs behind two
//     pcie-root-ports (at 256 and 512 GiB) and QEMU's hole grows to cover
//     them even with the default 32 GiB hole (TestQEMUTopology, pci-testdev
//     stand-ins under TCG).
//   - With the planned arguments QEMU fails only at the first vfio-pci
//     realize: "vfio /sys/bus/pci/devices/0000:18:00.0: no such host device"
//     (TestQEMUAcceptsArgs).
//
// Design decisions (alternative, and why not):
//
//   - The mapping is SLURM_STEP_GPUS plus gres.conf's File= lines, parsed per
//     gres.conf(5) (NodeName= filtering, hostlist ranges, continuations,
//     Include). Not CUDA_VISIBLE_DEVICES (renumbered under ConstrainDevices),
//     not the NVML index (it is neither the minor nor Slurm's order: real
//     boards hand out minors in probe order), and not AutoDetect=nvml, whose
//     ordering Slurm does not promise to keep equal to the file; a node that
//     sets it gets a note and the File= order is used.
//
//   - Two gres.conf styles. File=/dev/vfio/<group> (GPUs bound to vfio-pci at
//     boot) is the recommended one: no driver changes per step, and Slurm's
//     device cgroup itself keeps a VM from opening another step's group.
//     File=/dev/nvidia<minor> serves nodes shared with plain GPU jobs; their
//     GPUs are rebound per step only where the admin allows it.
//
//   - Minor to PCI address: /proc/driver/nvidia/gpus/<BDF>/information first
//     (present whenever the driver is, no library), NVML second (minor and
//     PCI bus id). Not nvidia-smi: a text format and a process per query.
//
//   - go-nvml behind a one-method interface in its own package (gpunvml):
//     this package stays pure Go, and the tests drive the real adapter with
//     go-nvml's own mock (pkg/nvml/mock/dgxh200). go-nvml dlopens the library
//     at Init, so a GPU-less host reports "NVML not available: <dlopen
//     error>" and the plan goes on from sysfs and procfs.
//
//   - Group rule: every device of the IOMMU group that is not a bridge must
//     be a function of an allocated GPU (its audio function comes along);
//     bridges are tolerated as the kernel's VFIO does (config header type not
//     0). A group shared with anything else is refused, naming it. Not:
//     passing the whole group (the VM would get devices nobody allocated) or
//     relying on an ACS override patch (it only pretends isolation).
//
//   - Rebinding as driverctl does: driver_override=vfio-pci, unbind, probe;
//     back with driver_override cleared and an explicit bind to the planned
//     driver (drivers_probe might pick another, e.g. nouveau). Not new_id
//     (it grabs every device with that vendor:device) and not unbinding the
//     nvidia module.
//
//   - "Not in use" is NVML's process lists and a scan of /proc/*/fd for the
//     device (by path and by device number, which also catches other mount
//     namespaces): NVML does not list processes that merely hold the device
//     open (nvidia-persistenced, a CUDA context before its first kernel), and
//     unbinding the nvidia driver under an open handle blocks in its remove.
//
//   - MIG: a GPU whose current MIG mode is enabled is refused (its instances
//     may serve other steps and a whole-GPU pass would tear them down). MIG
//     instances cannot be passed on their own without vGPU/SR-IOV.
//
//   - QEMU: q35 with one pcie-root-port per GPU and its functions at 00.N of
//     that port, so the guest driver sees a PCIe link, extended config space
//     and a port it can reset the GPU through. Not devices on pcie.0
//     (root-complex integrated endpoints have neither) and not microvm,pcie=on (no
//     firmware assigns BARs and its 64-bit window is not sized from the
//     devices). rombar=0: compute GPUs need no option ROM and SeaBIOS would
//     run it. io-reserve=0 on ports without I/O BARs: each port otherwise
//     takes 4 KiB of the 64 KiB I/O space, which a few ports exhaust.
//
//   - 64-bit hole: per port the 64-bit BARs plus the largest one (alignment
//     waste), summed, at least QEMU's 32 GiB, given explicitly with
//     q35-pcihost.pci-hole64-size even though SeaBIOS would place BARs
//     anyway: QEMU's phys-bits check, OVMF and a guest that reassigns BARs
//     go by it. PhysBits tells the address width that layout needs; the plan
//     refuses a step whose layout the host CPU cannot address.
//
//   - Guest memory: memory-backend-ram with prealloc=on and
//     prealloc-threads, attached with -machine memory-backend= (QEMU 7.2
//     requires -m to match it). VFIO's type1 IOMMU pins every guest page at
//     device realize anyway (a device may DMA anywhere); preallocating in
//     parallel makes that fast and makes the step's memory cost appear at
//     start. Not -mem-prealloc (no threads, no hugepages) and not
//     -overcommit mem-lock=on (mlocks again what VFIO pins).
//
//   - Release works from the plan alone (JSON in the step directory), is
//     idempotent, waits up to 10 s for the step's processes to close the
//     VFIO groups (vfio-pci's unbind would block on an open device), and
//     verifies: back on the planned driver with the same device minor (a
//     new minor would make gres.conf name another GPU) and /dev/nvidia<minor>
//     opens; or, for a GPU that stays on vfio-pci, /dev/vfio/<group> opens.
//
//   - Errors are *DeviceError values wrapping one Err* rule (errors.Is), and
//     several GPUs' errors join into one line (*ListError) for the step's
//     error file: "SLURM_STEP_GPUS=0,1: GPU 0 (/dev/vfio/12): IOMMU group 12
//     does not exist on this host ...; GPU 1 ...".
//
//   - NVSwitch: a node whose PCI bus has NVIDIA class 0x0680 functions
//     (HGX NVSwitches) gets its multi-GPU steps refused (ErrNVSwitch,
//     Request.NVSwitch "refuse", the default) unless the site accepts
//     PCIe-only peer traffic ("without-nvlink", a plan note). The switches
//     serve every GPU of the baseboard, so they cannot follow one step's
//     GPUs into its VM; running without NVLink silently would be a
//     performance trap. One-GPU steps need no NVLink and pass.
//
// The guest's NVIDIA driver comes from the node (package driverset,
// launcher.planGPUDriver), not from the image.
//
// Not done here: NVLink inside the VM (the whole baseboard to one VM, or
// Fabric Manager's shared-NVSwitch mode on the host with partitions
// activated per step), GPUDirect P2P cliques (vfio-pci
// x-nv-gpudirect-clique), hugepages by default, and MIG or time-sliced
// sharing (a VM gets whole PCI functions; NVIDIA vGPU's SR-IOV virtual
// functions would be passed like any other).
package gpu
