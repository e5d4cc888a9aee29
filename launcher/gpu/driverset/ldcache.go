package driverset

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// The ld.so.cache format, as glibc's ldconfig writes it and its dynamic
// linker reads it (glibc sysdeps/generic/dl-cache.h, elf/cache.c,
// elf/dl-cache.c). Two layouts exist:
//
//   - new (glibc 2.32 and later write only this): a 48-byte header
//     "glibc-ld.so.cache" "1.1", nlibs, len_strings, flags (byte; &3 is the
//     endianness: 0 unknown, 1 invalid, 2 little, 3 big), 3 bytes padding,
//     4 words; then nlibs 24-byte entries {int32 flags; uint32 key, value;
//     uint32 osversion; uint64 hwcap}; then the strings. key and value are
//     offsets of NUL-terminated strings from the start of this header.
//   - compat (ldconfig -c compat, and every glibc before 2.32): an old
//     table first, "ld.so-1.7.0" (11 bytes, then 1 byte of alignment),
//     uint32 nlibs, nlibs 12-byte entries {int32 flags; uint32 key, value},
//     then the new layout above at the next 8-byte boundary.
const (
	ldCacheMagicOld  = "ld.so-1.7.0"
	ldCacheMagicNew  = "glibc-ld.so.cache1.1"
	ldCacheHeaderNew = 48
	ldCacheEntryNew  = 24
	ldCacheEntryOld  = 12

	// ldFlagX8664Libc6 marks an x86-64 glibc library: FLAG_ELF_LIBC6
	// (0x0003) | FLAG_X8664_LIB64 (0x0300), glibc elf/ldconfig.h.
	ldFlagX8664Libc6 = 0x0303

	// maxLDCache bounds the cache file read, in bytes (a large node's is
	// a few hundred KiB).
	maxLDCache = 64 << 20
)

// ldEntry is one library of the linker cache.
type ldEntry struct {
	Flags int32
	Key   string // the soname, e.g. libcuda.so.1
	Value string // the path ldconfig found it at, e.g. /usr/lib/x86_64-linux-gnu/libcuda.so.1
	HWCap uint64
}

// errLDCache wraps every malformed-cache error.
var errLDCache = errors.New("malformed ld.so.cache")

// parseLDCache reads the x86-64 glibc entries of an ld.so.cache in the
// new or compat layout, in file order. Every offset and count is checked
// against the data, so any input returns entries or an error, never a
// panic. A big-endian or invalid-marked cache is refused.
func parseLDCache(b []byte) ([]ldEntry, error) {
	if bytes.HasPrefix(b, []byte(ldCacheMagicOld)) {
		if len(b) < 16 {
			return nil, fmt.Errorf("%w: old header truncated", errLDCache)
		}
		n := uint64(binary.LittleEndian.Uint32(b[12:16]))
		end := 16 + n*ldCacheEntryOld
		if end > uint64(len(b)) {
			return nil, fmt.Errorf("%w: old table of %d entries does not fit in %d bytes", errLDCache, n, len(b))
		}
		start := (end + 7) &^ 7
		if start > uint64(len(b)) || !bytes.HasPrefix(b[start:], []byte(ldCacheMagicNew)) {
			return nil, fmt.Errorf("%w: old format only (ldconfig before glibc 2.2); run the node's ldconfig to write a new one", errLDCache)
		}
		b = b[start:]
	}
	if !bytes.HasPrefix(b, []byte(ldCacheMagicNew)) {
		return nil, fmt.Errorf("%w: no %q header", errLDCache, ldCacheMagicNew)
	}
	if len(b) < ldCacheHeaderNew {
		return nil, fmt.Errorf("%w: header truncated", errLDCache)
	}
	n := uint64(binary.LittleEndian.Uint32(b[20:24]))
	switch b[28] & 3 {
	case 1:
		return nil, fmt.Errorf("%w: marked invalid by ldconfig", errLDCache)
	case 3:
		return nil, fmt.Errorf("%w: big-endian cache on an x86-64 node", errLDCache)
	}
	if ldCacheHeaderNew+n*ldCacheEntryNew > uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d entries do not fit in %d bytes", errLDCache, n, len(b))
	}
	var out []ldEntry
	for i := uint64(0); i < n; i++ {
		e := b[ldCacheHeaderNew+i*ldCacheEntryNew:][:ldCacheEntryNew]
		flags := int32(binary.LittleEndian.Uint32(e[0:4]))
		if flags != ldFlagX8664Libc6 {
			continue
		}
		key, err := cString(b, binary.LittleEndian.Uint32(e[4:8]))
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d key: %v", errLDCache, i, err)
		}
		val, err := cString(b, binary.LittleEndian.Uint32(e[8:12]))
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d value: %v", errLDCache, i, err)
		}
		out = append(out, ldEntry{Flags: flags, Key: key, Value: val, HWCap: binary.LittleEndian.Uint64(e[16:24])})
	}
	return out, nil
}

// cString is the NUL-terminated string at off in b.
func cString(b []byte, off uint32) (string, error) {
	if uint64(off) >= uint64(len(b)) {
		return "", fmt.Errorf("offset %d past the end (%d bytes)", off, len(b))
	}
	s := b[off:]
	i := bytes.IndexByte(s, 0)
	if i < 0 {
		return "", fmt.Errorf("string at %d not terminated", off)
	}
	return string(s[:i]), nil
}
