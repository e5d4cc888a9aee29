package image

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLockExcludesAcrossUnlink: goroutines (each its own open file, as
// separate processes would have) take one digest's lock over and over and
// half the time unlink the lock file when they release it; never are two
// inside at once. Without lockFile's check that the path still names the
// locked inode, a locker that opened the file before the unlink and one
// that created the new file both hold "the" lock.
func TestLockExcludesAcrossUnlink(t *testing.T) {
	dir := t.TempDir()
	h := strings.Repeat("c", 64)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var inside, overlaps, rounds atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				lk, err := lockDigest(ctx, dir, h)
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) > 1 {
					overlaps.Add(1)
				}
				time.Sleep(200 * time.Microsecond)
				inside.Add(-1)
				rounds.Add(1)
				if (g+i)%2 == 0 {
					if err := lk.remove(); err != nil {
						t.Error(err)
					}
				} else {
					lk.unlock()
				}
			}
		}()
	}
	wg.Wait()
	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d of %d rounds had two holders of the lock", n, rounds.Load())
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) > 1 {
		t.Errorf("files left: %q", m)
	}
}
