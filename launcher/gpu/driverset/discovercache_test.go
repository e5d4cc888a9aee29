package driverset

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestDiscoverCached: a second discovery of an unchanged driver is a hit;
// a change in what discovery read (the linker cache, a module file, the
// loaded driver's version, a new firmware file) rediscovers.
func TestDiscoverCached(t *testing.T) {
	needTools(t)
	root := t.TempDir()
	tr := runInstaller(t, root)
	cache := t.TempDir()
	o := Options{Root: root, KernelRelease: testRelease}
	ctx := context.Background()
	s, hit, err := DiscoverCached(ctx, o, cache)
	if err != nil || hit {
		t.Fatalf("first: hit %v, %v", hit, err)
	}
	if _, hit, _ := DiscoverCached(ctx, o, cache); !hit {
		t.Fatal("an unchanged driver was discovered again")
	}
	if _, hit, _ := DiscoverCached(ctx, Options{Root: root, KernelRelease: testRelease, Modules: []string{"nvidia"}}, cache); hit {
		t.Error("other options hit the cache")
	}
	later := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name   string
		change func()
	}{
		{"module file touched", func() { os.Chtimes(s.Modules[0].Path, later, later) }},
		{"ld.so.cache rewritten", func() { os.Chtimes(tr.path("etc/ld.so.cache"), later, later) }},
		{"driver reloaded", func() { tr.write("sys/module/nvidia/version", []byte("550.40.07\n"), 0o444) }},
		{"firmware added", func() { tr.write("lib/firmware/nvidia/"+testVersion+"/extra.bin", []byte("x"), 0o644) }},
	} {
		tc.change()
		if _, hit, err := DiscoverCached(ctx, o, cache); err != nil || hit {
			t.Errorf("%s: hit %v, %v: want a new discovery", tc.name, hit, err)
		}
		if _, hit, _ := DiscoverCached(ctx, o, cache); !hit {
			t.Errorf("%s: the new discovery was not remembered", tc.name)
		}
	}
}
