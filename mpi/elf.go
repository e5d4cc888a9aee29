package mpi

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"path"
	"regexp"
	"runtime"
	"strings"
)

// maxObjectSize bounds the shared objects parsed (libmpich.so.12 is 41 MB;
// nothing legitimate comes near this).
const maxObjectSize = 2 << 30

// object holds the facts of one ELF shared object or executable that the
// rules need. The dynamic section is read when the object is first seen;
// symbols only when asked for (syms).
type object struct {
	path    string // in-root real path (no symlinks)
	machine uint16
	soname  string
	needed  []string
	runpath []string // DT_RUNPATH entries, raw ($ORIGIN unexpanded)
	rpath   []string // DT_RPATH entries, raw

	symsDone bool
	symsErr  error
	defs     map[string][]string // defined name -> versions ("" when unversioned)
	sizes    map[string]uint64   // defined data object name -> st_size (bytes)
	imports  []imported          // undefined, non-weak dynamic symbols, and copy-relocated ones
	verdefs  []string            // version names defined (not the BASE entry)
	verneeds map[string][]string // needed file -> version names required from it
}

// imported is one symbol an object needs from elsewhere.
type imported struct {
	Name    string
	Version string // "" when unversioned
	Library string // the verneed file the version belongs to, when versioned
	// Copy is set for a data object the executable holds a copy of (a
	// COPY relocation): it looks defined in the executable's dynamic
	// symbol table, but the loader fills it from the library that defines
	// it, Size bytes (st_size).
	Copy bool
	Size uint64
}

// hostMachine is the ELF machine of the running process: only objects for
// it are considered, as the loader ignores the others.
func hostMachine() uint16 {
	switch runtime.GOARCH {
	case "amd64":
		return uint16(elf.EM_X86_64)
	case "arm64":
		return uint16(elf.EM_AARCH64)
	case "ppc64le", "ppc64":
		return uint16(elf.EM_PPC64)
	case "riscv64":
		return uint16(elf.EM_RISCV)
	case "386":
		return uint16(elf.EM_386)
	}
	return 0
}

// object returns the parsed facts of the ELF object at in-root path p
// (links followed inside the root), cached per real path.
func (r *Root) object(p string) (*object, error) {
	real, err := r.Resolve(p)
	if err != nil {
		return nil, err
	}
	if o, ok := r.objects[real]; ok {
		if o == nil {
			return nil, fmt.Errorf("%s: not an ELF shared object", r.HostPath(real))
		}
		return o, nil
	}
	o, err := r.parseObject(real)
	r.objects[real] = o
	if err != nil {
		return nil, err
	}
	return o, nil
}

func (r *Root) openELF(real string) (*elf.File, func(), error) {
	f, err := r.Open(real)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() < 64 || fi.Size() > maxObjectSize {
		f.Close()
		return nil, nil, fmt.Errorf("%s: not a regular file of a plausible ELF size", r.HostPath(real))
	}
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil || string(magic[:]) != elf.ELFMAG {
		f.Close()
		return nil, nil, fmt.Errorf("%s: not an ELF file", r.HostPath(real))
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", r.HostPath(real), err)
	}
	return ef, func() { ef.Close(); f.Close() }, nil
}

// recovered turns a panic of debug/elf on a malformed (untrusted) file into
// an error.
func recovered(what string, err *error) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("%s: malformed ELF file: %v", what, p)
	}
}

func (r *Root) parseObject(real string) (_ *object, err error) {
	defer recovered(r.HostPath(real), &err)
	ef, done, err := r.openELF(real)
	if err != nil {
		return nil, err
	}
	defer done()
	if ef.Type != elf.ET_DYN && ef.Type != elf.ET_EXEC {
		return nil, fmt.Errorf("%s: ELF type %v is not an executable or shared object", r.HostPath(real), ef.Type)
	}
	o := &object{path: real, machine: uint16(ef.Machine)}
	if s, _ := ef.DynString(elf.DT_SONAME); len(s) > 0 {
		o.soname = s[0]
	}
	o.needed, _ = ef.DynString(elf.DT_NEEDED)
	for _, v := range dynStrings(ef, elf.DT_RUNPATH) {
		o.runpath = append(o.runpath, strings.Split(v, ":")...)
	}
	for _, v := range dynStrings(ef, elf.DT_RPATH) {
		o.rpath = append(o.rpath, strings.Split(v, ":")...)
	}
	return o, nil
}

func dynStrings(ef *elf.File, tag elf.DynTag) []string {
	s, _ := ef.DynString(tag)
	return s
}

// name is the name the loader knows the object by: DT_SONAME, else its file
// name.
func (o *object) name() string {
	if o.soname != "" {
		return o.soname
	}
	return path.Base(o.path)
}

// searchPath expands the object's DT_RUNPATH (or, without one, DT_RPATH)
// into in-root directories: $ORIGIN/${ORIGIN} become the object's own
// directory, $LIB "lib64"/"lib" variants are not guessed (dropped), as are
// relative entries (relative to the process cwd, unknowable here).
func (o *object) searchPath() []string {
	raw := o.runpath
	if len(raw) == 0 {
		raw = o.rpath
	}
	var out []string
	for _, d := range raw {
		d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", "$ORIGIN"), "$ORIGIN", path.Dir(o.path))
		if d == "" || !strings.HasPrefix(d, "/") || strings.Contains(d, "$") {
			continue
		}
		out = append(out, path.Clean(d))
	}
	return out
}

// syms reads the object's dynamic symbols and version sections.
func (r *Root) syms(o *object) (err error) {
	if o.symsDone {
		return o.symsErr
	}
	o.symsDone = true
	defer func() {
		if err != nil {
			o.symsErr = err
		}
	}()
	defer recovered(r.HostPath(o.path), &err) // runs first: recover must be called by the deferred function itself
	ef, done, err := r.openELF(o.path)
	if err != nil {
		o.symsErr = err
		return err
	}
	defer done()
	o.defs = map[string][]string{}
	o.verneeds = map[string][]string{}
	ds, err := ef.DynamicSymbols()
	if err != nil && err != elf.ErrNoSymbols {
		o.symsErr = fmt.Errorf("%s: dynamic symbols: %w", r.HostPath(o.path), err)
		return o.symsErr
	}
	copied, err := copyRelocated(ef)
	if err != nil {
		o.symsErr = fmt.Errorf("%s: dynamic relocations: %w", r.HostPath(o.path), err)
		return o.symsErr
	}
	o.sizes = map[string]uint64{}
	for i, s := range ds {
		if s.Name == "" {
			continue
		}
		bind := elf.ST_BIND(s.Info)
		if copied[i+1] && s.Section != elf.SHN_UNDEF {
			// DynamicSymbols omits the null symbol: ds[i] is index i+1.
			o.imports = append(o.imports, imported{Name: s.Name, Version: s.Version, Library: s.Library, Copy: true, Size: s.Size})
			continue
		}
		if s.Section == elf.SHN_UNDEF {
			if bind == elf.STB_GLOBAL {
				o.imports = append(o.imports, imported{Name: s.Name, Version: s.Version, Library: s.Library})
			}
			continue
		}
		if bind != elf.STB_GLOBAL && bind != elf.STB_WEAK && bind != elf.STB_LOOS {
			continue
		}
		if elf.ST_VISIBILITY(s.Other) == elf.STV_HIDDEN || elf.ST_VISIBILITY(s.Other) == elf.STV_INTERNAL {
			continue
		}
		o.defs[s.Name] = append(o.defs[s.Name], s.Version)
		if elf.ST_TYPE(s.Info) == elf.STT_OBJECT {
			o.sizes[s.Name] = s.Size
		}
	}
	if vds, err := ef.DynamicVersions(); err == nil {
		for _, v := range vds {
			if v.Flags&elf.VER_FLG_BASE != 0 {
				continue
			}
			o.verdefs = append(o.verdefs, v.Name)
		}
	}
	if vns, err := ef.DynamicVersionNeeds(); err == nil {
		for _, n := range vns {
			for _, d := range n.Needs {
				o.verneeds[n.Name] = append(o.verneeds[n.Name], d.Dep)
			}
		}
	}
	return nil
}

// copyRelocType is the COPY relocation of each machine (System V ABI
// processor supplements: R_X86_64_COPY, R_386_COPY, R_AARCH64_COPY,
// R_PPC64_COPY, R_RISCV_COPY).
var copyRelocType = map[elf.Machine]uint32{
	elf.EM_X86_64:  uint32(elf.R_X86_64_COPY),
	elf.EM_386:     uint32(elf.R_386_COPY),
	elf.EM_AARCH64: uint32(elf.R_AARCH64_COPY),
	elf.EM_PPC64:   uint32(elf.R_PPC64_COPY),
	elf.EM_RISCV:   uint32(elf.R_RISCV_COPY),
}

// maxRelocSection bounds one relocation section read (libmpich.so.12's
// .rela.dyn is about 100 KB).
const maxRelocSection = 256 << 20

// copyRelocated returns the dynamic symbol indexes (as in the file: 0 is
// the null symbol) that a COPY relocation targets. Executables reach the
// data objects of shared libraries that way (non-PIC code and x86-64 PIE
// built by GCC >= 5): the linker reserves a copy in the executable and
// gives it a defined symbol, and at load time ld.so copies the library's
// object there (glibc elf/dl-reloc, R_X86_64_COPY), so the symbol is an
// import of that library's, not a definition of the executable's.
// Relocation sections are those of type SHT_RELA/SHT_REL linked to the
// dynamic symbol table.
func copyRelocated(ef *elf.File) (map[int]bool, error) {
	typ, ok := copyRelocType[ef.Machine]
	if !ok {
		return nil, nil
	}
	dynsym := -1
	for i, s := range ef.Sections {
		if s.Type == elf.SHT_DYNSYM {
			dynsym = i
		}
	}
	out := map[int]bool{}
	for _, s := range ef.Sections {
		if (s.Type != elf.SHT_RELA && s.Type != elf.SHT_REL) || int(s.Link) != dynsym || dynsym < 0 {
			continue
		}
		if s.Size > maxRelocSection {
			return nil, fmt.Errorf("%s: %d bytes, more than the %d allowed", s.Name, s.Size, maxRelocSection)
		}
		b, err := s.Data()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		bo := ef.ByteOrder
		switch {
		case ef.Class == elf.ELFCLASS64:
			n := 16 // Elf64_Rel: r_offset, r_info
			if s.Type == elf.SHT_RELA {
				n = 24 // Elf64_Rela adds r_addend
			}
			for ; len(b) >= n; b = b[n:] {
				info := bo.Uint64(b[8:16])
				if uint32(info) == typ {
					out[int(info>>32)] = true
				}
			}
		case ef.Class == elf.ELFCLASS32:
			n := 8 // Elf32_Rel
			if s.Type == elf.SHT_RELA {
				n = 12
			}
			for ; len(b) >= n; b = b[n:] {
				info := bo.Uint32(b[4:8])
				if info&0xff == typ {
					out[int(info>>8)] = true
				}
			}
		}
	}
	return out, nil
}

// defines reports whether the object exports name, with version ver when
// ver is set (an unversioned definition satisfies a versioned reference:
// ld.so only warns then).
func (o *object) defines(name, ver string) bool {
	vs, ok := o.defs[name]
	if !ok {
		return false
	}
	if ver == "" {
		return true
	}
	for _, v := range vs {
		if v == ver || v == "" {
			return true
		}
	}
	return false
}

// rodata returns the contents of the object's read-only, allocated,
// non-executable PROGBITS sections (.rodata and friends), where compilers
// put string literals, at most max bytes in all.
func (r *Root) rodata(real string, max int64) (_ []byte, err error) {
	defer recovered(r.HostPath(real), &err)
	ef, done, err := r.openELF(real)
	if err != nil {
		return nil, err
	}
	defer done()
	var buf bytes.Buffer
	for _, s := range ef.Sections {
		if s.Type != elf.SHT_PROGBITS || s.Flags&elf.SHF_ALLOC == 0 || s.Flags&(elf.SHF_WRITE|elf.SHF_EXECINSTR) != 0 {
			continue
		}
		if int64(buf.Len())+int64(s.Size) > max {
			break
		}
		if _, err := io.Copy(&buf, s.Open()); err != nil {
			return nil, fmt.Errorf("%s: read %s: %w", r.HostPath(real), s.Name, err)
		}
	}
	return buf.Bytes(), nil
}

// readAt reads n bytes at virtual address addr of the object, from the
// section holding it.
func readAt(ef *elf.File, addr uint64, n int) ([]byte, error) {
	for _, s := range ef.Sections {
		if s.Flags&elf.SHF_ALLOC == 0 || s.Type == elf.SHT_NOBITS || addr < s.Addr || addr >= s.Addr+s.Size {
			continue
		}
		if rem := s.Addr + s.Size - addr; uint64(n) > rem {
			n = int(rem)
		}
		b := make([]byte, n)
		if _, err := s.ReadAt(b, int64(addr-s.Addr)); err != nil && err != io.EOF {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("address %#x is in no section", addr)
}

func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// symbolString returns the NUL-terminated string stored at exported data
// symbol name (e.g. ompi_version_string, MPII_Version_string).
func (r *Root) symbolString(real, name string) (_ string, ok bool) {
	var err error
	defer recovered(r.HostPath(real), &err)
	ef, done, err := r.openELF(real)
	if err != nil {
		return "", false
	}
	defer done()
	s, ok := definedSymbol(ef, name, elf.STT_OBJECT)
	if !ok {
		return "", false
	}
	b, err := readAt(ef, s.Value, 256)
	if err != nil {
		return "", false
	}
	v := cString(b)
	return v, printable(v)
}

// definedSymbol finds the dynamic symbol name of type typ that ef defines.
func definedSymbol(ef *elf.File, name string, typ elf.SymType) (elf.Symbol, bool) {
	ds, err := ef.DynamicSymbols()
	if err != nil {
		return elf.Symbol{}, false
	}
	for _, s := range ds {
		if s.Name == name && s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == typ {
			return s, true
		}
	}
	return elf.Symbol{}, false
}

// returnedString decodes a function of the form `lea rax,[rip+d]; ret`
// (x86-64: 48 8d 05 d32 c3), which is what a C function returning a string
// literal compiles to (ucp_get_version_string), and returns that string.
func (r *Root) returnedString(real, fn string) (_ string, ok bool) {
	var err error
	defer recovered(r.HostPath(real), &err)
	ef, done, err := r.openELF(real)
	if err != nil || ef.Machine != elf.EM_X86_64 {
		if done != nil {
			done()
		}
		return "", false
	}
	defer done()
	s, ok := definedSymbol(ef, fn, elf.STT_FUNC)
	if !ok {
		return "", false
	}
	code, err := readAt(ef, s.Value, 8)
	if err != nil || len(code) < 8 || code[0] != 0x48 || code[1] != 0x8d || code[2] != 0x05 || code[7] != 0xc3 {
		return "", false
	}
	disp := int32(binary.LittleEndian.Uint32(code[3:7]))
	b, err := readAt(ef, uint64(int64(s.Value)+7+int64(disp)), 256)
	if err != nil {
		return "", false
	}
	v := cString(b)
	return v, printable(v) && v != ""
}

func printable(s string) bool {
	for _, c := range s {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// rodataMatch returns the first submatch of re in the object's read-only
// data (the whole match when re has no group).
func (r *Root) rodataMatch(real string, re *regexp.Regexp) (string, bool) {
	b, err := r.rodata(real, 256<<20)
	if err != nil {
		return "", false
	}
	m := re.FindSubmatch(b)
	if m == nil {
		return "", false
	}
	if len(m) > 1 {
		return string(m[1]), true
	}
	return string(m[0]), true
}

// uniqueDottedVersion returns the only NUL-delimited string of the form
// N.N.N[suffix] in the object's read-only data, when there is exactly one
// distinct such string (libfabric's PACKAGE_VERSION, "1.17.0").
func (r *Root) uniqueDottedVersion(real string) (string, bool) {
	b, err := r.rodata(real, 256<<20)
	if err != nil {
		return "", false
	}
	found := ""
	for _, piece := range bytes.Split(b, []byte{0}) {
		if len(piece) > 32 || !dottedString.Match(piece) {
			continue
		}
		if v := string(piece); found != "" && v != found {
			return "", false
		} else {
			found = v
		}
	}
	return found, found != ""
}

var dottedString = regexp.MustCompile(`^\d+\.\d+\.\d+[a-z0-9]*$`)
