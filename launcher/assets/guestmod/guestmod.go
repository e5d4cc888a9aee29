// Package guestmod loads the kernel modules that launcher/assets packed into
// the guest initramfs. It is meant for a static (CGO_ENABLED=0) PID 1: it
// needs no /proc, no /sys, no modprobe and no depmod files, only the order
// file written by the host and the .ko files next to it.
//
// The order file is <root>/lib/modules/<release>/microvm.order. Each line is
// a path relative to that directory, dependencies first, optionally followed
// by flags separated by spaces; '#' starts a comment line:
//
//	# slurm-microvm module load order for 6.1.0-57-amd64
//	kernel/drivers/virtio/virtio.ko
//	kernel/crypto/crc32c-intel.ko optional
//	kernel/crypto/crc32c_generic.ko optional
//	kernel/lib/libcrc32c.ko
//	kernel/fs/erofs/erofs.ko
//
// The flag "optional" marks a module that was pulled in through a soft
// dependency (modules.softdep, resolved through modules.alias, as modprobe
// does). A softdep alias can name several implementations, some of which need
// CPU features the guest may not have (crc32c-intel needs SSE4.2, which QEMU's
// default TCG CPU lacks: finit_module returns ENODEV), so their failure is
// reported in Result but is not an error. A failing non-optional module is an
// error naming it.
//
// u-root's pkg/kmodule was the alternative: it resolves modules.dep itself but
// ignores modules.softdep (erofs then fails to load: libcrc32c finds no crc32c
// transform) and needs the depmod files in the guest. Resolution happens once
// on the host instead, so the guest only walks a list.
package guestmod

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// OrderFile is the name of the load-order file inside /lib/modules/<release>.
const OrderFile = "microvm.order"

// FlagOptional marks an entry whose load failure is not an error.
const FlagOptional = "optional"

// FlagBoot marks an entry the guest needs before its agent can serve: the
// dependency closure of the required modules (console, root disk, erofs,
// overlay). The rest is loaded when a feature needs it: under TCG every
// module costs boot time (about 12 ms each, measured).
const FlagBoot = "boot"

// FlagShare marks the closure of the host-share modules (9p over virtio),
// loaded when a step has host mounts.
const FlagShare = "share"

// FlagNet marks the closure of the network device's modules (virtio_net),
// loaded when a step has a network.
const FlagNet = "net"

// Entry is one line of the order file.
type Entry struct {
	// Path is relative to /lib/modules/<release>, e.g. "kernel/fs/erofs/erofs.ko".
	Path string `json:"path"`
	// Optional is set for modules pulled in only as soft dependencies.
	Optional bool `json:"optional,omitempty"`
	// Boot is set for modules needed before the agent serves.
	Boot bool `json:"boot,omitempty"`
	// Share is set for modules host shares need (9p).
	Share bool `json:"share,omitempty"`
	// Net is set for modules the network device needs (virtio_net).
	Net bool `json:"net,omitempty"`
}

// Name is the kernel's name for the module: the file name without ".ko",
// with '-' replaced by '_' (the kernel does the same, see modules.dep(5)).
func (e Entry) Name() string { return ModuleName(e.Path) }

// ModuleName turns a module path or file name into the kernel's module name:
// "kernel/arch/x86/crypto/crc32c-intel.ko" -> "crc32c_intel". Compression
// suffixes (.xz, .zst, .gz) are dropped too.
func ModuleName(p string) string {
	b := path.Base(p)
	for _, s := range []string{".xz", ".zst", ".gz"} {
		b = strings.TrimSuffix(b, s)
	}
	b = strings.TrimSuffix(b, ".ko")
	return strings.ReplaceAll(b, "-", "_")
}

// WriteOrder writes entries in order file syntax, with a leading comment
// naming the kernel release.
func WriteOrder(w io.Writer, release string, entries []Entry) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# slurm-microvm module load order for %s; dependencies first\n", release)
	for _, e := range entries {
		if e.Path == "" || strings.ContainsAny(e.Path, " \t\n") || path.IsAbs(e.Path) {
			return fmt.Errorf("write module order: bad module path %q (want a relative path without spaces)", e.Path)
		}
		line := e.Path
		if e.Optional {
			line += " " + FlagOptional
		}
		if e.Boot {
			line += " " + FlagBoot
		}
		if e.Share {
			line += " " + FlagShare
		}
		if e.Net {
			line += " " + FlagNet
		}
		fmt.Fprintln(bw, line)
	}
	return bw.Flush()
}

// ParseOrder reads order file syntax. Unknown flags are an error so that a
// newer host format is not silently misread by an older guest.
func ParseOrder(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		e := Entry{Path: f[0]}
		if path.IsAbs(e.Path) || strings.HasPrefix(path.Clean(e.Path), "..") {
			return nil, fmt.Errorf("module order line %d: path %q must be relative to the modules directory", n, e.Path)
		}
		for _, flag := range f[1:] {
			switch flag {
			case FlagOptional:
				e.Optional = true
			case FlagBoot:
				e.Boot = true
			case FlagShare:
				e.Share = true
			case FlagNet:
				e.Net = true
			default:
				return nil, fmt.Errorf("module order line %d: unknown flag %q (known: %s, %s, %s, %s)", n, flag, FlagOptional, FlagBoot, FlagShare, FlagNet)
			}
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read module order: %w", err)
	}
	return out, nil
}

// ModuleError is the failure to load one module.
type ModuleError struct {
	Module string // kernel module name, e.g. "erofs"
	Path   string // absolute path of the .ko file
	Err    error
}

func (e *ModuleError) Error() string {
	return fmt.Sprintf("load module %s (%s): %v", e.Module, e.Path, e.Err)
}

func (e *ModuleError) Unwrap() error { return e.Err }

// Config says where to find the modules.
type Config struct {
	// Root is the filesystem root holding lib/modules; "" means "/".
	Root string
	// Release is the kernel release; "" means the running kernel (uname -r).
	Release string
	// BootOnly loads only the entries marked boot.
	BootOnly bool
	// ShareOnly loads only the entries marked share.
	ShareOnly bool
	// NetOnly loads only the entries marked net.
	NetOnly bool
}

// Result says what Load did, module names in load order.
type Result struct {
	Loaded         []string       // newly loaded
	AlreadyPresent []string       // finit_module said EEXIST
	OptionalFailed []*ModuleError // optional modules that failed (not an error)
}

// LoadAll loads every module of the order file of the running kernel under
// root ("" means "/"), in order. A module that is already loaded (EEXIST) is
// fine. It goes on after a failure, so that independent modules still load,
// and returns all failures of non-optional modules joined; each is a
// *ModuleError naming the module. A missing order file is an error
// (wrapping fs.ErrNotExist): the initramfs was not built for this kernel.
func LoadAll(ctx context.Context, root string) error {
	_, err := Load(ctx, Config{Root: root})
	return err
}

// Load is LoadAll with a Config and a Result.
func Load(ctx context.Context, c Config) (Result, error) {
	var res Result
	root := c.Root
	if root == "" {
		root = "/"
	}
	rel := c.Release
	if rel == "" {
		var u unix.Utsname
		if err := unix.Uname(&u); err != nil {
			return res, fmt.Errorf("load modules: uname: %w", err)
		}
		rel = unix.ByteSliceToString(u.Release[:])
	}
	dir := filepath.Join(root, "lib", "modules", rel)
	orderPath := filepath.Join(dir, OrderFile)
	f, err := os.Open(orderPath)
	if err != nil {
		return res, fmt.Errorf("load modules for kernel %s: %w", rel, err)
	}
	entries, err := ParseOrder(f)
	f.Close()
	if err != nil {
		return res, fmt.Errorf("load modules for kernel %s: %s: %w", rel, orderPath, err)
	}
	var errs []error
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("load modules: %w", err)
		}
		if (c.BootOnly && !e.Boot) || (c.ShareOnly && !e.Share) || (c.NetOnly && !e.Net) {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(e.Path))
		err := finit(p)
		switch {
		case err == nil:
			res.Loaded = append(res.Loaded, e.Name())
		case errors.Is(err, unix.EEXIST):
			res.AlreadyPresent = append(res.AlreadyPresent, e.Name())
		default:
			me := &ModuleError{Module: e.Name(), Path: p, Err: err}
			if e.Optional {
				res.OptionalFailed = append(res.OptionalFailed, me)
			} else {
				errs = append(errs, me)
			}
		}
	}
	return res, errors.Join(errs...)
}

// finit loads one module file with finit_module(2), no parameters.
func finit(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	for {
		err = unix.FinitModule(int(f.Fd()), "", 0)
		if err != unix.EINTR {
			return err
		}
	}
}
