package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/fs"
	"github.com/slurm-microvm/slurm-microvm/fs/guestpath"
	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
)

// gpuDriverDir is where the agent mounts a step's GPU driver set: in its
// own tree, outside the root processes see, which gets only the library
// and tool directories.
const gpuDriverDir = "/run/microvm/gpu-driver"

// firmwarePathParam is the kernel's extra firmware search directory, tried
// before /lib/firmware (Documentation/driver-api/firmware/fw_search_path.rst).
const firmwarePathParam = "/sys/module/firmware_class/parameters/path"

// SetupGPUDriver makes the GPU driver set d usable in the root: it mounts
// the set's share read-only, points the firmware loader at its firmware,
// loads its kernel modules in order with their parameters, makes the
// device nodes in root/dev from the majors the loaded modules registered
// (/proc/devices), and binds the library and tool directories read-only at
// their guest paths. Any failure is an error naming the module, node or
// path: a GPU step never runs with half a driver.
func SetupGPUDriver(ctx context.Context, root string, d *api.GPUDriver) error {
	if d.Tag == "" {
		return errors.New("GPU driver: no share tag")
	}
	if _, err := guestmod.Load(ctx, guestmod.Config{ShareOnly: true}); err != nil {
		return fmt.Errorf("GPU driver: load modules for host shares: %w", err)
	}
	if err := os.MkdirAll(gpuDriverDir, 0o755); err != nil {
		return fmt.Errorf("GPU driver: %w", err)
	}
	if err := unix.Mount(d.Tag, gpuDriverDir, "9p", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, guestpath.NinePOptionsReadOnly); err != nil {
		return fmt.Errorf("GPU driver: mount share %s: %w", d.Tag, err)
	}
	if d.FirmwareDir != "" {
		fw, err := inSet(d.FirmwareDir)
		if err != nil {
			return fmt.Errorf("GPU driver: firmware directory: %w", err)
		}
		if err := os.WriteFile(firmwarePathParam, []byte(fw), 0); err != nil {
			return fmt.Errorf("GPU driver: set the firmware search path to %s: %w", fw, err)
		}
	}
	for _, m := range d.Modules {
		if err := ctx.Err(); err != nil {
			return err
		}
		p, err := inSet(m.File)
		if err != nil {
			return fmt.Errorf("GPU driver: module %s: %w", m.Name, err)
		}
		if strings.ContainsAny(m.Params, "\n\x00") {
			return fmt.Errorf("GPU driver: module %s: parameters contain a newline or NUL", m.Name)
		}
		if err := finitParams(p, m.Params); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("GPU driver: load module %s (%s) with %q: %w", m.Name, m.File, m.Params, err)
		}
	}
	if len(d.Devices) > 0 {
		majors, err := readCharMajors("/proc/devices")
		if err != nil {
			return fmt.Errorf("GPU driver: %w", err)
		}
		for _, n := range d.Devices {
			if err := makeNode(root, n, majors); err != nil {
				return fmt.Errorf("GPU driver: device /dev/%s: %w", n.Path, err)
			}
		}
	}
	for _, b := range []struct{ dir, guest string }{{d.LibDir, d.GuestLibDir}, {d.BinDir, d.GuestBinDir}} {
		if b.dir == "" || b.guest == "" {
			continue
		}
		if err := bindReadOnly(root, b.dir, b.guest); err != nil {
			return fmt.Errorf("GPU driver: %w", err)
		}
	}
	return nil
}

// inSet resolves a path relative to the driver set's mount, refusing one
// that leaves it.
func inSet(rel string) (string, error) {
	if rel == "" || filepath.IsAbs(rel) || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("%q is not a path inside the driver set", rel)
	}
	return filepath.Join(gpuDriverDir, rel), nil
}

// finitParams loads one module file with finit_module(2) and params.
func finitParams(p, params string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		err = unix.FinitModule(int(f.Fd()), params, 0)
		if err != unix.EINTR {
			return err
		}
	}
}

// readCharMajors parses the "Character devices:" part of /proc/devices
// (proc(5)): name -> major.
func readCharMajors(p string) (map[string]uint32, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	defer f.Close()
	return parseCharMajors(f)
}

func parseCharMajors(r io.Reader) (map[string]uint32, error) {
	out := map[string]uint32{}
	sc := bufio.NewScanner(r)
	inChar := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Character devices:":
			inChar = true
			continue
		case strings.HasSuffix(line, "devices:"):
			inChar = false
			continue
		}
		f := strings.Fields(line)
		if !inChar || len(f) != 2 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 32)
		if err != nil {
			continue
		}
		if _, ok := out[f[1]]; !ok {
			out[f[1]] = uint32(n)
		}
	}
	return out, sc.Err()
}

// makeNode creates the character device n in root/dev (devtmpfs), with
// n.Mode whatever the umask. An existing node with the same number is kept.
func makeNode(root string, n *api.DeviceNode, majors map[string]uint32) error {
	if !filepath.IsLocal(n.Path) {
		return fmt.Errorf("%q is not a path under /dev", n.Path)
	}
	major, ok := majors[n.MajorName]
	if !ok {
		if n.FallbackMajor == 0 {
			return fmt.Errorf("no character device %q in /proc/devices after loading the driver's modules", n.MajorName)
		}
		major = n.FallbackMajor
	}
	mode := n.Mode & 0o777
	if mode == 0 {
		mode = 0o666
	}
	p := filepath.Join(root, "dev", n.Path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	dev := unix.Mkdev(major, n.Minor)
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err == nil {
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == dev {
			return unix.Chmod(p, mode)
		}
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	if err := unix.Mknod(p, unix.S_IFCHR|mode, int(dev)); err != nil {
		return fmt.Errorf("mknod %d:%d: %w", major, n.Minor, err)
	}
	return unix.Chmod(p, mode)
}

// bindReadOnly binds the set's directory rel at guest (an absolute path in
// root, created inside the root without following the image's symlinks
// out of it) and makes the bind read-only.
func bindReadOnly(root, rel, guest string) error {
	src, err := inSet(rel)
	if err != nil {
		return err
	}
	f, in, err := guestpath.Resolve(root, guest, guestpath.Options{Create: true, Refuse: fs.GuestReserved})
	if err != nil {
		return fmt.Errorf("mount point %s: %w", guest, err)
	}
	defer f.Close()
	target := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s (%s): %w", rel, guest, in, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	if err := unix.Mount("", filepath.Join(root, in), "", flags, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", guest, err)
	}
	return nil
}

// driverEnv puts the GPU driver's directories first in the process's
// search paths: PATH (searchPath, the image's) and LD_LIBRARY_PATH, so the
// node's user-space driver wins over any copy the image carries (glibc
// ld.so(8): LD_LIBRARY_PATH comes before DT_RUNPATH and ld.so.cache).
func driverEnv(d *api.GPUDriver, env []string, searchPath string) ([]string, string) {
	if d == nil {
		return env, searchPath
	}
	if d.GuestBinDir != "" {
		searchPath = d.GuestBinDir + ":" + searchPath
	}
	if d.GuestLibDir != "" {
		env = prependList(env, "LD_LIBRARY_PATH", d.GuestLibDir)
	}
	return env, searchPath
}

// prependList puts dir first in the colon-separated variable name of env.
func prependList(env []string, name, dir string) []string {
	for i, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			if v == "" {
				env[i] = name + "=" + dir
			} else {
				env[i] = name + "=" + dir + ":" + v
			}
			return env
		}
	}
	return append(env, name+"="+dir)
}
