package driverset

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// discoverCacheFormat changes when Set or the fingerprint changes meaning.
const discoverCacheFormat = "driverset-discoveryRecord-1"

// discoveryRecord is one remembered discovery: its result and the identity of
// everything it depended on.
type discoveryRecord struct {
	Format string            `json:"format"`
	Inputs map[string]string `json:"inputs"`
	Set    *Set              `json:"set"`
}

// DiscoverCached is Discover, remembered in cacheDir: a step reuses the
// last discovery for the same Options as long as every file it read, and
// every place it looked, is unchanged (size, mtime, inode; a directory's
// mtime changes when an installer adds or removes a file in it; the
// loaded driver's version by content). Reading every NVIDIA module's
// .modinfo costs a full decompression of each .ko.xz (1-2 s for a real
// nvidia.ko), which a step should pay once per driver installation, not
// at every start. The bool is true on a cache hit. A cache that cannot be
// read or written only costs the discovery.
func DiscoverCached(ctx context.Context, o Options, cacheDir string) (*Set, bool, error) {
	key, err := optionsKey(o)
	if err != nil {
		return nil, false, err
	}
	p := filepath.Join(cacheDir, "discovered-"+key+".json")
	if b, err := os.ReadFile(p); err == nil {
		var c discoveryRecord
		if json.Unmarshal(b, &c) == nil && c.Format == discoverCacheFormat && c.Set != nil {
			if now := fingerprint(o, c.Set); mapsEqual(now, c.Inputs) {
				return c.Set, true, nil
			}
		}
	}
	// The places looked in, before and after: an installer that rewrites
	// the driver while it is read (depmod, ldconfig run at every
	// installation) changes them, and such a discovery is not remembered.
	before := fingerprint(o, &Set{})
	s, err := Discover(ctx, o)
	if err != nil {
		return nil, false, err
	}
	after := fingerprint(o, s)
	for k, v := range before {
		if after[k] != v && !strings.Contains(k, "/lib/firmware/nvidia/") {
			return s, false, nil
		}
	}
	b, err := json.Marshal(discoveryRecord{Format: discoverCacheFormat, Inputs: after, Set: s})
	if err == nil && os.MkdirAll(cacheDir, 0o755) == nil {
		if tmp, err := os.CreateTemp(cacheDir, ".discoveryRecord-*"); err == nil {
			_, werr := tmp.Write(b)
			cerr := tmp.Close()
			if werr != nil || cerr != nil || os.Rename(tmp.Name(), p) != nil {
				_ = os.Remove(tmp.Name())
			}
		}
	}
	return s, false, nil
}

// optionsKey names the cache entry of o.
func optionsKey(o Options) (string, error) {
	mods := slices.Clone(o.Modules)
	slices.Sort(mods)
	b, err := json.Marshal(struct {
		Root, Release string
		Modules       []string
		Params        map[string]string
	}{filepath.Clean("/" + o.Root), o.KernelRelease, mods, o.Params})
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:12]), nil
}

// fingerprint is the identity of what a discovery of o that found s
// depended on: the set's files, the depmod and linker cache files, the
// directories searched for firmware and tools, and the loaded driver's
// version.
func fingerprint(o Options, s *Set) map[string]string {
	root := o.Root
	if root == "" {
		root = "/"
	}
	in := func(rel string) string { return filepath.Join(root, rel) }
	paths := []string{
		in(filepath.Join("lib/modules", o.KernelRelease, "modules.dep")),
		in("etc/ld.so.cache"),
	}
	for _, d := range []string{"lib/firmware/updates/" + o.KernelRelease, "lib/firmware/updates", "lib/firmware/" + o.KernelRelease, "lib/firmware", "lib/firmware/nvidia", "lib/firmware/nvidia/" + s.Version} {
		paths = append(paths, in(d))
	}
	for _, d := range binDirs {
		paths = append(paths, in(d))
	}
	for _, m := range s.Modules {
		paths = append(paths, m.Path)
	}
	for _, f := range s.Firmware {
		paths = append(paths, f.Path)
	}
	for _, l := range s.Libraries {
		paths = append(paths, l.Path)
	}
	for _, b := range s.Binaries {
		paths = append(paths, b.Path)
	}
	out := map[string]string{}
	for _, p := range paths {
		out[p] = identity(p)
	}
	for _, v := range []string{"sys/module/nvidia/version", "proc/driver/nvidia/version"} {
		// Not through a symlink: the content of a file outside the root
		// has no place in the record.
		var b []byte
		f, err := os.OpenFile(in(v), os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err == nil {
			b, err = io.ReadAll(io.LimitReader(f, 64<<10))
			f.Close()
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			b = []byte("unreadable: " + err.Error())
		}
		out["content:"+in(v)] = strings.TrimSpace(string(b))
	}
	return out
}

// identity is a file's size, mtime, inode and device, or "absent".
func identity(p string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return "absent"
	}
	return fmt.Sprintf("%d %d.%09d %d %d", st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ino, st.Dev)
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
