package kata

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestFifoEndCloseBeforeOpen: closing an end whose background open has
// not even begun (an exec that failed at once) returns, for both
// directions: the open must be released however late it starts.
func TestFifoEndCloseBeforeOpen(t *testing.T) {
	dir := t.TempDir()
	for i := 0; i < 300; i++ {
		for _, flag := range []int{os.O_RDONLY, os.O_WRONLY} {
			path := filepath.Join(dir, strconv.Itoa(i)+"-"+strconv.Itoa(flag))
			if err := unix.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
			e := openFifo(path, flag)
			done := make(chan struct{})
			go func() { e.close(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("iteration %d: close of a FIFO end (flag %d) whose open had not begun did not return", i, flag)
			}
		}
	}
}
