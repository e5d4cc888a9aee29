// Package pci reads PCI functions and IOMMU groups from sysfs and moves
// functions between their driver and vfio-pci: what VFIO passthrough of
// GPUs (launcher/gpu) and of NIC virtual functions
// (launcher/network/sriov) share.
//
// Everything goes through Roots, so tests run against fake sysfs, procfs
// and /dev trees, and sysfs writes through a Writer (a fake kernel in
// tests).
//
// Design decisions (alternative, and why not):
//
//   - Rebinding as driverctl does (ToVFIO): driver_override=vfio-pci,
//     unbind, drivers_probe; back (Restore) with driver_override cleared
//     and an explicit bind to the recorded driver (drivers_probe might pick
//     another). Not new_id (it grabs every device with that vendor:device)
//     and not unloading the device's driver.
//   - Whether a function may be moved at all is the caller's rule (the
//     site's allow_rebind): this package never decides to unbind.
//   - Errors are plain and say which write failed; the callers wrap them
//     with their device and their rule (gpu.ErrRebind, sriov.ErrRebind).
package pci
