package mpi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"sort"
	"strings"
)

// Verdict is the outcome of one rule.
type Verdict string

// Verdicts. Only VerdictFail makes an injection unsafe.
const (
	VerdictOK   Verdict = "ok"
	VerdictFail Verdict = "fail"
	VerdictWarn Verdict = "warn"
	VerdictSkip Verdict = "n/a"
)

// Components named in findings.
const (
	CompMPI      = "MPI"
	CompSymbols  = "MPI symbols"
	CompUCP      = "UCX ucp"
	CompUCT      = "UCX uct"
	CompUCS      = "UCX ucs"
	CompUCM      = "UCX ucm"
	CompFabric   = "libfabric"
	CompPMIx     = "PMIx"
	CompGlibc    = "glibc"
	CompShadowed = "replaced libraries"
	CompProgram  = "program"
	CompPlan     = "injection plan"
)

// Errors returned by Report.Err, matched with errors.Is.
var (
	// ErrUnsafe: at least one rule failed; injecting the host MPI is not
	// safe.
	ErrUnsafe = errors.New("injecting the host MPI is not safe")
	// ErrNoImageMPI: the image has no MPI library at all (also ErrUnsafe).
	ErrNoImageMPI = errors.New("image has no MPI library")
)

// Finding is the verdict of one rule for one library.
type Finding struct {
	Component string   `json:"component"`
	Host      *Library `json:"host,omitempty"`
	Image     *Library `json:"image,omitempty"`
	Verdict   Verdict  `json:"verdict"`
	Reason    string   `json:"reason"`
	// Rule names the rule's source.
	Rule string `json:"rule,omitempty"`
	// Missing lists the symbols or versions a failing rule found missing.
	Missing []string `json:"missing,omitempty"`
}

// Report is the result of comparing an image's MPI stack with the host's.
type Report struct {
	HostRoot  string `json:"host_root"`
	ImageRoot string `json:"image_root"`
	// Image is the image reference checked (set by CheckImage).
	Image   string `json:"image,omitempty"`
	Program string `json:"program,omitempty"`
	Mode    Mode   `json:"mode"`
	// Safe is true when no finding failed: injecting Plan is safe.
	Safe     bool      `json:"safe"`
	Findings []Finding `json:"findings"`
	Plan     *Plan     `json:"plan,omitempty"`
	// HostStack and ImageStack are what discovery found.
	HostStack  *Stack `json:"host_stack"`
	ImageStack *Stack `json:"image_stack"`
}

// Problems returns "component: reason" for every failing finding.
func (r *Report) Problems() []string {
	var out []string
	for _, f := range r.Findings {
		if f.Verdict == VerdictFail {
			out = append(out, f.Component+": "+f.Reason)
		}
	}
	return out
}

// Err summarizes the report as an error: nil when Safe; else ErrUnsafe
// (and ErrNoImageMPI when the image has no MPI) with the first problem
// and the count of the others, one line for a launcher or a CLI.
func (r *Report) Err() error {
	if r.Safe {
		return nil
	}
	ps := r.Problems()
	if f := r.Finding(CompMPI); f != nil && f.Verdict == VerdictFail && strings.HasPrefix(f.Reason, ErrNoImageMPI.Error()) {
		return fmt.Errorf("%w: %w", ErrUnsafe, ErrNoImageMPI)
	}
	if len(ps) == 0 {
		return ErrUnsafe
	}
	msg := ps[0]
	if len(ps) > 1 {
		msg += fmt.Sprintf(" (and %d more problem(s))", len(ps)-1)
	}
	return fmt.Errorf("%w: %s", ErrUnsafe, msg)
}

// Finding returns the first finding for component c, nil when none.
func (r *Report) Finding(c string) *Finding {
	for i := range r.Findings {
		if r.Findings[i].Component == c {
			return &r.Findings[i]
		}
	}
	return nil
}

// CheckOptions tune Check.
type CheckOptions struct {
	// Mode is the MPI version rule (DefaultMode when empty).
	Mode Mode
	// Program is the step's program: a path inside the image when it
	// exists there, else a path on the host. Its imports are checked too,
	// and its DT_NEEDED picks the image's MPI library.
	Program string
	// HostMPI is the host path of the MPI library to inject (a site's
	// tuned MPI outside the loader's path). Default: the host MPI library
	// of the image's family found by discovery.
	HostMPI string
	// GuestDir is where the plan puts the files (DefaultGuestDir).
	GuestDir string
	// Logger receives debug records (discarded when nil).
	Logger *slog.Logger
}

// Check compares the MPI stack of the image root imageRoot with the host
// root hostRoot ("/" for the host itself) and returns the report; it fails
// only when a root cannot be opened or ctx ends. The rules and their
// sources are documented on each check* function.
func Check(ctx context.Context, hostRoot, imageRoot string, o CheckOptions) (*Report, error) {
	host, err := OpenRoot(hostRoot)
	if err != nil {
		return nil, fmt.Errorf("mpi check: host %w", err)
	}
	defer host.Close()
	img, err := OpenRoot(imageRoot)
	if err != nil {
		return nil, fmt.Errorf("mpi check: image %w", err)
	}
	defer img.Close()
	return CheckRoots(ctx, host, img, o)
}

// checker carries one check's state.
type checker struct {
	ctx       context.Context
	o         CheckOptions
	host, img *Root
	hs, is    *Stack
	rep       *Report
	prog      *object // the program (in progRoot), nil when none
	progRoot  *Root
	hostMPI   *Library
	imgMPI    *Library
	plan      *Plan
	log       *slog.Logger
}

func (c *checker) add(f Finding) { c.rep.Findings = append(c.rep.Findings, f) }

// CheckRoots is Check on open roots.
func CheckRoots(ctx context.Context, host, img *Root, o CheckOptions) (*Report, error) {
	mode, err := ParseMode(string(o.Mode))
	if err != nil {
		return nil, err
	}
	o.Mode = mode
	c := &checker{ctx: ctx, o: o, host: host, img: img, log: o.Logger,
		rep: &Report{HostRoot: host.Dir, ImageRoot: img.Dir, Mode: mode, Program: o.Program}}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.hs, err = Discover(ctx, host); err != nil {
		return nil, err
	}
	if c.is, err = Discover(ctx, img); err != nil {
		return nil, err
	}
	c.rep.HostStack, c.rep.ImageStack = c.hs, c.is
	c.log.Debug("discovered", "host", c.hs.String(), "image", c.is.String())
	if err := c.run(); err != nil {
		return nil, err
	}
	c.rep.Safe = len(c.rep.Problems()) == 0
	return c.rep, nil
}

func (c *checker) run() error {
	c.loadProgram()
	if !c.pickMPI() {
		return c.ctx.Err()
	}
	c.checkVersion()
	plan, err := NewPlan(c.ctx, c.host, c.hostMPI, PlanOptions{GuestDir: c.o.GuestDir, Image: c.img, ImageStack: c.is})
	if err != nil {
		if c.ctx.Err() != nil {
			return c.ctx.Err()
		}
		c.add(Finding{Component: CompPlan, Host: c.hostMPI, Verdict: VerdictFail, Reason: err.Error()})
		return nil
	}
	c.plan = plan
	c.rep.Plan = plan
	if err := c.checkSymbols(); err != nil {
		return err
	}
	c.checkUCX()
	c.checkFabric()
	c.checkPMIx()
	c.checkGlibc()
	c.checkShadowed()
	c.checkProgramPath()
	return c.ctx.Err()
}

// loadProgram opens Program inside the image, or on the host when the
// image has no such file.
func (c *checker) loadProgram() {
	p := c.o.Program
	if p == "" {
		return
	}
	for _, r := range []*Root{c.img, c.host} {
		if r == c.host && !path.IsAbs(p) {
			continue
		}
		if _, err := r.Resolve(p); err != nil {
			continue
		}
		o, err := r.object(p)
		where := "image"
		if r == c.host {
			where = "host"
		}
		if err != nil {
			c.add(Finding{Component: CompProgram, Verdict: VerdictWarn,
				Reason: fmt.Sprintf("%s (in the %s) is not an ELF executable for this machine (%v): only the image's libraries are checked", p, where, err)})
			return
		}
		c.prog, c.progRoot = o, r
		c.rep.Program = fmt.Sprintf("%s (%s)", p, where)
		return
	}
	c.add(Finding{Component: CompProgram, Verdict: VerdictFail,
		Reason: fmt.Sprintf("program %s exists neither in the image nor on the host", p)})
}

// pickMPI chooses the image's MPI library (the one the program links, else
// the one of a family the host has) and the host's of the same family.
// It adds the failing finding and returns false when there is no pair.
func (c *checker) pickMPI() bool {
	if len(c.is.MPI) == 0 {
		c.add(Finding{Component: CompMPI, Verdict: VerdictFail, Reason: ErrNoImageMPI.Error() +
			" (looked for libmpi.so.N, libmpich.so.N, libmpi_cray.so.N and libmpi_abi.so.N defining MPI_Init in " + strings.Join(c.img.SearchDirs(), ", ") + " and the ld.so.cache)"})
		return false
	}
	if c.prog != nil {
		for _, n := range c.prog.needed {
			p, err := c.img.Lookup(n, c.prog.searchPath())
			if err != nil {
				continue
			}
			real, err := c.img.Resolve(p)
			if err != nil {
				continue
			}
			for _, l := range c.is.MPI {
				if l.RealPath == real {
					c.imgMPI = l
				}
			}
		}
		if c.imgMPI == nil {
			c.add(Finding{Component: CompProgram, Verdict: VerdictWarn,
				Reason: fmt.Sprintf("%s links no MPI library of the image (DT_NEEDED: %s): injection would not reach it", c.o.Program, strings.Join(c.prog.needed, ", "))})
		}
	}
	if c.o.HostMPI != "" {
		c.hostMPI = c.hostLibrary(c.o.HostMPI)
		if c.hostMPI == nil {
			return false
		}
	}
	if c.imgMPI == nil {
		for _, l := range c.is.MPI {
			if (c.hostMPI != nil && c.hostMPI.Family == l.Family) || (c.hostMPI == nil && c.hs.MPIOf(l.Family) != nil) {
				c.imgMPI = l
				break
			}
		}
		if c.imgMPI == nil {
			c.imgMPI = c.is.MPI[0]
		}
		if len(c.is.MPI) > 1 {
			var all []string
			for _, l := range c.is.MPI {
				all = append(all, l.Name+" ("+l.Impl+")")
			}
			c.add(Finding{Component: CompMPI, Host: c.hs.MPIOf(c.imgMPI.Family), Image: c.imgMPI, Verdict: VerdictWarn,
				Reason: fmt.Sprintf("the image has %d MPI libraries (%s); checked %s: pass the program to check the one the step uses", len(all), strings.Join(all, ", "), c.imgMPI.Name)})
		}
	}
	if c.hostMPI == nil {
		c.hostMPI = c.hs.MPIOf(c.imgMPI.Family)
	}
	if c.hostMPI == nil {
		var have []string
		for _, l := range c.hs.MPI {
			have = append(have, fmt.Sprintf("%s %s (%s)", l.Impl, l.Version, l.Name))
		}
		reason := "the host has no MPI library"
		if len(have) > 0 {
			reason = fmt.Sprintf("different MPI families: the image's %s %s (%s, %s ABI) cannot be replaced by the host's %s: families never mix",
				c.imgMPI.Impl, c.imgMPI.Version, c.imgMPI.Name, c.imgMPI.Family, strings.Join(have, ", "))
		}
		c.add(Finding{Component: CompMPI, Image: c.imgMPI, Verdict: VerdictFail, Reason: reason, Rule: ruleFamilies})
		return false
	}
	if c.hostMPI.Family != c.imgMPI.Family {
		c.add(Finding{Component: CompMPI, Host: c.hostMPI, Image: c.imgMPI, Verdict: VerdictFail, Rule: ruleFamilies,
			Reason: fmt.Sprintf("different MPI families: image %s (%s ABI), host %s (%s ABI): families never mix", c.imgMPI.Impl, c.imgMPI.Family, c.hostMPI.Impl, c.hostMPI.Family)})
		return false
	}
	return true
}

// hostLibrary describes the configured host MPI library at host path p.
func (c *checker) hostLibrary(p string) *Library {
	fail := func(why string) *Library {
		c.add(Finding{Component: CompMPI, Verdict: VerdictFail, Reason: fmt.Sprintf("host MPI %s: %s", p, why)})
		return nil
	}
	o, err := c.host.object(p)
	if err != nil {
		return fail(err.Error())
	}
	l := c.host.library(o.name(), p)
	if l == nil {
		return fail("not a shared library")
	}
	if err := c.host.syms(o); err != nil || !o.defines("MPI_Init", "") {
		return fail("does not define MPI_Init")
	}
	l.Family, l.Impl = classifyMPI(o.name(), o)
	if l.Family == "" {
		return fail("not a known MPI ABI family (Open MPI libmpi.so.40, MPICH libmpi.so.12/libmpich.so.12, MPI-5 libmpi_abi)")
	}
	c.host.mpiVersion(l, o)
	for _, hl := range c.hs.MPI {
		if hl.RealPath == l.RealPath {
			l.Aliases = hl.Aliases
		}
	}
	return l
}

const (
	ruleFamilies = "MPI ABI families (MPICH ABI Compatibility Initiative, https://www.mpich.org/abi/; Open MPI's own ABI; MPI-5.0 standard ABI)"
	ruleSarus    = "Sarus MPI hook, MPI_COMPATIBILITY_TYPE (doc/config/mpi-hook.rst)"
)

// checkVersion applies the version rule (see Mode) to the file versions of
// the soname chain (libmpi.so.40.30.4); the libraries' own version strings
// are reported alongside.
func (c *checker) checkVersion() {
	f := Finding{Component: CompMPI, Host: c.hostMPI, Image: c.imgMPI, Rule: ruleSarus}
	h, i := c.hostMPI, c.imgMPI
	err := compareVersions(c.o.Mode, h.FileVersion, i.FileVersion)
	what := "file versions"
	hv, iv := h.FileVersion, i.FileVersion
	// A library installed under its soname only (libmpi.so.40, as a
	// flattening copy leaves it) has no minor in its file name. Within one
	// implementation the release numbers order the same way, so full and
	// strict fall back to them: major.minor of the releases.
	if err != nil && c.o.Mode != ModeMajor && (len(h.FileVersion) < 2 || len(i.FileVersion) < 2) &&
		h.Impl == i.Impl && h.Version != "" && i.Version != "" {
		hv, iv = releaseVersion(h.Version), releaseVersion(i.Version)
		what = "release versions (the file names carry no minor)"
		err = compareVersions(c.o.Mode, hv, iv)
	}
	if err != nil {
		f.Verdict, f.Reason = VerdictFail, fmt.Sprintf("%s %s: %v", i.Impl, i.Name, err)
		if what != "file versions" {
			f.Reason += " comparing " + what
		}
	} else {
		f.Verdict = VerdictOK
		f.Reason = fmt.Sprintf("same family (%s); %s host %s, image %s pass mode %s", h.Impl, what, hv, iv, c.o.Mode)
		if h.Version != "" && i.Version != "" && what == "file versions" {
			f.Reason += fmt.Sprintf("; releases host %s, image %s", h.Version, i.Version)
		}
	}
	c.add(f)
}

// hasMPIPrefix reports whether name is an MPI interface symbol: MPI_ and
// PMPI_ (the standard's C bindings and profiling interface, MPI-4.1 §15.2)
// and the MPIX_ extensions.
func hasMPIPrefix(name string) bool {
	for _, p := range []string{"MPI_", "PMPI_", "MPIX_", "PMPIX_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// checkSymbols is the rule beyond Sarus: a same-soname pair can still be
// incompatible (Open MPI 5 symbols missing from 4.1's libmpi.so.40; the
// MPI-4 large-count "_c" functions missing from an MPICH-3-based host).
// Every symbol that the image's MPI consumers (libraries in the image's
// search directories that link the image's MPI, and the program) import
// and that is an MPI interface symbol (MPI_, PMPI_, MPIX_) or is defined
// by the image MPI libraries being replaced (Open MPI's ompi_mpi_comm_world
// and the other predefined-handle objects) must be defined by the
// libraries the plan injects, with the same symbol version when the
// import is versioned. Weak imports are exempt: a missing weak symbol
// resolves to NULL by design. A data object an executable takes through a
// COPY relocation (mpicc-built programs take ompi_mpi_comm_world and the
// other handles so) is an import too, although the executable's symbol
// table shows it defined, and the injected definition must have the size
// the executable reserved: ld.so copies the smaller of the two sizes and
// the library then works on the executable's copy (glibc elf/dl-reloc:
// "Symbol `%s' has different size in shared object, consider re-linking").
func (c *checker) checkSymbols() error {
	f := Finding{Component: CompSymbols, Host: c.hostMPI, Image: c.imgMPI, Rule: "ELF dynamic linking: every non-weak undefined symbol must be defined by a loaded object (System V ABI; debug/elf DynamicSymbols)"}
	// The image's libraries the plan replaces, and what they define.
	replaced := map[string]bool{} // image real paths
	replacedNames := map[string]bool{}
	imgDefs := map[string]bool{}
	for _, pf := range c.plan.Files {
		if pf.Dir != path.Join(c.plan.GuestDir, "lib") {
			continue
		}
		p, err := c.img.Lookup(pf.Name, nil)
		if err != nil {
			continue
		}
		o, err := c.img.object(p)
		if err != nil {
			continue
		}
		replaced[o.path] = true
		replacedNames[pf.Name] = true
		if familyInternal.MatchString(pf.Name) {
			if err := c.img.syms(o); err == nil {
				for n := range o.defs {
					imgDefs[n] = true
				}
			}
		}
	}
	mpiNames := map[string]bool{}
	for _, n := range c.imgMPI.sonames() {
		mpiNames[n] = true
	}
	// The consumers.
	type consumer struct {
		o    *object
		r    *Root
		name string
	}
	var consumers []consumer
	seen := map[string]bool{}
	for _, d := range c.img.SearchDirs() {
		ents, err := c.img.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if err := c.ctx.Err(); err != nil {
				return err
			}
			if !strings.Contains(e.Name(), ".so") || e.IsDir() {
				continue
			}
			o, err := c.img.object(path.Join(d, e.Name()))
			if err != nil || seen[o.path] || replaced[o.path] || o.machine != c.img.machine {
				continue
			}
			seen[o.path] = true
			for _, n := range o.needed {
				if mpiNames[n] || (replacedNames[n] && familyInternal.MatchString(n)) {
					consumers = append(consumers, consumer{o, c.img, o.path})
					break
				}
			}
		}
	}
	if c.prog != nil {
		consumers = append(consumers, consumer{c.prog, c.progRoot, c.o.Program})
	}
	// What the injected libraries define (plugins are dlopened, never
	// bound to by name).
	hostObjs := make([]*object, 0, len(c.plan.objs))
	for _, n := range sortedKeys(c.plan.objs) {
		o := c.plan.objs[n]
		if err := c.host.syms(o); err != nil {
			f.Verdict, f.Reason = VerdictFail, err.Error()
			c.add(f)
			return nil
		}
		hostObjs = append(hostObjs, o)
	}
	checked := 0
	var missing []string
	for _, cs := range consumers {
		if err := cs.r.syms(cs.o); err != nil {
			f.Missing = append(f.Missing, fmt.Sprintf("(%s unreadable: %v)", cs.name, err))
			continue
		}
		for _, im := range cs.o.imports {
			if !hasMPIPrefix(im.Name) && !imgDefs[im.Name] {
				continue
			}
			checked++
			s := im.Name
			if im.Version != "" {
				s += "@" + im.Version
			}
			var def *object
			for _, ho := range hostObjs {
				if ho.defines(im.Name, im.Version) {
					def = ho
					break
				}
			}
			switch {
			case def == nil:
				missing = append(missing, fmt.Sprintf("%s (imported by %s)", s, cs.name))
			case im.Copy && def.sizes[im.Name] != im.Size:
				missing = append(missing, fmt.Sprintf("%s (copied by %s: %d bytes, but %s defines %d)", s, cs.name, im.Size, def.name(), def.sizes[im.Name]))
			}
		}
	}
	sort.Strings(missing)
	f.Missing = append(missing, f.Missing...)
	if len(missing) > 0 {
		f.Verdict = VerdictFail
		names := make([]string, 0, len(missing))
		for _, m := range missing {
			names = append(names, strings.SplitN(m, " ", 2)[0])
		}
		names = slices.Compact(names)
		if len(names) > 8 {
			names = append(names[:8], fmt.Sprintf("and %d more", len(names)-8))
		}
		f.Reason = fmt.Sprintf("the host %s lacks %d symbol(s) the image uses: %s", c.hostMPI.Name, len(missing), strings.Join(names, ", "))
	} else if len(consumers) == 0 {
		f.Verdict = VerdictOK
		f.Reason = "no image library outside the replaced MPI links " + c.imgMPI.Name + " (give the program to check its imports)"
	} else {
		f.Verdict = VerdictOK
		f.Reason = fmt.Sprintf("%d MPI symbol references from %d image object(s) all defined by the injected libraries", checked, len(consumers))
	}
	c.add(f)
	return nil
}

// injected reports whether the plan injects a library named with prefix.
func (c *checker) injected(prefix string) bool {
	for n := range c.plan.objs {
		if strings.HasPrefix(n, prefix) {
			return true
		}
	}
	return false
}

// checkUCX: UCX's four libraries are one installation (one version for
// ucp, uct, ucs and ucm; UCX ships them together and checks nothing
// between them at run time), and the host's minor must be >= the image's:
// UCX's own rule in ucp_init_version (src/ucp/core/ucp_context.c), which
// warns "UCP version is incompatible" when the library's major differs
// from the API the caller was built with or its minor is older.
func (c *checker) checkUCX() {
	const rule = "UCX: ucp_init_version (src/ucp/core/ucp_context.c): same major, library minor >= API minor; ucp/uct/ucs/ucm of one release"
	type row struct {
		comp      string
		host, img *Library
	}
	rows := []row{{CompUCP, c.hs.UCP, c.is.UCP}, {CompUCT, c.hs.UCT, c.is.UCT}, {CompUCS, c.hs.UCS, c.is.UCS}, {CompUCM, c.hs.UCM, c.is.UCM}}
	inj := c.injected("libucp.so.") || c.injected("libuct.so.") || c.injected("libucs.so.") || c.injected("libucm.so.")
	// The version the image's UCX users were built against: libucp's.
	imgVer := ""
	if c.is.UCP != nil {
		imgVer = c.is.UCP.Version
	}
	hostVer := ""
	if c.hs.UCP != nil {
		hostVer = c.hs.UCP.Version
	}
	for _, r := range rows {
		f := Finding{Component: r.comp, Host: r.host, Image: r.img, Rule: rule}
		switch {
		case !inj:
			f.Verdict, f.Reason = VerdictSkip, "not injected: the host MPI does not load UCX; the image keeps its own"
		case r.host == nil:
			f.Verdict, f.Reason = VerdictFail, "the host MPI loads UCX but the host has no "+strings.TrimPrefix(r.comp, "UCX ")+" library"
		case r.host.Version == "" || r.host.Version != hostVer:
			f.Verdict, f.Reason = VerdictFail, fmt.Sprintf("the host's %s is not from the same UCX installation as its libucp (%s): ucp/uct/ucs/ucm must be one version", r.host.Name, hostVer)
		case r.img == nil && imgVer == "":
			f.Verdict, f.Reason = VerdictOK, "the image has no UCX; the host's "+hostVer+" is injected"
		default:
			hv, iv := releaseVersion(hostVer), releaseVersion(imgVer)
			hm, _ := hv.at(0)
			im, iok := iv.at(0)
			hn, _ := hv.at(1)
			in, _ := iv.at(1)
			switch {
			case !iok:
				f.Verdict, f.Reason = VerdictWarn, "the image's UCX version is unknown; the host's "+hostVer+" is injected"
			case hm != im:
				f.Verdict, f.Reason = VerdictFail, fmt.Sprintf("UCX majors differ: host %s, image %s", hostVer, imgVer)
			case hn < in:
				f.Verdict, f.Reason = VerdictFail, fmt.Sprintf("the image's UCX %s is newer than the host's %s (host minor must be >= image minor)", imgVer, hostVer)
			default:
				f.Verdict, f.Reason = VerdictOK, fmt.Sprintf("host UCX %s replaces image UCX %s (host minor >= image minor)", hostVer, imgVer)
			}
		}
		c.add(f)
	}
}

// checkFabric: libfabric versions its symbols (FABRIC_1.0 ... FABRIC_1.x):
// the host's library must define every version node the image's does, and
// the sonames' majors must match (libfabric's ABI rules,
// man fi_version(3) and the FABRIC_x.y version script).
func (c *checker) checkFabric() {
	f := Finding{Component: CompFabric, Host: c.hs.Fabric, Image: c.is.Fabric, Rule: "libfabric: symbol versions FABRIC_1.x (libfabric.map); soname major"}
	switch {
	case !c.injected("libfabric.so."):
		f.Verdict, f.Reason = VerdictSkip, "not injected: the host MPI does not load libfabric; the image keeps its own"
	case c.is.Fabric == nil:
		f.Verdict, f.Reason = VerdictOK, "the image has no libfabric; the host's is injected"
	default:
		if err := c.verdefSuperset(c.hs.Fabric, c.is.Fabric, &f); err != nil {
			f.Verdict, f.Reason = VerdictFail, err.Error()
		} else if c.hs.Fabric.Name != c.is.Fabric.Name {
			f.Verdict, f.Reason = VerdictFail, fmt.Sprintf("sonames differ: host %s, image %s", c.hs.Fabric.Name, c.is.Fabric.Name)
		} else {
			f.Verdict, f.Reason = VerdictOK, fmt.Sprintf("host libfabric %s defines every symbol version of the image's %s", c.hs.Fabric.Version, c.is.Fabric.Version)
		}
	}
	c.add(f)
}

// verdefSuperset fails when img's library defines a symbol version host's
// does not (binaries linked against img's would not load).
func (c *checker) verdefSuperset(host, img *Library, f *Finding) error {
	ho, err := c.host.object(host.RealPath)
	if err != nil {
		return err
	}
	iobj, err := c.img.object(img.RealPath)
	if err != nil {
		return err
	}
	if err := c.host.syms(ho); err != nil {
		return err
	}
	if err := c.img.syms(iobj); err != nil {
		return err
	}
	var miss []string
	for _, v := range iobj.verdefs {
		if !slices.Contains(ho.verdefs, v) {
			miss = append(miss, v)
		}
	}
	if len(miss) > 0 {
		f.Missing = miss
		return fmt.Errorf("the host's %s lacks symbol version(s) %s that the image's copy defines", host.Name, strings.Join(miss, ", "))
	}
	return nil
}

// checkPMIx: the ranks' PMIx client must speak to the host's server
// (Slurm's). OpenPMIx promises cross-version compatibility between client
// and server from v2.1.1 on (OpenPMIx wiki, "How does PMIx work with
// containers?", and the Open MPI PMIx cross-version matrix, 2018: first
// cross-version compatible releases 1.2.5, 2.0.3, 2.1.1, 3.0.0); below
// that the majors must be equal. When the plan injects libpmix the client
// is the host's own library.
func (c *checker) checkPMIx() {
	f := Finding{Component: CompPMIx, Host: c.hs.PMIx, Image: c.is.PMIx, Rule: "OpenPMIx cross-version compatibility (v2.1.1 and later interoperate; older: equal majors)"}
	switch {
	case c.injected("libpmix.so."):
		f.Verdict, f.Reason = VerdictOK, "the host's libpmix is injected: client and server are the same library"
	case c.is.PMIx == nil:
		f.Verdict, f.Reason = VerdictSkip, "the image has no PMIx: its MPI does not use PMIx (PMI-1/PMI-2 through PMI_FD instead)"
	case c.hs.PMIx == nil:
		f.Verdict, f.Reason = VerdictWarn, "the host has no libpmix: srun --mpi=pmix is not available, only PMI-2"
	default:
		hv, iv := releaseVersion(c.hs.PMIx.Version), releaseVersion(c.is.PMIx.Version)
		if err := pmixCompatible(hv, iv); err != nil {
			f.Verdict, f.Reason = VerdictFail, err.Error()
		} else {
			f.Verdict, f.Reason = VerdictOK, fmt.Sprintf("image client %s and host server %s are cross-version compatible", c.is.PMIx.Version, c.hs.PMIx.Version)
		}
	}
	c.add(f)
}

// pmixCompatible applies the PMIx client/server rule (see checkPMIx).
func pmixCompatible(server, client Version) error {
	if len(server) == 0 || len(client) == 0 {
		return fmt.Errorf("PMIx version unknown (server %q, client %q)", server, client)
	}
	min := Version{2, 1, 1}
	if server.Compare(min) >= 0 && client.Compare(min) >= 0 {
		return nil
	}
	if server[0] == client[0] {
		return nil
	}
	return fmt.Errorf("PMIx client %s and server %s: majors differ and one is older than 2.1.1 (the first cross-version compatible release)", client, server)
}

// checkGlibc: the C library stays the image's, so every GLIBC_x.y (and
// other glibc) version the injected files require (their SHT_GNU_verneed
// entries for glibc's sonames) must be defined by the image's copy
// (SHT_GNU_verdef) — else the loader refuses with "version `GLIBC_2.xx'
// not found".
func (c *checker) checkGlibc() {
	f := Finding{Component: CompGlibc, Host: c.hs.Libc, Image: c.is.Libc, Rule: "ELF symbol versioning: verneed of the injected files vs verdef of the image's glibc"}
	needs := map[string]map[string][]string{} // soname -> version -> users
	var files []*object
	for _, n := range sortedKeys(c.plan.objs) {
		files = append(files, c.plan.objs[n])
	}
	files = append(files, c.plan.plugins...)
	for _, o := range files {
		if err := c.host.syms(o); err != nil {
			continue
		}
		for lib, vs := range o.verneeds {
			if !isGlibc(lib) {
				continue
			}
			if needs[lib] == nil {
				needs[lib] = map[string][]string{}
			}
			for _, v := range vs {
				needs[lib][v] = append(needs[lib][v], o.name())
			}
		}
	}
	var missing []string
	var maxGlibc Version
	for _, lib := range sortedKeys(needs) {
		var defs []string
		found := false
		if p, err := c.img.Lookup(lib, nil); err == nil {
			if o, err := c.img.object(p); err == nil && c.img.syms(o) == nil {
				defs, found = o.verdefs, true
			}
		}
		if !found {
			var users []string
			for _, us := range needs[lib] {
				users = append(users, us...)
			}
			users = slices.Compact(slices.Sorted(slices.Values(users)))
			if len(users) > 3 {
				users = append(users[:3], "...")
			}
			missing = append(missing, fmt.Sprintf("%s (not in the image; needed by %s)", lib, strings.Join(users, ", ")))
			continue
		}
		for _, v := range sortedKeys(needs[lib]) {
			if strings.HasPrefix(v, "GLIBC_") {
				if gv := releaseVersion(strings.TrimPrefix(v, "GLIBC_")); gv.Compare(maxGlibc) > 0 {
					maxGlibc = gv
				}
			}
			if defs == nil || !slices.Contains(defs, v) {
				users := slices.Compact(slices.Sorted(slices.Values(needs[lib][v])))
				if len(users) > 3 {
					users = append(users[:3], "...")
				}
				missing = append(missing, fmt.Sprintf("%s from %s (needed by %s)", v, lib, strings.Join(users, ", ")))
			}
		}
	}
	imgVer := "(version unknown)"
	if c.is.Libc != nil && c.is.Libc.Version != "" {
		imgVer = c.is.Libc.Version
	}
	if len(missing) > 0 {
		sort.SliceStable(missing, func(i, j int) bool {
			return releaseVersion(strings.TrimPrefix(missing[i], "GLIBC_")).Compare(releaseVersion(strings.TrimPrefix(missing[j], "GLIBC_"))) > 0
		})
		f.Verdict, f.Missing = VerdictFail, missing
		f.Reason = fmt.Sprintf("the image's glibc %s lacks %d of the versions or libraries the injected files need (first: %s)", imgVer, len(missing), strings.SplitN(missing[0], " ", 2)[0])
	} else {
		f.Verdict = VerdictOK
		f.Reason = fmt.Sprintf("the injected files need at most GLIBC_%s; the image's glibc %s defines every version they need", maxGlibc, imgVer)
	}
	c.add(f)
}

// checkShadowed: a dependency the plan injects (libz, libhwloc, libstdc++,
// libgfortran, ...) also serves the image's own programs, because it comes
// first in the search path. The host copy must define every symbol version
// the image's copy defines (else an image binary linked against the newer
// copy fails to load); for unversioned libraries an older host file
// version is reported as a warning.
func (c *checker) checkShadowed() {
	f := Finding{Component: CompShadowed, Rule: "ELF symbol versioning (verdef) of same-soname libraries"}
	var replaced, miss, warn []string
	for _, pf := range c.plan.Files {
		if pf.Role != RoleDependency || familyInternal.MatchString(pf.Name) || ucxName.MatchString(pf.Name) ||
			fabricName.MatchString(pf.Name) || pmixName.MatchString(pf.Name) {
			continue
		}
		p, err := c.img.Lookup(pf.Name, nil)
		if err != nil {
			continue
		}
		iobj, err := c.img.object(p)
		if err != nil {
			continue
		}
		ho := c.plan.objs[pf.Name]
		if ho == nil || c.host.syms(ho) != nil || c.img.syms(iobj) != nil {
			continue
		}
		replaced = append(replaced, pf.Name)
		var lack []string
		for _, v := range iobj.verdefs {
			if !slices.Contains(ho.verdefs, v) {
				lack = append(lack, v)
			}
		}
		if len(lack) > 0 {
			miss = append(miss, fmt.Sprintf("%s: %s", pf.Name, strings.Join(lack, ", ")))
			continue
		}
		if len(iobj.verdefs) == 0 && fileVersion(ho.path).Compare(fileVersion(iobj.path)) < 0 {
			warn = append(warn, fmt.Sprintf("%s: host %s older than image %s", pf.Name, fileVersion(ho.path), fileVersion(iobj.path)))
		}
	}
	switch {
	case len(miss) > 0:
		f.Verdict, f.Missing = VerdictFail, miss
		f.Reason = "host libraries that would replace the image's lack symbol versions the image's copies define: " + strings.Join(miss, "; ")
	case len(warn) > 0:
		f.Verdict, f.Missing = VerdictWarn, warn
		f.Reason = "unversioned host libraries older than the image's copies would replace them: " + strings.Join(warn, "; ")
	case len(replaced) == 0:
		f.Verdict, f.Reason = VerdictOK, "no injected dependency replaces a library of the image"
	default:
		f.Verdict, f.Reason = VerdictOK, fmt.Sprintf("%d injected dependencies replace the image's copies (%s); each defines every symbol version the image's does", len(replaced), strings.Join(replaced, ", "))
	}
	c.add(f)
}

// checkProgramPath: the plan wins through LD_LIBRARY_PATH, which the
// loader searches after an executable's DT_RPATH (but before DT_RUNPATH;
// ld.so(8), "Rpath token expansion" and the search order). A program whose
// DT_RPATH lists an image directory that holds a library of the plan would
// load the image's copy.
func (c *checker) checkProgramPath() {
	if c.prog == nil {
		return
	}
	f := Finding{Component: CompProgram, Rule: "ld.so(8) search order: DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH, ld.so.cache, defaults"}
	if len(c.prog.runpath) > 0 || len(c.prog.rpath) == 0 {
		f.Verdict, f.Reason = VerdictOK, c.o.Program+" has no DT_RPATH: LD_LIBRARY_PATH puts the injected libraries first"
		c.add(f)
		return
	}
	var hits []string
	for _, d := range c.prog.searchPath() {
		for n := range c.plan.objs {
			if _, err := c.progRoot.object(path.Join(d, n)); err == nil {
				hits = append(hits, path.Join(d, n))
			}
		}
	}
	sort.Strings(hits)
	if len(hits) > 0 {
		f.Verdict, f.Missing = VerdictFail, hits
		f.Reason = fmt.Sprintf("%s's DT_RPATH (%s) is searched before LD_LIBRARY_PATH and holds %s: the image's copies would win (relink with -Wl,--enable-new-dtags)", c.o.Program, strings.Join(c.prog.rpath, ":"), strings.Join(hits, ", "))
	} else {
		f.Verdict, f.Reason = VerdictOK, c.o.Program+"'s DT_RPATH holds none of the injected libraries"
	}
	c.add(f)
}
