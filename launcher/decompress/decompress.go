// Package decompress reads the compressed files the node's kernel tree and
// firmware hold, by their file name's last suffix, as kmod and the
// kernel's firmware loader do: .xz (github.com/therootcompany/xz, which
// decodes the kernel's BCJ-filtered streams too), .zst
// (klauspost/compress/zstd) and .gz (compress/gzip). Anything else is read
// as it is. Guest assets (module files for the initramfs) and GPU driver
// sets (modules and firmware) both read through it.
package decompress

import (
	"compress/gzip"
	"fmt"
	"io"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/therootcompany/xz"
)

// Suffixes are the compressions Reader decodes, as file name suffixes.
var Suffixes = []string{".xz", ".zst", ".gz"}

// Reader returns r, the contents of the file name, decompressed by the
// name's last suffix, and the function that frees the decoder. An error
// names the file.
func Reader(name string, r io.Reader) (io.Reader, func(), error) {
	switch {
	case strings.HasSuffix(name, ".xz"):
		z, err := xz.NewReader(r, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("decompress %s: %w", name, err)
		}
		return z, func() {}, nil
	case strings.HasSuffix(name, ".zst"):
		z, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, fmt.Errorf("decompress %s: %w", name, err)
		}
		return z, z.Close, nil
	case strings.HasSuffix(name, ".gz"):
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, fmt.Errorf("decompress %s: %w", name, err)
		}
		return z, func() { z.Close() }, nil
	}
	return r, func() {}, nil
}

// Trim is name without its compression suffix ("nvidia.ko.xz" ->
// "nvidia.ko"); a name without one is returned as it is.
func Trim(name string) string {
	for _, s := range Suffixes {
		if t, ok := strings.CutSuffix(name, s); ok {
			return t
		}
	}
	return name
}
