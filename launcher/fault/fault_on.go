//go:build smv_faults

package fault

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Enabled is whether this build has fault injection (tag smv_faults).
const Enabled = true

// maxSwitchBytes bounds what is read of one switch file.
const maxSwitchBytes = 64 << 10

// At returns *Injected when stage s is switched on for job: the file
// Dir/<job> or Dir/all lists it (see switchedOn for what is honoured).
func At(job uint32, s Stage) error {
	if switchedOn(Dir, job, s) {
		return &Injected{Stage: s}
	}
	return nil
}

// On reports whether behaviour s is switched on for job, as At does.
func On(job uint32, s Stage) bool { return switchedOn(Dir, job, s) }

// switchedOn reports whether dir/<job> or dir/all names s on a line of
// its own. dir and the file are honoured only when they are root's, not
// writable by group or others, and not symlinks (the file a regular
// one); anything else, or any error reading them, is off.
func switchedOn(dir string, job uint32, s Stage) bool {
	d, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(d)
	if !rootOnly(d, unix.S_IFDIR) {
		return false
	}
	for _, name := range []string{strconv.FormatUint(uint64(job), 10), "all"} {
		if listed(d, name, s) {
			return true
		}
	}
	return false
}

// listed reports whether the switch file name in the directory d lists s.
func listed(d int, name string, s Stage) bool {
	fd, err := unix.Openat(d, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), filepath.Join("fault", name))
	defer f.Close()
	if !rootOnly(fd, unix.S_IFREG) {
		return false
	}
	sc := bufio.NewScanner(io.LimitReader(f, maxSwitchBytes))
	for sc.Scan() {
		if Stage(strings.TrimSpace(sc.Text())) == s {
			return true
		}
	}
	return false
}

// rootOnly reports whether fd is of file type typ, owned by root, and
// writable by nobody else.
func rootOnly(fd int, typ uint32) bool {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == typ && st.Uid == 0 && st.Mode&0o022 == 0
}
