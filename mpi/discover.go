package mpi

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Family is an MPI ABI family. Libraries of different families never
// replace one another.
type Family string

// The families, told apart by soname and by the symbols they define:
//   - Open MPI: libmpi.so.40 (Open MPI 3.x, 4.x and 5.x; older series used
//     other majors, 1.10 even libmpi.so.12) defining ompi_mpi_comm_world,
//     the object MPI_COMM_WORLD points to in Open MPI's ABI.
//   - MPICH ABI: libmpi.so.12 / libmpich.so.12 (and Cray's libmpi_cray.so.12)
//     without Open MPI's objects: MPICH >= 3.1, Intel MPI >= 5.0, Cray
//     MPT/MPICH >= 7.0, MVAPICH2 >= 2.0, per the MPICH ABI Compatibility
//     Initiative (https://www.mpich.org/abi/), where handles are integers.
//   - MPI ABI: libmpi_abi.so, the standard ABI of MPI 5.0 (chapter
//     "Application Binary Interface"), with MPI_Abi_get_version.
const (
	FamilyOpenMPI Family = "openmpi"
	FamilyMPICH   Family = "mpich"
	FamilyMPIABI  Family = "mpi-abi"
)

// Library is one shared library found in a root.
type Library struct {
	// Name is the soname the loader looks for (libmpi.so.40).
	Name string `json:"name"`
	// Aliases are other sonames that resolve to the same file (MPICH's
	// libmpi.so.12 next to libmpich.so.12).
	Aliases []string `json:"aliases,omitempty"`
	// Path is where the loader finds Name, inside the root.
	Path string `json:"path"`
	// RealPath is Path with every symlink followed inside the root.
	RealPath string `json:"real_path"`
	// HostPath is RealPath as a path on the machine running the check.
	HostPath string `json:"host_path"`
	// FileVersion holds the numbers after ".so." in RealPath's name: the
	// soname chain's version (libmpi.so.40.30.4 -> 40.30.4).
	FileVersion Version `json:"file_version"`
	// Version is the library's own release string ("4.1.4"), "" when it
	// carries none that could be read; VersionFrom says where it came from.
	Version     string `json:"version,omitempty"`
	VersionFrom string `json:"version_from,omitempty"`
	// Family and Impl are set for MPI libraries: the ABI family and the
	// implementation ("Open MPI", "MPICH", "Intel MPI", "MVAPICH",
	// "Cray MPICH").
	Family Family `json:"family,omitempty"`
	Impl   string `json:"impl,omitempty"`
}

// describe is "Path (RealPath's version, own version)" for people.
func (l *Library) describe() string {
	if l == nil {
		return "none"
	}
	s := l.RealPath
	var vs []string
	if l.Impl != "" {
		vs = append(vs, l.Impl)
	}
	if l.Version != "" {
		vs = append(vs, l.Version)
	}
	if len(l.FileVersion) > 0 {
		vs = append(vs, "file "+l.FileVersion.String())
	}
	if len(vs) > 0 {
		s += " (" + strings.Join(vs, ", ") + ")"
	}
	return s
}

// Stack is the MPI-related software found in one root.
type Stack struct {
	// Root is the host path of the root directory.
	Root string `json:"root"`
	// MPI lists every MPI library found, one per real file.
	MPI []*Library `json:"mpi"`
	// UCP, UCT, UCS and UCM are UCX's four libraries.
	UCP *Library `json:"ucp,omitempty"`
	UCT *Library `json:"uct,omitempty"`
	UCS *Library `json:"ucs,omitempty"`
	UCM *Library `json:"ucm,omitempty"`
	// Fabric is libfabric.
	Fabric *Library `json:"libfabric,omitempty"`
	// PMIx is libpmix.
	PMIx *Library `json:"pmix,omitempty"`
	// Libc is the C library (libc.so.6) with its glibc release.
	Libc *Library `json:"libc,omitempty"`
}

// MPIOf returns the stack's MPI library of family f, nil when none.
func (s *Stack) MPIOf(f Family) *Library {
	for _, l := range s.MPI {
		if l.Family == f {
			return l
		}
	}
	return nil
}

var (
	mpiName    = regexp.MustCompile(`^lib(mpi|mpich|mpi_cray|mpi_abi)\.so\.\d+$`)
	ucxName    = regexp.MustCompile(`^libuc([ptsm])\.so\.\d+$`)
	fabricName = regexp.MustCompile(`^libfabric\.so\.\d+$`)
	pmixName   = regexp.MustCompile(`^libpmix\.so\.\d+$`)

	intelVersion = regexp.MustCompile(`Intel\(R\) MPI Library (\d+(?:\.\d+)*)`)
	pmixVersion  = regexp.MustCompile(`OpenPMIx (\d+\.\d+\.\d+[a-z0-9]*)`)
	pmixVersion2 = regexp.MustCompile(`PMIx (?:v)?(\d+\.\d+\.\d+[a-z0-9]*)`)
	glibcVersion = regexp.MustCompile(`release version (\d+\.\d+(?:\.\d+)?)`)
)

// Discover finds the MPI stack of root r: every MPI library, UCX, libfabric,
// PMIx and the C library, through r's ld.so.cache and library directories.
// Libraries that are absent are nil; Discover fails only when ctx ends.
func Discover(ctx context.Context, r *Root) (*Stack, error) {
	s := &Stack{Root: r.Dir}
	if err := s.discoverMPI(ctx, r); err != nil {
		return nil, err
	}
	for name, p := range r.Names(ucxName.MatchString) {
		l := r.library(name, p)
		if l == nil {
			continue
		}
		switch ucxName.FindStringSubmatch(name)[1] {
		case "p":
			s.UCP = pickNewer(s.UCP, l)
		case "t":
			s.UCT = pickNewer(s.UCT, l)
		case "s":
			s.UCS = pickNewer(s.UCS, l)
		case "m":
			s.UCM = pickNewer(s.UCM, l)
		}
	}
	if s.UCP != nil {
		if v, ok := r.returnedString(s.UCP.RealPath, "ucp_get_version_string"); ok {
			s.UCP.Version, s.UCP.VersionFrom = v, "ucp_get_version_string()"
		} else if v, ok := r.uniqueDottedVersion(s.UCP.RealPath); ok {
			s.UCP.Version, s.UCP.VersionFrom = v, "read-only data"
		}
		// uct, ucs and ucm carry no version string of their own: they are
		// credited with libucp's when they come from the same directory
		// with the same file version (one UCX installation).
		for _, l := range []*Library{s.UCT, s.UCS, s.UCM} {
			if l != nil && path.Dir(l.RealPath) == path.Dir(s.UCP.RealPath) && l.FileVersion.Compare(s.UCP.FileVersion) == 0 {
				l.Version, l.VersionFrom = s.UCP.Version, "libucp in the same directory"
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for name, p := range r.Names(fabricName.MatchString) {
		if l := r.library(name, p); l != nil {
			s.Fabric = pickNewer(s.Fabric, l)
		}
	}
	if s.Fabric != nil {
		if v, ok := r.uniqueDottedVersion(s.Fabric.RealPath); ok {
			s.Fabric.Version, s.Fabric.VersionFrom = v, "read-only data (PACKAGE_VERSION)"
		}
	}
	for name, p := range r.Names(pmixName.MatchString) {
		if l := r.library(name, p); l != nil {
			s.PMIx = pickNewer(s.PMIx, l)
		}
	}
	if s.PMIx != nil {
		if v, ok := r.rodataMatch(s.PMIx.RealPath, pmixVersion); ok {
			s.PMIx.Version, s.PMIx.VersionFrom = v, `read-only data ("OpenPMIx X.Y.Z", what PMIx_Get_version returns)`
		} else if v, ok := r.rodataMatch(s.PMIx.RealPath, pmixVersion2); ok {
			s.PMIx.Version, s.PMIx.VersionFrom = v, `read-only data ("PMIx X.Y.Z")`
		}
	}
	if p, err := r.Lookup("libc.so.6", nil); err == nil {
		if l := r.library("libc.so.6", p); l != nil {
			if v, ok := r.rodataMatch(l.RealPath, glibcVersion); ok {
				l.Version, l.VersionFrom = v, `read-only data ("release version X.Y", gnu_get_libc_version)`
			}
			s.Libc = l
		}
	}
	return s, ctx.Err()
}

// library describes the library the loader finds as name at in-root path
// p, nil when it is not a usable ELF object.
func (r *Root) library(name, p string) *Library {
	links, real, err := r.resolveChain(p)
	if err != nil {
		return nil
	}
	_ = links
	if _, err := r.object(real); err != nil {
		return nil
	}
	return &Library{Name: name, Path: p, RealPath: real, HostPath: r.HostPath(real), FileVersion: fileVersion(real)}
}

// pickNewer keeps the library with the higher soname major when two majors
// of one library are installed (the newer ABI).
func pickNewer(have, l *Library) *Library {
	if have == nil || fileVersion(l.Name).Compare(fileVersion(have.Name)) > 0 {
		return l
	}
	return have
}

// discoverMPI finds the MPI libraries, one per real file, with family,
// implementation and version.
func (s *Stack) discoverMPI(ctx context.Context, r *Root) error {
	byReal := map[string]*Library{}
	names := r.Names(mpiName.MatchString)
	keys := make([]string, 0, len(names))
	for k := range names {
		keys = append(keys, k)
	}
	// Prefer the canonical names as the primary one: libmpi.so.N, then
	// libmpich.so.N, then the rest.
	sort.Slice(keys, func(i, j int) bool {
		return mpiNameRank(keys[i]) < mpiNameRank(keys[j]) || (mpiNameRank(keys[i]) == mpiNameRank(keys[j]) && keys[i] < keys[j])
	})
	for _, name := range keys {
		if err := ctx.Err(); err != nil {
			return err
		}
		l := r.library(name, names[name])
		if l == nil {
			continue
		}
		if have, ok := byReal[l.RealPath]; ok {
			have.Aliases = append(have.Aliases, name)
			continue
		}
		o, _ := r.object(l.RealPath)
		if err := r.syms(o); err != nil || !o.defines("MPI_Init", "") {
			continue // a stub or an unrelated library with a similar name
		}
		l.Family, l.Impl = classifyMPI(name, o)
		if l.Family == "" {
			continue
		}
		r.mpiVersion(l, o)
		byReal[l.RealPath] = l
		s.MPI = append(s.MPI, l)
	}
	return nil
}

func mpiNameRank(n string) int {
	switch {
	case strings.HasPrefix(n, "libmpi.so."):
		return 0
	case strings.HasPrefix(n, "libmpich.so."):
		return 1
	}
	return 2
}

// classifyMPI tells the family of an MPI library by soname and symbols.
func classifyMPI(name string, o *object) (Family, string) {
	ompi := o.defines("ompi_mpi_comm_world", "")
	switch {
	case strings.HasPrefix(name, "libmpi_abi.so."):
		if ompi {
			return FamilyMPIABI, "Open MPI"
		}
		return FamilyMPIABI, "MPICH"
	case ompi:
		return FamilyOpenMPI, "Open MPI"
	case strings.HasPrefix(name, "libmpich.so.12"), strings.HasPrefix(name, "libmpi.so.12"), strings.HasPrefix(name, "libmpi_cray.so.12"):
		return FamilyMPICH, "MPICH"
	}
	return "", ""
}

// mpiVersion fills the implementation's own version string.
func (r *Root) mpiVersion(l *Library, o *object) {
	switch l.Impl {
	case "Open MPI":
		if v, ok := r.symbolString(l.RealPath, "ompi_version_string"); ok {
			l.Version, l.VersionFrom = v, "ompi_version_string"
		}
		return
	}
	for _, sym := range []string{"MPII_Version_string", "MPIR_Version_string"} {
		if v, ok := r.symbolString(l.RealPath, sym); ok {
			l.Version, l.VersionFrom = v, sym
			break
		}
	}
	b, err := r.rodata(l.RealPath, 256<<20)
	if err != nil {
		return
	}
	switch {
	case bytes.Contains(b, []byte("Intel(R) MPI Library")):
		l.Impl = "Intel MPI"
		if m := intelVersion.FindSubmatch(b); m != nil {
			l.Version, l.VersionFrom = string(m[1]), `read-only data ("Intel(R) MPI Library X")`
		}
	case bytes.Contains(b, []byte("MVAPICH")):
		l.Impl = "MVAPICH"
	case bytes.Contains(b, []byte("CRAY MPICH")) || bytes.Contains(b, []byte("Cray MPICH")) || strings.HasPrefix(l.Name, "libmpi_cray"):
		l.Impl = "Cray MPICH"
	}
}

// String summarizes the stack for logs.
func (s *Stack) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "root %s:", s.Root)
	for _, l := range s.MPI {
		fmt.Fprintf(&b, " mpi=%s", l.describe())
	}
	for _, l := range []*Library{s.UCP, s.Fabric, s.PMIx, s.Libc} {
		if l != nil {
			fmt.Fprintf(&b, " %s=%s", l.Name, l.describe())
		}
	}
	return b.String()
}

// sonames returns l's name and aliases.
func (l *Library) sonames() []string { return append([]string{l.Name}, l.Aliases...) }

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
