package assets

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/assets/guestmod"
)

// DefaultModules are the modules packed into the initramfs when
// Options.Modules is nil: the virtio transports and devices the QEMU driver
// attaches (-M microvm uses virtio-mmio; q35 uses virtio-pci), the root
// filesystem (erofs) with its writable layer (overlay), host shares (9p,
// virtio-fs), the network device (virtio_net, with net_failover and
// failover) and vsock where the host has vhost-vsock. Debian's kernel builds
// all of them as modules.
var DefaultModules = []string{
	"virtio_mmio", "virtio_pci", "virtio_blk", "virtio_console",
	"erofs", "overlay",
	"9p", "9pnet_virtio", "virtiofs",
	"virtio_net",
	"vmw_vsock_virtio_transport", "vsock",
}

// ShareModules are what host shares need in the guest (QEMU's 9p over
// virtio); their closure is flagged "share" in the order file.
var ShareModules = []string{"9p", "9pnet_virtio"}

// NetModules are what the guest's network device needs (virtio_net and
// its dependencies net_failover and failover); their closure is flagged
// "net" in the order file. They are loaded by the agent when the Setup
// request has a network, not at boot: under TCG each module costs about
// 12 ms of boot, and a step without a network (mode none) pays nothing.
// The load happens before any process starts either way, so no workload
// sees the interface missing.
var NetModules = []string{"virtio_net"}

// RequiredModules must exist (as a module or built in) for the guest to boot
// at all: the console/control channel, the root disk and its filesystems.
// Any other requested module that the kernel lacks is skipped with a debug log.
var RequiredModules = []string{"virtio_mmio", "virtio_blk", "virtio_console", "erofs", "overlay"}

// ModuleIndex is the part of depmod's output (modules.dep, modules.softdep,
// modules.alias, modules.builtin in /lib/modules/<release>) needed to compute
// a load order.
type ModuleIndex struct {
	Dir      string              // /lib/modules/<release>
	path     map[string]string   // module name -> path relative to Dir
	deps     map[string][]string // module name -> names it depends on (modules.dep)
	softPre  map[string][]string // module name -> names or aliases to load before it
	softPost map[string][]string // module name -> names or aliases to load after it
	aliases  map[string][]string // exact alias -> module names (wildcard aliases are not indexed)
	builtin  map[string]bool
}

// LoadModuleIndex reads the depmod files in dir. modules.dep is required;
// modules.softdep, modules.alias and modules.builtin are used when present.
func LoadModuleIndex(dir string) (*ModuleIndex, error) {
	ix := &ModuleIndex{
		Dir: dir, path: map[string]string{}, deps: map[string][]string{},
		softPre: map[string][]string{}, softPost: map[string][]string{},
		aliases: map[string][]string{}, builtin: map[string]bool{},
	}
	err := eachLine(filepath.Join(dir, "modules.dep"), true, func(line string) error {
		mod, deps, ok := strings.Cut(line, ":")
		if !ok {
			return fmt.Errorf("no ':' in %q", line)
		}
		name := guestmod.ModuleName(mod)
		ix.path[name] = mod
		for _, d := range strings.Fields(deps) {
			ix.deps[name] = append(ix.deps[name], guestmod.ModuleName(d))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// modules.softdep: "softdep <module> pre: a b post: c" (modprobe.d(5)).
	// Words before the first "pre:" or "post:" belong to neither list and are
	// ignored (Debian 6.1 has a few, e.g. "softdep cifs gcm").
	err = eachLine(filepath.Join(dir, "modules.softdep"), false, func(line string) error {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "softdep" {
			return nil
		}
		name := guestmod.ModuleName(f[1])
		var list map[string][]string
		for _, w := range f[2:] {
			switch w {
			case "pre:":
				list = ix.softPre
			case "post:":
				list = ix.softPost
			default:
				if list != nil {
					list[name] = append(list[name], w)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = eachLine(filepath.Join(dir, "modules.alias"), false, func(line string) error {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "alias" || strings.ContainsAny(f[1], "*?[") {
			return nil
		}
		ix.aliases[f[1]] = append(ix.aliases[f[1]], guestmod.ModuleName(f[2]))
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = eachLine(filepath.Join(dir, "modules.builtin"), false, func(line string) error {
		ix.builtin[guestmod.ModuleName(line)] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ix, nil
}

func eachLine(p string, required bool, fn func(string) error) error {
	f, err := os.Open(p)
	if err != nil {
		if !required && os.IsNotExist(err) {
			return nil
		}
		return fmt.Errorf("read module index: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := fn(line); err != nil {
			return fmt.Errorf("read module index: %s line %d: %w", p, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read module index: %s: %w", p, err)
	}
	return nil
}

// Has reports whether name is a loadable module of this kernel.
func (ix *ModuleIndex) Has(name string) bool { _, ok := ix.path[guestmod.ModuleName(name)]; return ok }

// Builtin reports whether name is built into this kernel.
func (ix *ModuleIndex) Builtin(name string) bool { return ix.builtin[guestmod.ModuleName(name)] }

// Resolve returns the load order for the requested modules: each module after
// its hard dependencies (modules.dep) and after its "pre:" soft dependencies,
// before its "post:" ones (modules.softdep). Soft dependency names are
// resolved as modprobe does: a module of that name, else every module with
// that exact alias ("crc32c" -> crc32c_intel and crc32c_generic); modules
// reached only through soft dependencies are marked Optional.
//
// A requested module that is built in needs nothing. A requested module the
// kernel lacks is an error if it is in required, otherwise it is skipped with
// a debug log.
func (ix *ModuleIndex) Resolve(requested, required []string, log *slog.Logger) ([]guestmod.Entry, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := resolver{ix: ix, log: log, index: map[string]int{}, state: map[string]int{}}
	var missing []string
	for _, m := range requested {
		name := guestmod.ModuleName(m)
		switch {
		case ix.builtin[name]:
			log.Debug("module is built into the kernel", "module", name, "dir", ix.Dir)
		case ix.path[name] == "":
			if slices.ContainsFunc(required, func(s string) bool { return guestmod.ModuleName(s) == name }) {
				missing = append(missing, name)
			} else {
				log.Debug("optional module not in this kernel, skipped", "module", name, "dir", ix.Dir)
			}
		default:
			r.visit(name, false)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("resolve modules: required %s not found in %s (neither in modules.dep nor modules.builtin)", strings.Join(missing, ", "), ix.Dir)
	}
	return r.out, nil
}

type resolver struct {
	ix    *ModuleIndex
	log   *slog.Logger
	out   []guestmod.Entry
	index map[string]int // name -> position in out
	state map[string]int // 1 visiting, 2 done
}

func (r *resolver) visit(name string, optional bool) {
	switch r.state[name] {
	case 2:
		if !optional {
			r.harden(name)
		}
		return
	case 1:
		return // a cycle through soft dependencies; the hard part is acyclic
	}
	if r.ix.builtin[name] {
		r.state[name] = 2
		return
	}
	p := r.ix.path[name]
	if p == "" {
		r.log.Debug("soft dependency not in this kernel, skipped", "module", name)
		r.state[name] = 2
		return
	}
	r.state[name] = 1
	for _, s := range r.ix.softPre[name] {
		for _, m := range r.softTargets(s) {
			r.visit(m, true)
		}
	}
	for _, d := range r.ix.deps[name] {
		r.visit(d, optional)
	}
	r.state[name] = 2
	r.index[name] = len(r.out)
	r.out = append(r.out, guestmod.Entry{Path: p, Optional: optional})
	for _, s := range r.ix.softPost[name] {
		for _, m := range r.softTargets(s) {
			r.visit(m, true)
		}
	}
}

// harden marks name and its hard dependencies as not optional.
func (r *resolver) harden(name string) {
	i, ok := r.index[name]
	if !ok || !r.out[i].Optional {
		return
	}
	r.out[i].Optional = false
	for _, d := range r.ix.deps[name] {
		r.harden(d)
	}
}

func (r *resolver) softTargets(s string) []string {
	if n := guestmod.ModuleName(s); r.ix.path[n] != "" || r.ix.builtin[n] {
		return []string{n}
	}
	if ms := r.ix.aliases[s]; len(ms) > 0 {
		return ms
	}
	r.log.Debug("soft dependency matches no module or alias, skipped", "name", s)
	return nil
}
