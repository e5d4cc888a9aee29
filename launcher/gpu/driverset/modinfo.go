package driverset

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/decompress"
)

// maxModuleSize bounds a decompressed kernel module in bytes. NVIDIA's
// largest (nvidia.ko of the proprietary driver) is under 100 MiB.
const maxModuleSize = 512 << 20

// moduleSuffixes are the file endings of kernel modules kmod loads
// (libkmod: .ko and its compressed forms).
var moduleSuffixes = []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"}

// isModuleFile reports whether name ends like a kernel module file.
func isModuleFile(name string) bool {
	for _, s := range moduleSuffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// decompressModule returns a reader of the plain ELF object of a module
// file named name (its suffix says the compression) read from r, and a
// function to release the decompressor.
func decompressModule(name string, r io.Reader) (io.Reader, func(), error) {
	if isModuleFile(name) {
		return decompress.Reader(name, r)
	}
	return nil, nil, fmt.Errorf("%s is not a .ko, .ko.xz, .ko.zst or .ko.gz file", name)
}

// readModuleObject reads the whole ELF object of a module file, bounded
// by maxModuleSize.
func readModuleObject(name string, r io.Reader) ([]byte, error) {
	z, done, err := decompressModule(name, r)
	if err != nil {
		return nil, err
	}
	defer done()
	b, err := io.ReadAll(io.LimitReader(z, maxModuleSize+1))
	if err != nil {
		return nil, fmt.Errorf("decompress %s: %w", name, err)
	}
	if len(b) > maxModuleSize {
		return nil, fmt.Errorf("decompress %s: more than %d bytes", name, maxModuleSize)
	}
	return b, nil
}

// modinfo is what a module says of itself in its .modinfo section.
type modinfo struct {
	Name     string
	Version  string
	License  string
	Vermagic string
	Depends  []string
	Firmware []string
}

// parseModinfo reads the .modinfo section of a kernel module's ELF
// object: NUL-separated "key=value" strings (include/linux/moduleparam.h,
// __MODULE_INFO), a key given several times (firmware, alias) once each.
func parseModinfo(obj []byte) (modinfo, error) {
	f, err := elf.NewFile(bytes.NewReader(obj))
	if err != nil {
		return modinfo{}, fmt.Errorf("not an ELF object: %w", err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return modinfo{}, fmt.Errorf("no .modinfo section")
	}
	if sec.Size > 1<<20 {
		return modinfo{}, fmt.Errorf(".modinfo section of %d bytes", sec.Size)
	}
	data, err := sec.Data()
	if err != nil {
		return modinfo{}, fmt.Errorf("read .modinfo: %w", err)
	}
	var mi modinfo
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch k {
		case "name":
			mi.Name = v
		case "version":
			mi.Version = v
		case "license":
			mi.License = v
		case "vermagic":
			mi.Vermagic = v
		case "depends":
			for _, d := range strings.Split(v, ",") {
				if d != "" {
					mi.Depends = append(mi.Depends, d)
				}
			}
		case "firmware":
			if v != "" {
				mi.Firmware = append(mi.Firmware, v)
			}
		}
	}
	return mi, nil
}
