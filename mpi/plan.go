package mpi

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// DefaultGuestDir is where the injected files appear inside the guest: the
// mount point of the read-only share that holds them. Its lib/
// subdirectory is put first in LD_LIBRARY_PATH.
const DefaultGuestDir = "/run/slurm-microvm/mpi"

// File roles in a Plan.
const (
	RoleMPI        = "mpi"               // the MPI library (and its MPICH soname aliases)
	RoleSibling    = "mpi-binding"       // Fortran/C++ bindings the image also has (libmpi_mpifh, libmpichfort)
	RoleDependency = "dependency"        // DT_NEEDED closure
	RoleOMPIComp   = "openmpi-component" // Open MPI MCA components (dlopened)
	RoleUCXModule  = "ucx-module"        // UCX transport modules (dlopened)
	RoleFIProvider = "libfabric-provider"
	RolePMIxComp   = "pmix-component"
)

// PlanFile is one host file to make visible in the guest.
type PlanFile struct {
	// Host is the file's path on the host (symlinks followed).
	Host string `json:"host"`
	// Dir is the guest directory it goes to; Name its file name there
	// (the soname the loader looks for, or a plugin's file name).
	Dir  string `json:"dir"`
	Name string `json:"name"`
	// Role is one of the Role* constants; Why says what pulled it in.
	Role string `json:"role"`
	Why  string `json:"why"`
}

// Guest is the file's full path in the guest.
func (f PlanFile) Guest() string { return path.Join(f.Dir, f.Name) }

// EnvVar is one environment change for the ranks.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	// Prepend puts Value before an existing value, ':'-separated; without
	// it Value replaces any existing value.
	Prepend bool `json:"prepend,omitempty"`
}

// Plan says how to run the host's MPI inside the guest: which host files
// to share read-only, where they appear, and the environment that makes
// them win over the image's copies. The image itself is never modified.
type Plan struct {
	GuestDir string     `json:"guest_dir"`
	MPI      *Library   `json:"mpi"`
	Files    []PlanFile `json:"files"`
	Env      []EnvVar   `json:"env"`
	// Skipped lists plugins left out, each with the reason (a dependency
	// the host cannot resolve: the plugin would not load on the host
	// either).
	Skipped []string `json:"skipped,omitempty"`

	objs    map[string]*object // Name -> host object in lib/, for the rules
	plugins []*object          // the plugins' host objects
	host    *Root
}

// PlanOptions tune NewPlan.
type PlanOptions struct {
	// GuestDir is the share's mount point in the guest (DefaultGuestDir
	// when empty).
	GuestDir string
	// Image, when set, is the image root: bindings (libmpi_mpifh,
	// libmpichfort, ...) are injected only when the image has them, and
	// the image's MPICH soname aliases (libmpi.so.12 for libmpich.so.12)
	// are provided.
	Image      *Root
	ImageStack *Stack
}

var (
	// glibcSonames are the parts of the C library: they stay the image's.
	// Every object of one glibc build must come from that build (they
	// share GLIBC_PRIVATE interfaces), so not only libc, ld.so, libm,
	// libpthread, libdl and librt but all of glibc's libraries.
	glibcSonames = map[string]bool{
		"libc.so.6": true, "libm.so.6": true, "libpthread.so.0": true, "libdl.so.2": true,
		"librt.so.1": true, "libresolv.so.2": true, "libutil.so.1": true, "libanl.so.1": true,
		"libmvec.so.1": true, "libBrokenLocale.so.1": true, "libnsl.so.1": true,
		"libc_malloc_debug.so.0": true, "libthread_db.so.1": true, "libcrypt.so.1": false,
	}
	sonameLike = regexp.MustCompile(`^lib.+\.so\.\d+$`)
	// familyInternal are the libraries of an MPI installation besides
	// libmpi itself: governed by the MPI rules, not the shadowing rule.
	familyInternal = regexp.MustCompile(`^lib(mpi|mpich|mpl|opa|open-pal|open-rte|oshmem|mca_common_|ompitrace|prrte|mpifort|mpicxx|mpi_cray)`)
)

// isGlibc reports whether soname belongs to the C library.
func isGlibc(soname string) bool {
	return glibcSonames[soname] || strings.HasPrefix(soname, "ld-linux") || strings.HasPrefix(soname, "ld64.so") ||
		strings.HasPrefix(soname, "libnss_") || soname == "linux-vdso.so.1" || soname == "linux-gate.so.1"
}

type planBuilder struct {
	ctx  context.Context
	host *Root
	p    *Plan
	lib  string // guest lib dir
}

// NewPlan computes the injection plan for host MPI library mpiLib (found in
// host): the library and its DT_NEEDED closure resolved in host, minus the
// C library; the bindings the image also uses; the plugins the stack
// dlopens (Open MPI components, UCX modules, libfabric providers, PMIx
// components) with their closures; and the environment. It fails when a
// library of the core closure cannot be resolved on the host.
func NewPlan(ctx context.Context, host *Root, mpiLib *Library, o PlanOptions) (*Plan, error) {
	if o.GuestDir == "" {
		o.GuestDir = DefaultGuestDir
	}
	b := &planBuilder{ctx: ctx, host: host, lib: path.Join(o.GuestDir, "lib"),
		p: &Plan{GuestDir: o.GuestDir, MPI: mpiLib, objs: map[string]*object{}, host: host}}
	mo, err := host.object(mpiLib.RealPath)
	if err != nil {
		return nil, fmt.Errorf("injection plan: host MPI %s: %w", mpiLib.HostPath, err)
	}
	for _, n := range mpiLib.sonames() {
		b.add(n, mo, RoleMPI, "the host MPI library")
	}
	// MPICH ABI: libmpi.so.12 and libmpich.so.12 are one ABI under two
	// names; give the image whichever names its own MPI library has.
	if o.ImageStack != nil && mpiLib.Family == FamilyMPICH {
		if il := o.ImageStack.MPIOf(FamilyMPICH); il != nil {
			for _, n := range il.sonames() {
				if _, ok := b.p.objs[n]; !ok {
					b.add(n, mo, RoleMPI, "soname alias of the image's MPI library ("+il.Name+")")
				}
			}
		}
	}
	if err := b.closure(mo); err != nil {
		return nil, err
	}
	if err := b.siblings(mpiLib, mo, o.Image); err != nil {
		return nil, err
	}
	// Plugins: each kind once its owner library is in the plan; plugins
	// can pull in owners of other kinds (Open MPI's pml_ucx -> libucp),
	// so repeat until nothing is added.
	done := map[string]bool{}
	for {
		added := false
		if (mpiLib.Family == FamilyOpenMPI || mpiLib.Impl == "Open MPI") && !done[RoleOMPIComp] {
			done[RoleOMPIComp] = true
			added = true
			if dir := ompiComponentDir(host, mpiLib); dir != "" {
				b.plugins(dir, path.Join(b.lib, "openmpi"), RoleOMPIComp, regexp.MustCompile(`\.so$`), false)
				b.setEnv("OMPI_MCA_mca_base_component_path", path.Join(b.lib, "openmpi"))
			}
		}
		if o, ok := b.ownerWithPrefix("libucs.so."); ok && !done[RoleUCXModule] {
			done[RoleUCXModule] = true
			added = true
			for _, dir := range pluginDirs(host, o, "ucx") {
				b.plugins(dir, path.Join(b.lib, "ucx"), RoleUCXModule, sonameLike, true)
			}
			b.setEnv("UCX_MODULE_DIR", path.Join(b.lib, "ucx"))
		}
		if o, ok := b.ownerWithPrefix("libfabric.so."); ok && !done[RoleFIProvider] {
			done[RoleFIProvider] = true
			added = true
			if dirs := pluginDirs(host, o, "libfabric"); len(dirs) > 0 {
				for _, dir := range dirs {
					b.plugins(dir, path.Join(b.lib, "libfabric"), RoleFIProvider, regexp.MustCompile(`\.so$`), false)
				}
				b.setEnv("FI_PROVIDER_PATH", path.Join(b.lib, "libfabric"))
			}
		}
		if o, ok := b.ownerWithPrefix("libpmix.so."); ok && !done[RolePMIxComp] {
			done[RolePMIxComp] = true
			added = true
			if dirs := pluginDirs(host, o, "pmix"); len(dirs) > 0 {
				for _, dir := range dirs {
					b.plugins(dir, path.Join(b.lib, "pmix"), RolePMIxComp, regexp.MustCompile(`\.so$`), false)
				}
				b.setEnv("PMIX_MCA_mca_base_component_path", path.Join(b.lib, "pmix"))
			}
		}
		if !added {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	b.p.Env = append([]EnvVar{{Name: "LD_LIBRARY_PATH", Value: b.lib, Prepend: true}}, b.p.Env...)
	sort.Slice(b.p.Files, func(i, j int) bool {
		fi, fj := b.p.Files[i], b.p.Files[j]
		if fi.Dir != fj.Dir {
			return fi.Dir < fj.Dir
		}
		return fi.Name < fj.Name
	})
	return b.p, nil
}

func (b *planBuilder) setEnv(name, value string) {
	for _, e := range b.p.Env {
		if e.Name == name {
			return
		}
	}
	b.p.Env = append(b.p.Env, EnvVar{Name: name, Value: value})
}

// add records library name -> host object o in the guest lib dir.
func (b *planBuilder) add(name string, o *object, role, why string) bool {
	if _, ok := b.p.objs[name]; ok {
		return false
	}
	b.p.objs[name] = o
	b.p.Files = append(b.p.Files, PlanFile{Host: b.host.HostPath(o.path), Dir: b.lib, Name: name, Role: role, Why: why})
	return true
}

// closure adds o's DT_NEEDED libraries, recursively, resolved as the
// loader would on the host. When one cannot be resolved nothing is added
// and the error says which (the caller fails, or skips a plugin).
func (b *planBuilder) closure(o *object) error {
	type item struct {
		o  *object
		by string
	}
	var pending []PlanFile
	pendObjs := map[string]*object{}
	queue := []item{{o, o.name()}}
	for len(queue) > 0 {
		it := queue[0]
		queue = queue[1:]
		for _, n := range it.o.needed {
			if isGlibc(n) {
				continue
			}
			if _, ok := b.p.objs[n]; ok {
				continue
			}
			if _, ok := pendObjs[n]; ok {
				continue
			}
			p, err := b.host.Lookup(n, it.o.searchPath())
			if err != nil {
				return fmt.Errorf("injection plan: %s (needed by %s) is not on the host: %w", n, it.by, err)
			}
			d, err := b.host.object(p)
			if err != nil {
				return fmt.Errorf("injection plan: %s (needed by %s): %w", n, it.by, err)
			}
			pendObjs[n] = d
			pending = append(pending, PlanFile{Host: b.host.HostPath(d.path), Dir: b.lib, Name: n, Role: RoleDependency, Why: "needed by " + it.by})
			queue = append(queue, item{d, n})
		}
		if err := b.ctx.Err(); err != nil {
			return err
		}
	}
	for _, f := range pending {
		b.p.objs[f.Name] = pendObjs[f.Name]
		b.p.Files = append(b.p.Files, f)
	}
	return nil
}

// siblings adds the host libraries next to the MPI library that link it
// (Fortran and C++ bindings: libmpi_mpifh, libmpi_usempif08, libmpichfort,
// libmpichcxx, ...), when the image has them too (or always, without an
// image): an image binding left in place would call into the host's
// internals.
func (b *planBuilder) siblings(mpiLib *Library, mo *object, img *Root) error {
	dirs := []string{path.Dir(mpiLib.Path)}
	if d := path.Dir(mpiLib.RealPath); d != dirs[0] {
		dirs = append(dirs, d)
	}
	want := map[string]bool{}
	for _, n := range mpiLib.sonames() {
		want[n] = true
	}
	for _, dir := range dirs {
		ents, err := b.host.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			n := e.Name()
			if !sonameLike.MatchString(n) || !familyInternal.MatchString(n) {
				continue
			}
			if _, ok := b.p.objs[n]; ok {
				continue
			}
			o, err := b.host.object(path.Join(dir, n))
			if err != nil || o.machine != b.host.machine || o.soname != n {
				continue
			}
			links := false
			for _, d := range o.needed {
				if want[d] {
					links = true
				}
			}
			if !links {
				continue
			}
			if img != nil {
				if _, err := img.Lookup(n, nil); err != nil {
					continue
				}
			}
			b.add(n, o, RoleSibling, "binding of "+mpiLib.Name+" that the image has")
			if err := b.closure(o); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *planBuilder) ownerWithPrefix(prefix string) (*object, bool) {
	for n, o := range b.p.objs {
		if strings.HasPrefix(n, prefix) {
			return o, true
		}
	}
	return nil, false
}

// plugins adds every ELF object in host directory dir whose name matches
// into guest directory gdir, each with its closure; a plugin whose closure
// does not resolve on the host is skipped. byName names modules by their
// soname (UCX loads lib<fw>_<name>.so.<N>) instead of their file name.
func (b *planBuilder) plugins(dir, gdir, role string, match *regexp.Regexp, bySoname bool) {
	ents, err := b.host.ReadDir(dir)
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, e := range ents {
		n := e.Name()
		if !match.MatchString(n) {
			continue
		}
		o, err := b.host.object(path.Join(dir, n))
		if err != nil || o.machine != b.host.machine {
			continue
		}
		name := n
		if bySoname && o.soname != "" {
			name = o.soname
		}
		key := gdir + "/" + name
		if seen[key] {
			continue
		}
		seen[key] = true
		if err := b.closure(o); err != nil {
			b.p.Skipped = append(b.p.Skipped, fmt.Sprintf("%s: %v", b.host.HostPath(path.Join(dir, n)), err))
			continue
		}
		b.p.plugins = append(b.p.plugins, o)
		b.p.Files = append(b.p.Files, PlanFile{Host: b.host.HostPath(o.path), Dir: gdir, Name: name, Role: role, Why: "plugin directory " + dir})
	}
}

// pluginDirs returns the existing directories named sub next to the
// library o as installed: UCX loads modules from <dir of libucs>/ucx,
// libfabric providers live in <libdir>/libfabric, PMIx components in
// <libdir>/pmix (their compiled-in defaults).
func pluginDirs(host *Root, o *object, sub string) []string {
	var out []string
	seen := map[string]bool{}
	for _, d := range []string{path.Dir(o.path)} {
		p := path.Join(d, sub)
		if real, err := host.Resolve(p); err == nil && !seen[real] {
			if fi, err := os.Stat(host.HostPath(real)); err == nil && fi.IsDir() {
				seen[real] = true
				out = append(out, real)
			}
		}
	}
	return out
}

// ompiComponentDir finds Open MPI's component directory (pkglibdir:
// ${libdir}/openmpi upstream, ${libdir}/openmpi3 on Debian, whose libdir
// is .../openmpi/lib): the first directory holding mca_*.so among
// <dir>/openmpi* and <dir>/openmpi/lib/openmpi* for the directories of the
// library's link and real file.
func ompiComponentDir(host *Root, l *Library) string {
	for _, d := range []string{path.Dir(l.RealPath), path.Dir(l.Path)} {
		for _, pat := range []string{path.Join(d, "openmpi*"), path.Join(d, "openmpi", "lib", "openmpi*")} {
			for _, cand := range host.glob(pat) {
				real, err := host.Resolve(cand)
				if err != nil {
					continue
				}
				ents, err := os.ReadDir(host.HostPath(real))
				if err != nil {
					continue
				}
				for _, e := range ents {
					if strings.HasPrefix(e.Name(), "mca_") && strings.HasSuffix(e.Name(), ".so") {
						return real
					}
				}
			}
		}
	}
	return ""
}

// Environ applies the plan's environment to env (KEY=VALUE entries) and
// returns the result; env is not modified.
func (p *Plan) Environ(env []string) []string {
	out := make([]string, 0, len(env)+len(p.Env))
	idx := map[string]int{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	for _, e := range p.Env {
		v := e.Value
		if i, ok := idx[e.Name]; ok {
			if _, old, _ := strings.Cut(out[i], "="); e.Prepend && old != "" {
				v += ":" + old
			}
			out[i] = e.Name + "=" + v
			continue
		}
		idx[e.Name] = len(out)
		out = append(out, e.Name+"="+v)
	}
	return out
}

// Materialize copies the plan's files into dir laid out as GuestDir
// (dir/lib/libmpi.so.40, dir/lib/ucx/...), for sharing dir read-only into
// the guest or for running the plan on the host with GuestDir == dir.
// Files are copied, not linked: a share of symlinks to host paths would be
// dangling in the guest, and hard links cannot cross filesystems.
func (p *Plan) Materialize(ctx context.Context, dir string) error {
	for _, f := range p.Files {
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(p.GuestDir, f.Dir)
		if err != nil || strings.HasPrefix(rel, "..") {
			return fmt.Errorf("materialize %s: %s is not under %s", f.Name, f.Dir, p.GuestDir)
		}
		dst := filepath.Join(dir, rel, f.Name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("materialize: %w", err)
		}
		if err := copyFile(f.Host, dst); err != nil {
			return fmt.Errorf("materialize %s: %w", f.Name, err)
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
