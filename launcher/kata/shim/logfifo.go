package shim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// openLog creates <bundle>/log (a FIFO) and opens it read-write, so that
// opening never blocks and the shim's writes never see a missing reader;
// a goroutine passes its lines to the logger.
func (s *Shim) openLog() error {
	p := filepath.Join(s.rec.Bundle, "log")
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the stale shim log %s: %w", p, err)
	}
	if err := unix.Mkfifo(p, 0o600); err != nil {
		return fmt.Errorf("create the shim log FIFO %s: %w", p, err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open the shim log FIFO %s: %w", p, err)
	}
	s.logf, s.logEnd = f, make(chan struct{})
	go func() {
		defer close(s.logEnd)
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			lvl := slog.LevelDebug
			if strings.Contains(line, "level=error") || strings.Contains(line, "level=fatal") || strings.Contains(line, "level=warn") {
				lvl = slog.LevelWarn
			}
			s.log.Log(context.Background(), lvl, "shim log", "line", line)
		}
	}()
	return nil
}
