package qemu

import (
	"fmt"
	"io"
	"os"

	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// DefaultConsoleMaxBytes bounds the guest console kept in the step's state
// (4 MiB): the state lives on the node's /run, a tmpfs shared by every
// step, and a guest root can write its serial port as fast as QEMU drains
// it.
const DefaultConsoleMaxBytes = 4 << 20

// tailBytes is how much of a log is read for an error message (64 KiB),
// whatever the file's size.
const tailBytes = 64 << 10

// console is the guest's serial console as the supervisor keeps it: QEMU
// writes into a pipe (never a file it could grow without bound), and the
// supervisor copies at most max bytes into the state's console.log, a
// root-owned 0644 file (readable by the job's user through the state
// directory's ACL, writable by nobody but root). What comes after the
// bound is drained and counted, so the guest never blocks on its console.
type console struct {
	w    *os.File // the pipe's write end, for QEMU
	done chan struct{}
}

// openConsole creates path (O_NOFOLLOW, truncating a file of our own only)
// and starts the copy from a new pipe into it. Close w once QEMU holds
// it; done is closed when QEMU's end is gone and the file is complete.
func openConsole(path string, max int64) (*console, error) {
	if max <= 0 {
		max = DefaultConsoleMaxBytes
	}
	f, err := state.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create console log: %w", err)
	}
	if err := f.Chmod(0o644); err != nil { // an existing file keeps no other mode
		f.Close()
		return nil, fmt.Errorf("create console log: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("console pipe: %w", err)
	}
	c := &console{w: w, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer f.Close()
		defer r.Close()
		n, _ := io.CopyN(f, r, max)
		if n < max {
			return // QEMU's end closed first
		}
		dropped, _ := io.Copy(io.Discard, r)
		if dropped > 0 {
			fmt.Fprintf(f, "\n[slurm-microvm: console log stopped at %d bytes; %d more bytes dropped]\n", max, dropped)
		}
	}()
	return c, nil
}

// tailFile returns at most the last tailBytes of path ("" when it cannot
// be read), so that an error message never reads a whole log.
func tailFile(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := fi.Size() - tailBytes
	if off < 0 {
		off = 0
	}
	b, _ := io.ReadAll(io.NewSectionReader(f, off, tailBytes))
	return string(b)
}
