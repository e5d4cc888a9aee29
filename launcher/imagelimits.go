package launcher

import (
	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/image"
)

// ImageLimits turns microvm.toml's [images] table (MiB, entries) into the
// image package's limits (bytes, entries).
func ImageLimits(i config.Images) image.Limits {
	return image.Limits{
		ImageBytes:     int64(i.MaxImageMiB) << 20,
		LayerBytes:     int64(i.MaxLayerMiB) << 20,
		Entries:        i.MaxEntries,
		UserCacheBytes: int64(i.UserCacheMiB) << 20,
		CacheBytes:     int64(i.CacheMiB) << 20,
	}
}
