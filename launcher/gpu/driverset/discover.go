package driverset

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
)

// Libraries are the user-space driver libraries a GPU step gets: the set
// NVIDIA's container toolkit injects for the "compute" and "utility"
// driver capabilities (NVIDIA libnvidia-container, src/nvc_info.c,
// compute_libs and utility_libs), by the name before ".so.". The driver
// ships only some of them in a given version (libnvidia-fatbinaryloader
// ended with 495, libnvidia-gpucomp began with 545); absent ones are
// skipped.
var Libraries = []string{
	"libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq",
	"libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp",
	"libnvidia-ptxjitcompiler", "libnvidia-fatbinaryloader", "libnvidia-allocator",
	"libnvidia-compiler", "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3",
	"libnvidia-nvvm",
}

// RequiredLibraries must be in the set: CUDA's driver API and NVML
// (nvidia-smi and every monitoring agent use it).
var RequiredLibraries = []string{"libcuda", "libnvidia-ml"}

// Binaries are the driver's tools a GPU step gets: NVIDIA
// libnvidia-container, src/nvc_info.c, utility_bins and compute_bins.
var Binaries = []string{
	"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
	"nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
}

// binDirs are searched in order for Binaries, inside the root.
var binDirs = []string{"usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin"}

// openLicense is the license string of NVIDIA's open GPU kernel modules
// (kernel-open/nvidia/nv.c, MODULE_LICENSE).
const openLicense = "Dual MIT/GPL"

var (
	// versionRE is what a driver version or kernel release may contain:
	// both become file and directory names.
	versionRE = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._+~-]*$`)
	// moduleNameRE is a kernel module name as this package takes it.
	moduleNameRE = regexp.MustCompile(`^[A-Za-z0-9_]+$`)
	// loadedRE finds the version in /proc/driver/nvidia/version's first
	// line ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue
	// Mar 5 ...", or "... Open Kernel Module for x86_64  550.54.15  Release
	// Build ...").
	loadedRE = regexp.MustCompile(`Kernel Module.*?\s([0-9]+(\.[0-9]+)+)(\s|$)`)
)

// Discover finds the driver set of o.Root for o.KernelRelease. It reads
// only; errors wrap ErrNoDriver and name what is missing and where it was
// looked for (and ctx's error when it ends first).
func Discover(ctx context.Context, o Options) (*Set, error) {
	s, err := discover(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoDriver, err)
	}
	return s, nil
}

// discoverer carries one discovery.
type discoverer struct {
	ctx     context.Context
	r       rootFS
	release string
	s       *Set
	infos   map[string]modinfo // by module name, the set's modules
}

func discover(ctx context.Context, o Options) (*Set, error) {
	if !versionRE.MatchString(o.KernelRelease) {
		return nil, fmt.Errorf("guest kernel release %q: want `uname -r` of the guest kernel, e.g. 6.1.0-57-amd64", o.KernelRelease)
	}
	r, err := newRootFS(o.Root)
	if err != nil {
		return nil, err
	}
	d := &discoverer{ctx: ctx, r: r, release: o.KernelRelease,
		s: &Set{KernelRelease: o.KernelRelease, Root: r.dir}, infos: map[string]modinfo{}}
	asked := o.Modules
	if len(asked) == 0 {
		asked = DefaultModules
	}
	if err := d.modules(asked, o.Params); err != nil {
		return nil, err
	}
	d.loaded()
	if err := d.firmware(); err != nil {
		return nil, err
	}
	if err := d.libraries(); err != nil {
		return nil, err
	}
	if err := d.binaries(); err != nil {
		return nil, err
	}
	return d.s, nil
}

// normName spells a module name as the kernel does ('-' becomes '_').
func normName(n string) string { return strings.ReplaceAll(n, "-", "_") }

// fileModName is the kernel's name for a module file by its name alone
// (modules.dep(5)): "nvidia-uvm.ko.xz" -> "nvidia_uvm".
func fileModName(p string) string {
	b := path.Base(p)
	for _, s := range moduleSuffixes {
		if strings.HasSuffix(b, s) {
			b = strings.TrimSuffix(b, s)
			break
		}
	}
	return normName(b)
}

// depEntry is one line of modules.dep.
type depEntry struct {
	file string   // as written, relative to the modules directory
	deps []string // files it needs, as written
}

// modules resolves the asked modules and their modules.dep dependencies,
// in load order.
func (d *discoverer) modules(asked []string, params map[string]string) error {
	modDir := "lib/modules/" + d.release
	depPath := modDir + "/modules.dep"
	raw, _, err := d.r.readFile(depPath, 64<<20)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("read the module index of the guest kernel: %w", err)
		}
		what := fmt.Sprintf("%s does not exist", d.r.host(depPath))
		if _, err := d.r.resolve(modDir); err == nil {
			what = fmt.Sprintf("%s has no modules.dep (run depmod %s)", d.r.host(modDir), d.release)
		}
		return fmt.Errorf("the NVIDIA kernel modules are not built for the guest kernel %s: %s; install the driver's DKMS module for that kernel, or boot guests with the node's own kernel", d.release, what)
	}
	var entries []depEntry
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		file, deps, ok := strings.Cut(line, ":")
		if !ok || !isModuleFile(file) {
			return fmt.Errorf("%s line %d: %q is not \"module.ko: dependencies\"", d.r.host(depPath), n, line)
		}
		entries = append(entries, depEntry{file: strings.TrimSpace(file), deps: strings.Fields(deps)})
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", d.r.host(depPath), err)
	}

	// The kernel's name of each file: NVIDIA's own from their modinfo
	// (Debian's nvidia-current.ko is "nvidia"), others from the file name.
	byName := map[string]*depEntry{}
	nameOf := map[string]string{}
	infos := map[string]modinfo{} // by file, those read
	resolved := map[string]string{}
	for i := range entries {
		e := &entries[i]
		name := fileModName(e.file)
		if strings.Contains(path.Base(e.file), "nvidia") {
			if err := d.ctx.Err(); err != nil {
				return err
			}
			mi, rel, err := d.readModinfo(modDir, e.file)
			if err != nil {
				return err
			}
			infos[e.file], resolved[e.file] = mi, rel
			if mi.Name != "" {
				name = mi.Name
			}
		}
		nameOf[e.file] = name
		if prev, dup := byName[name]; dup {
			d.note("module %s is both %s and %s in %s; the first is used, as modprobe would", name, prev.file, e.file, d.r.host(depPath))
			continue
		}
		byName[name] = e
	}

	isAsked := map[string]bool{}
	var missing []string
	for _, a := range asked {
		a = normName(a)
		if !moduleNameRE.MatchString(a) {
			return fmt.Errorf("kernel module %q: a module name is letters, digits and '_'", a)
		}
		isAsked[a] = true
		if byName[a] == nil {
			missing = append(missing, a)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the NVIDIA kernel modules are not built for the guest kernel %s: %s has no %s; install the driver's DKMS module for that kernel, or boot guests with the node's own kernel",
			d.release, d.r.host(depPath), strings.Join(missing, ", "))
	}

	seen := map[string]bool{}
	var visit func(name string, from string) error
	visit = func(name, from string) error {
		if seen[name] {
			return nil
		}
		seen[name] = true
		e := byName[name]
		if e == nil {
			return fmt.Errorf("%s needs %s, which %s does not list", from, name, d.r.host(depPath))
		}
		// modprobe loads a module's dependencies from the last listed
		// to the first; each one's own come first.
		for _, dep := range slices.Backward(e.deps) {
			if nameOf[dep] == "" {
				return fmt.Errorf("%s needs %s, which %s does not list", name, dep, d.r.host(depPath))
			}
			if err := visit(nameOf[dep], name); err != nil {
				return err
			}
		}
		mi, ok := infos[e.file]
		rel := resolved[e.file]
		if !ok {
			var err error
			if mi, rel, err = d.readModinfo(modDir, e.file); err != nil {
				return err
			}
		}
		d.infos[name] = mi
		d.s.Modules = append(d.s.Modules, Module{Name: name, Path: d.r.host(rel), Dependency: !isAsked[name]})
		return nil
	}
	for _, a := range asked {
		if err := visit(normName(a), "the configuration"); err != nil {
			return err
		}
	}

	nv, ok := d.infos["nvidia"]
	if !ok {
		return fmt.Errorf("the kernel modules %s do not include nvidia, NVIDIA's core driver (add it to gpu.driver.modules)", strings.Join(asked, ", "))
	}
	d.s.Version = nv.Version
	if !versionRE.MatchString(d.s.Version) {
		return fmt.Errorf("%s: modinfo version %q is not a driver version", d.module("nvidia").Path, nv.Version)
	}
	d.s.Open = nv.License == openLicense
	for _, m := range d.s.Modules {
		mi := d.infos[m.Name]
		if magic, _, _ := strings.Cut(mi.Vermagic, " "); magic != d.release {
			return fmt.Errorf("%s is built for kernel %q (vermagic), not the guest kernel %s; rebuild it for %s (dkms install) or boot guests with the kernel it was built for", m.Path, magic, d.release, d.release)
		}
		if strings.Contains(path.Base(m.Path), "nvidia") && mi.Version != d.s.Version {
			return fmt.Errorf("%s (%s) is driver version %q but nvidia (%s) is %s; the modules of one driver must come from one version: reinstall the driver",
				m.Name, m.Path, mi.Version, d.module("nvidia").Path, d.s.Version)
		}
	}
	for name, p := range params {
		m := d.module(normName(name))
		if m == nil {
			return fmt.Errorf("module parameters for %s: it is not among the modules loaded (%s); name one of them", name, d.moduleNames())
		}
		if strings.ContainsAny(p, "\n\x00") {
			return fmt.Errorf("module parameters for %s: %q holds a newline or NUL; give them as insmod takes them, space-separated on one line", name, p)
		}
		m.Params = strings.TrimSpace(p)
	}
	return nil
}

// readModinfo reads the modinfo of the module file (as modules.dep names
// it, relative to modDir) and returns it with the file's path relative to
// the root.
func (d *discoverer) readModinfo(modDir, file string) (modinfo, string, error) {
	p := file
	if !strings.HasPrefix(file, "/") {
		p = modDir + "/" + file
	}
	f, rel, err := d.r.openFile(p)
	if err != nil {
		return modinfo{}, "", fmt.Errorf("read kernel module %s: %w", file, err)
	}
	defer f.Close()
	obj, err := readModuleObject(rel, f)
	if err != nil {
		return modinfo{}, "", fmt.Errorf("read kernel module %s: %w", d.r.host(rel), err)
	}
	mi, err := parseModinfo(obj)
	if err != nil {
		return modinfo{}, "", fmt.Errorf("read kernel module %s: %w", d.r.host(rel), err)
	}
	return mi, rel, nil
}

func (d *discoverer) module(name string) *Module {
	for i := range d.s.Modules {
		if d.s.Modules[i].Name == name {
			return &d.s.Modules[i]
		}
	}
	return nil
}

func (d *discoverer) moduleNames() string {
	var n []string
	for _, m := range d.s.Modules {
		n = append(n, m.Name)
	}
	return strings.Join(n, ", ")
}

func (d *discoverer) note(format string, args ...any) {
	d.s.Notes = append(d.s.Notes, fmt.Sprintf(format, args...))
}

// loaded sets LoadedVersion from the running driver, if any.
func (d *discoverer) loaded() {
	src := "sys/module/nvidia/version"
	b, _, err := d.r.readFile(src, 4096)
	v := strings.TrimSpace(string(b))
	if err != nil {
		sysErr := err
		src = "proc/driver/nvidia/version"
		b, _, err = d.r.readFile(src, 64<<10)
		if m := loadedRE.FindSubmatch(b); err == nil && m != nil {
			v = string(m[1])
		}
		// Neither there: the first one's reason, unless it is absent too.
		if errors.Is(err, fs.ErrNotExist) && !errors.Is(sysErr, fs.ErrNotExist) {
			err = sysErr
		}
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		d.note("the loaded driver's version is unknown: %v", err)
		return
	}
	d.s.LoadedVersion = v
	if v != "" && v != d.s.Version {
		d.note("the node runs driver %s (%s) but %s is installed; guests get the installed %s (reboot the node or reload its driver to match)", v, d.r.host(src), d.s.Version, d.s.Version)
	}
}

// firmwareDirs are where the kernel looks for firmware, in its order
// (drivers/base/firmware_loader/main.c, fw_path), relative to the root.
func (d *discoverer) firmwareDirs() []string {
	return []string{"lib/firmware/updates/" + d.release, "lib/firmware/updates", "lib/firmware/" + d.release, "lib/firmware"}
}

// firmware finds the firmware the set's modules declare, or the driver's
// firmware directory when they declare none.
func (d *discoverer) firmware() error {
	var declared []string
	for _, m := range d.s.Modules {
		for _, fw := range d.infos[m.Name].Firmware {
			if !slices.Contains(declared, fw) {
				declared = append(declared, fw)
			}
		}
	}
	var missing []string
	for _, fw := range declared {
		if fw != path.Clean(fw) || path.IsAbs(fw) || strings.HasPrefix(fw, "../") || fw == ".." {
			return fmt.Errorf("a module declares firmware %q, which is not a path under /lib/firmware", fw)
		}
		found := false
		// The kernel tries the plain file in every directory, then the
		// compressed forms (CONFIG_FW_LOADER_COMPRESS_ZSTD, _XZ).
	search:
		for _, suffix := range []string{"", ".zst", ".xz"} {
			for _, dir := range d.firmwareDirs() {
				rel, err := d.findFile(dir + "/" + fw + suffix)
				if err == nil {
					d.s.Firmware = append(d.s.Firmware, File{Path: d.r.host(rel), Rel: "firmware/" + fw + suffix})
					found = true
					break search
				}
				if !errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("firmware %s: %w", fw, err)
				}
			}
		}
		if !found {
			missing = append(missing, fw)
		}
	}
	if len(declared) == 0 {
		dir := "lib/firmware/nvidia/" + d.s.Version
		if err := d.firmwareTree(dir); err != nil {
			return err
		}
		if len(d.s.Firmware) == 0 {
			missing = append(missing, "nvidia/"+d.s.Version+"/*")
		}
	}
	if len(missing) == 0 {
		return nil
	}
	where := d.r.host("lib/firmware")
	if d.s.Open {
		return fmt.Errorf("NVIDIA's open kernel modules %s need their GSP firmware on every GPU, and %s: not found under %s; install the driver's firmware (Debian: firmware-nvidia-gsp; NVIDIA's installer puts it in /lib/firmware/nvidia/%s)",
			d.s.Version, strings.Join(missing, ", "), where, d.s.Version)
	}
	d.note("GSP firmware %s: not found under %s: Hopper and later GPUs need it, older ones run without", strings.Join(missing, ", "), where)
	return nil
}

// firmwareTree adds every regular file under dir (relative to the root)
// as firmware; a missing dir adds nothing.
func (d *discoverer) firmwareTree(dir string) error {
	rel, err := d.r.resolve(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("firmware: %w", err)
	}
	ents, err := os.ReadDir(d.r.host(rel))
	if err != nil {
		return fmt.Errorf("firmware: %w", err)
	}
	for _, e := range ents {
		p := rel + "/" + e.Name()
		switch {
		case e.Type().IsRegular():
			d.s.Firmware = append(d.s.Firmware, File{Path: d.r.host(p), Rel: "firmware/" + strings.TrimPrefix(dir, "lib/firmware/") + "/" + e.Name()})
		case e.IsDir():
			if err := d.firmwareTree(dir + "/" + e.Name()); err != nil {
				return err
			}
		}
	}
	return nil
}

// findFile resolves p inside the root to a regular file, relative path.
func (d *discoverer) findFile(p string) (string, error) {
	f, rel, err := d.r.openFile(p)
	if err != nil {
		return "", err
	}
	f.Close()
	return rel, nil
}

// libraries finds Libraries through the root's linker cache.
func (d *discoverer) libraries() error {
	const cachePath = "etc/ld.so.cache"
	raw, _, err := d.r.readFile(cachePath, maxLDCache)
	if err != nil {
		return fmt.Errorf("read the linker cache to find the user-space driver: %w; run ldconfig", err)
	}
	entries, err := parseLDCache(raw)
	if err != nil {
		return fmt.Errorf("read the linker cache %s: %w", d.r.host(cachePath), err)
	}
	want := ".so." + d.s.Version
	for _, name := range Libraries {
		if err := d.ctx.Err(); err != nil {
			return err
		}
		required := slices.Contains(RequiredLibraries, name)
		var e *ldEntry
		for i := range entries {
			c := &entries[i]
			if strings.HasPrefix(c.Key, name+".so.") && (e == nil || e.HWCap != 0 && c.HWCap == 0) {
				e = c
			}
		}
		if e == nil {
			if required {
				return fmt.Errorf("%s (%s.so.*) is not in the linker cache %s: install the driver's user-space libraries (version %s) and run ldconfig", name, name, d.r.host(cachePath), d.s.Version)
			}
			continue
		}
		skip := func(format string, args ...any) error {
			msg := fmt.Sprintf(format, args...)
			if required {
				return errors.New(msg)
			}
			d.note("%s skipped: %s", name, msg)
			return nil
		}
		if strings.ContainsAny(e.Key, "/\x00") {
			if err := skip("the linker cache names it %q, not a soname", e.Key); err != nil {
				return err
			}
			continue
		}
		rel, err := d.findFile(e.Value)
		if err != nil {
			if err := skip("%s in the linker cache %s: %v", e.Key, d.r.host(cachePath), err); err != nil {
				return err
			}
			continue
		}
		base := path.Base(rel)
		if !strings.HasSuffix(base, want) {
			if err := skip("%s is %s, not of the kernel module's version %s (the user-space driver must match it exactly, or CUDA says \"CUDA driver version is insufficient\"); install the user-space driver %s", e.Key, d.r.host(rel), d.s.Version, d.s.Version); err != nil {
				return err
			}
			continue
		}
		d.s.Libraries = append(d.s.Libraries, Library{File: File{Path: d.r.host(rel), Rel: "lib64/" + base}, Soname: e.Key})
	}
	return nil
}

// binaries finds Binaries in binDirs.
func (d *discoverer) binaries() error {
	for _, name := range Binaries {
		found := false
		for _, dir := range binDirs {
			rel, err := d.findFile(dir + "/" + name)
			if err == nil {
				d.s.Binaries = append(d.s.Binaries, File{Path: d.r.host(rel), Rel: "bin/" + name})
				found = true
				break
			}
			if !errors.Is(err, fs.ErrNotExist) {
				d.note("%s in %s skipped: %v", name, d.r.host(dir), err)
			}
		}
		if !found && name == "nvidia-smi" {
			d.note("nvidia-smi is in none of %s under %s: guests get no nvidia-smi", strings.Join(binDirs, ", "), d.r.dir)
		}
	}
	return nil
}

// Summary is the set in one line for logs: "550.54.15 for 6.1.0-57-amd64:
// modules nvidia,nvidia_uvm; 2 firmware; 9 libraries; 3 tools".
func (s *Set) Summary() string {
	var names []string
	for _, m := range s.Modules {
		names = append(names, m.Name)
	}
	return fmt.Sprintf("%s for %s: modules %s; %d firmware; %d libraries; %d tools",
		s.Version, s.KernelRelease, strings.Join(names, ","), len(s.Firmware), len(s.Libraries), len(s.Binaries))
}
