package mpi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// ld.so.cache formats, from glibc's sysdeps/generic/dl-cache.h:
//
//	old:  "ld.so-1.7.0", uint32 nlibs, nlibs x {int32 flags; uint32 key, value}
//	new:  "glibc-ld.so.cache" "1.1", uint32 nlibs, uint32 len_strings,
//	      uint8 flags, 3 pad, uint32 extension_offset, 3 x uint32 unused
//	      (48 bytes), then nlibs x {int32 flags; uint32 key, value;
//	      uint32 osversion; uint64 hwcap} (24 bytes)
//
// glibc 2.32 and later write the new format only; older ones write the old
// format followed by the new one (aligned to 8 bytes). String offsets of
// new-format entries are relative to the start of the new header.
const (
	ldCacheOldMagic   = "ld.so-1.7.0"
	ldCacheNewMagic   = "glibc-ld.so.cache1.1"
	ldCacheNewHeader  = 48
	ldCacheNewEntry   = 24
	ldCacheOldEntry   = 12
	ldFlagTypeMask    = 0x00ff
	ldFlagELFLibc6    = 0x0003
	ldFlagRequiredMsk = 0xff00
	// hwcapExtension marks entries for glibc-hwcaps subdirectories
	// (DL_CACHE_HWCAP_EXTENSION): skipped, the baseline entry is always
	// there too.
	hwcapExtension = uint64(1) << 62
)

// ldCacheEntry is one soname -> path mapping of an ld.so.cache.
type ldCacheEntry struct {
	Name, Path string
	Flags      int32
}

// cacheFlagsFor returns the FLAG_*_LIB64 value ldconfig writes for a
// GOARCH's libraries (FLAG_X8664_LIB64, FLAG_AARCH64_LIB64, ...), or -1 to
// accept every ELF libc6 entry.
func cacheFlagsFor(goarch string) int32 {
	switch goarch {
	case "amd64":
		return 0x0300
	case "arm64":
		return 0x0a00
	case "ppc64le", "ppc64":
		return 0x0500
	case "riscv64":
		return 0x1000 // FLAG_RISCV_FLOAT_ABI_DOUBLE: lp64d, the common ABI
	}
	return -1
}

// parseLDCache decodes an ld.so.cache (new format, or old followed by new)
// and returns the entries for ELF libc6 objects whose required-flags equal
// want (all when want < 0), in cache order (the order ld.so searches).
func parseLDCache(b []byte, want int32) ([]ldCacheEntry, error) {
	off := 0
	if bytes.HasPrefix(b, []byte(ldCacheOldMagic)) {
		if len(b) < len(ldCacheOldMagic)+4 {
			return nil, errors.New("ld.so.cache: truncated old header")
		}
		n := binary.LittleEndian.Uint32(b[len(ldCacheOldMagic):])
		off = len(ldCacheOldMagic) + 4 + int(n)*ldCacheOldEntry
		off = (off + 7) &^ 7
		if off >= len(b) || !bytes.HasPrefix(b[off:], []byte(ldCacheNewMagic)) {
			return nil, errors.New("ld.so.cache: old format only (glibc < 2.5), not supported")
		}
	}
	nb := b[off:]
	if !bytes.HasPrefix(nb, []byte(ldCacheNewMagic)) {
		return nil, errors.New("ld.so.cache: unknown format")
	}
	if len(nb) < ldCacheNewHeader {
		return nil, errors.New("ld.so.cache: truncated header")
	}
	bo := binary.ByteOrder(binary.LittleEndian)
	n := int(bo.Uint32(nb[20:]))
	if ldCacheNewHeader+n*ldCacheNewEntry > len(nb) {
		return nil, fmt.Errorf("ld.so.cache: %d entries do not fit in %d bytes", n, len(nb))
	}
	str := func(o uint32) (string, error) {
		if int(o) >= len(nb) {
			return "", fmt.Errorf("ld.so.cache: string offset %d out of range", o)
		}
		end := bytes.IndexByte(nb[o:], 0)
		if end < 0 {
			return "", errors.New("ld.so.cache: unterminated string")
		}
		return string(nb[o : int(o)+end]), nil
	}
	out := make([]ldCacheEntry, 0, n)
	for i := 0; i < n; i++ {
		e := nb[ldCacheNewHeader+i*ldCacheNewEntry:]
		flags := int32(bo.Uint32(e[0:]))
		hwcap := bo.Uint64(e[16:])
		if flags&ldFlagTypeMask != ldFlagELFLibc6 || hwcap&hwcapExtension != 0 {
			continue
		}
		if want >= 0 && flags&ldFlagRequiredMsk != want {
			continue
		}
		k, err := str(bo.Uint32(e[4:]))
		if err != nil {
			return nil, err
		}
		v, err := str(bo.Uint32(e[8:]))
		if err != nil {
			return nil, err
		}
		out = append(out, ldCacheEntry{Name: k, Path: v, Flags: flags})
	}
	return out, nil
}
