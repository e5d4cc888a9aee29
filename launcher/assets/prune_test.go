package assets

import (
	"context"
	"debug/elf"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestPruneLeastRecentlyUsed: four boot pairs of one kernel (a new agent
// each); past the limit the least recently used go first, an entry used
// within the grace period (a VMM may be reading it) stays, the most
// recently used always stays, and the kernel they share stays while one
// uses it. With Options.CacheBytes, Ensure prunes by itself after a build.
func TestPruneLeastRecentlyUsed(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var built []*Assets
	for i := range 4 {
		os.WriteFile(f.agent, fakeELF((64+16*i)<<10, uint16(elf.EM_X86_64)), 0o755)
		a, err := Ensure(ctx, f.options())
		if err != nil {
			t.Fatal(err)
		}
		built = append(built, a)
	}
	// Uses, oldest first: 1, 0, 3 (2 hours ago .. 1 hour ago), 2 just now.
	base := time.Now().Add(-2 * time.Hour)
	for i, k := range []int{1, 0, 3} {
		at := base.Add(time.Duration(i) * 20 * time.Minute)
		if err := os.Chtimes(filepath.Join(f.cache, built[k].Key, ManifestFile), at, at); err != nil {
			t.Fatal(err)
		}
	}
	size := func(k int) int64 { return dirBytes(filepath.Join(f.cache, built[k].Key)) }
	kernel := dirBytes(filepath.Dir(built[0].Kernel))
	limit := kernel + size(2) + size(3) + size(0)/2 // room for entries 2 and 3
	freed := size(0) + size(1)

	dry, err := Prune(ctx, f.cache, PruneOptions{MaxBytes: limit, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{built[1].Key, built[0].Key}; !slices.Equal(dry.Removed, want) {
		t.Errorf("dry run would remove %q; want %q (least recently used first)", dry.Removed, want)
	}
	if _, err := os.Stat(built[1].Initrd); err != nil {
		t.Errorf("dry run removed an entry: %v", err)
	}
	res, err := Prune(ctx, f.cache, PruneOptions{MaxBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Removed, dry.Removed) || res.UsedBytes > limit || res.FreedBytes != freed {
		t.Errorf("Prune = %+v; want %q removed, %d bytes freed, at most %d bytes left", res, dry.Removed, freed, limit)
	}
	for _, k := range []int{2, 3} {
		if _, err := readEntry(f.cache, built[k].Key); err != nil {
			t.Errorf("entry %d (recently used) pruned: %v", k, err)
		}
	}
	// The smallest limit: entry 3 (used an hour ago) goes; entry 2, used
	// within the grace period, and the shared kernel stay.
	res, err = Prune(ctx, f.cache, PruneOptions{MaxBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Removed, []string{built[3].Key}) {
		t.Errorf("Prune to 1 byte removed %q; want only %s", res.Removed, built[3].Key)
	}
	if _, err := readEntry(f.cache, built[2].Key); err != nil {
		t.Errorf("the entry in use was pruned: %v", err)
	}
	// Past the grace period: still kept (the most recently used).
	res, err = Prune(ctx, f.cache, PruneOptions{MaxBytes: 1, Now: func() time.Time { return time.Now().Add(time.Hour) }})
	if err != nil || len(res.Removed) != 0 {
		t.Errorf("Prune of the last entry = %+v, %v; want it kept", res, err)
	}
	// Ensure with a bound prunes what it built before (past the grace).
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(f.cache, built[2].Key, ManifestFile), old, old)
	o := f.options()
	o.CacheBytes = 1
	os.WriteFile(f.agent, fakeELF(200<<10, uint16(elf.EM_X86_64)), 0o755)
	a, err := Ensure(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(f.cache, built[2].Key)); err == nil {
		t.Errorf("Ensure with CacheBytes kept the idle entry %s", built[2].Key)
	}
	if _, err := readEntry(f.cache, a.Key); err != nil {
		t.Errorf("Ensure pruned its own entry: %v", err)
	}
}
