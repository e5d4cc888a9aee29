package pci

// DefaultHole64 is q35's own pci-hole64-size in bytes (QEMU 7.2: 32 GiB):
// the least 64-bit PCI hole a guest gets (launcher/gpu and
// launcher/network/sriov count theirs from it).
const DefaultHole64 = uint64(32) << 30
