package fs

import (
	"fmt"
	"strconv"
	"strings"
)

// QEMUValue returns s as one literal value inside a QEMU option string
// ("key=value,key=value"): QEMU's option parser (util/qemu-option.c)
// splits on ',' and reads ",," as one literal comma, so every ',' is
// doubled. '=' needs no escape in a value. A NUL or a newline cannot be
// carried by any escape (argv strings end at NUL; QEMU's -readconfig and
// monitor are line based) and is an error, as is an empty value.
//
// With the escape, a source named "/data,readonly=off" becomes
// "path=/data,,readonly=off": one path, and readonly stays what the caller
// set. The launcher shares opened file descriptors (path=/proc/self/fd/N),
// so user paths never reach the command line at all; this is the second
// line of defence for every string that does.
func QEMUValue(s string) (string, error) {
	if s == "" {
		return "", fmt.Errorf("qemu option value is empty")
	}
	if strings.ContainsAny(s, "\x00\n\r") {
		return "", fmt.Errorf("qemu option value %q contains a NUL or newline, which no escape can carry", s)
	}
	return strings.ReplaceAll(s, ",", ",,"), nil
}

// validID reports whether s is usable as a QEMU object id or a mount tag:
// QEMU ids must start with a letter and hold only letters, digits, '-',
// '.' and '_' (util/id.c id_wellformed); tags are limited to the same set
// here so that they need no escape anywhere (kernel command line, mount
// data).
func validID(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case i > 0 && (c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'):
		default:
			return false
		}
	}
	return true
}

// Maximum tag lengths: virtio-9p's mount_tag is a 16-bit length string, but
// the guest kernel matches at most 31 bytes in practice; virtio-fs' tag is
// 36 bytes (virtio spec 5.11.4).
const (
	maxNinePTag     = 31
	maxVirtioFSTag  = 36
	maxQEMUIDLength = 127
)

// ProcFDPath is the path by which a process reaches its own file
// descriptor fd. Given to QEMU as a share's path, QEMU opens the object the
// launcher already opened (as the user, see OpenAs) instead of resolving a
// name again: QEMU's local 9p backend opens its root once with
// open(path, O_DIRECTORY) (hw/9pfs/9p-local.c local_init) and works
// relative to that descriptor afterwards.
func ProcFDPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// 9p security models of QEMU's local fsdev (docs/system/invocation.rst
// -fsdev). SecurityNone is the one used, with QEMU running as the job's
// user: files are accessed and created with QEMU's own credentials, and
// the guest's chown, chmod and mknod are applied with them too
// (hw/9pfs/9p-local.c), so they succeed exactly where the user's would on
// the host and the guest's root is the job user there. Under a root QEMU
// the same requests would make root-owned setuid files and device nodes:
// never share with a root QEMU (launcher/qemu refuses it).
// SecurityPassthrough asks the host to chown to the guest's uids and needs
// a root QEMU: never with user data.
const (
	SecurityNone        = "none"
	SecurityPassthrough = "passthrough"
	SecurityMappedXattr = "mapped-xattr"
)

// Virtio transports of a share: on -M microvm the virtio-mmio "-device"
// variants, on q35/pc the PCI ones.
const (
	NinePDeviceMMIO     = "virtio-9p-device"
	NinePDevicePCI      = "virtio-9p-pci"
	VirtioFSDeviceMMIO  = "vhost-user-fs-device"
	VirtioFSDevicePCI   = "vhost-user-fs-pci"
	defaultNinePDevice  = NinePDeviceMMIO
	defaultVirtioFSDev  = VirtioFSDeviceMMIO
	defaultNinePSecMode = SecurityNone
)

// NineP is one host directory exported to the guest with QEMU's built-in
// 9p server (-fsdev local + a virtio-9p device).
type NineP struct {
	// ID names the fsdev (QEMU id syntax, e.g. "smv0").
	ID string
	// Tag is the mount tag the guest mounts (mount -t 9p TAG DIR).
	Tag string
	// Path is the directory QEMU exports. Use ProcFDPath of the descriptor
	// returned by OpenAs (passed to QEMU as an inherited fd) so that QEMU
	// shares the opened object; any other path is escaped.
	Path string
	// ReadOnly makes QEMU refuse every modifying 9p request (readonly=on):
	// enforced by the host whatever the guest mounts or remounts, for the
	// whole tree including submounts of the source.
	ReadOnly bool
	// SecurityModel is SecurityNone (default) or another QEMU model.
	SecurityModel string
	// Device is NinePDeviceMMIO (default) or NinePDevicePCI.
	Device string
}

// Args returns the two QEMU options of the share:
//
//	-fsdev local,id=ID,path=PATH,security_model=none,multidevs=remap[,readonly=on]
//	-device virtio-9p-device,fsdev=ID,mount_tag=TAG
//
// multidevs=remap gives files of submounts of the source (a Lustre or GPFS
// tree usually has some) distinct inode numbers in the guest instead of
// QEMU's warning and colliding inodes. Every field is validated; the path
// is escaped with QEMUValue.
func (s NineP) Args() ([]string, error) {
	if !validID(s.ID, maxQEMUIDLength) {
		return nil, fmt.Errorf("9p share: id %q is not a QEMU id (a letter, then letters, digits, '-', '.', '_')", s.ID)
	}
	if !validID(s.Tag, maxNinePTag) {
		return nil, fmt.Errorf("9p share %s: tag %q must be 1-%d letters, digits, '-', '.', '_', starting with a letter", s.ID, s.Tag, maxNinePTag)
	}
	if !strings.HasPrefix(s.Path, "/") {
		return nil, fmt.Errorf("9p share %s: path %q must be absolute", s.ID, s.Path)
	}
	path, err := QEMUValue(s.Path)
	if err != nil {
		return nil, fmt.Errorf("9p share %s: %w", s.ID, err)
	}
	model := s.SecurityModel
	if model == "" {
		model = defaultNinePSecMode
	}
	switch model {
	case SecurityNone, SecurityPassthrough, SecurityMappedXattr, "mapped-file":
	default:
		return nil, fmt.Errorf("9p share %s: unknown security model %q", s.ID, model)
	}
	dev := s.Device
	if dev == "" {
		dev = defaultNinePDevice
	}
	if dev != NinePDeviceMMIO && dev != NinePDevicePCI {
		return nil, fmt.Errorf("9p share %s: unknown device %q (want %s or %s)", s.ID, dev, NinePDeviceMMIO, NinePDevicePCI)
	}
	fsdev := "local,id=" + s.ID + ",path=" + path + ",security_model=" + model + ",multidevs=remap"
	if s.ReadOnly {
		fsdev += ",readonly=on"
	}
	return []string{"-fsdev", fsdev, "-device", dev + ",fsdev=" + s.ID + ",mount_tag=" + s.Tag}, nil
}

// VirtioFS is one share served by an external vhost-user-fs daemon
// (virtiofsd) over a unix socket.
type VirtioFS struct {
	// ID names the chardev (QEMU id syntax).
	ID string
	// Tag is what the guest mounts (mount -t virtiofs TAG DIR).
	Tag string
	// Socket is virtiofsd's --socket-path (escaped).
	Socket string
	// Device is VirtioFSDeviceMMIO (default) or VirtioFSDevicePCI.
	Device string
	// QueueSize of the request queue; 0 leaves QEMU's default (128).
	QueueSize int
}

// Args returns
//
//	-chardev socket,id=ID,path=SOCKET
//	-device vhost-user-fs-device,chardev=ID,tag=TAG[,queue-size=N]
//
// A guest with any virtio-fs share also needs VirtioFSMachineArgs once.
func (s VirtioFS) Args() ([]string, error) {
	if !validID(s.ID, maxQEMUIDLength) {
		return nil, fmt.Errorf("virtio-fs share: id %q is not a QEMU id", s.ID)
	}
	if !validID(s.Tag, maxVirtioFSTag) {
		return nil, fmt.Errorf("virtio-fs share %s: tag %q must be 1-%d letters, digits, '-', '.', '_', starting with a letter", s.ID, s.Tag, maxVirtioFSTag)
	}
	if !strings.HasPrefix(s.Socket, "/") {
		return nil, fmt.Errorf("virtio-fs share %s: socket %q must be absolute", s.ID, s.Socket)
	}
	sock, err := QEMUValue(s.Socket)
	if err != nil {
		return nil, fmt.Errorf("virtio-fs share %s: %w", s.ID, err)
	}
	dev := s.Device
	if dev == "" {
		dev = defaultVirtioFSDev
	}
	if dev != VirtioFSDeviceMMIO && dev != VirtioFSDevicePCI {
		return nil, fmt.Errorf("virtio-fs share %s: unknown device %q", s.ID, dev)
	}
	d := dev + ",chardev=" + s.ID + ",tag=" + s.Tag
	if s.QueueSize > 0 {
		d += ",queue-size=" + strconv.Itoa(s.QueueSize)
	}
	return []string{"-chardev", "socket,id=" + s.ID + ",path=" + sock, "-device", d}, nil
}

// VirtioFSMachineArgs returns what a QEMU guest of memMiB MiB needs once for
// vhost-user-fs: guest RAM that the daemon can map (a shared memfd backend
// named "mem", given to the machine) and, on -M microvm, modern (non-legacy)
// virtio-mmio, which vhost-user-fs requires (measured with QEMU 7.2: the
// device fails to start on legacy virtio-mmio).
func VirtioFSMachineArgs(memMiB uint64) []string {
	return []string{
		"-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", memMiB),
		"-machine", "memory-backend=mem",
		"-global", "virtio-mmio.force-legacy=false",
	}
}

// VirtiofsdArgs returns the arguments of QEMU 7.2's C virtiofsd
// (/usr/lib/qemu/virtiofsd) serving source on socket. virtiofsd parses -o
// with libfuse's option parser, which splits on ',' and treats '\\' as an
// escape; rather than rely on that second escaping language, source and
// socket must be plain paths without ',', '\\', NUL or newline, which is
// always true of the paths the launcher chooses itself (a per-step
// directory holding the read-only bind of the opened source). cache is
// "auto", "always" or "none" ("" means auto).
//
// The C virtiofsd must start as root, has no read-only option and switches
// its fs credentials to the guest's uid for every request: see doc.go for
// why 9p is the default mechanism.
func VirtiofsdArgs(socket, source, cache string) ([]string, error) {
	for what, p := range map[string]string{"socket": socket, "source": source} {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, ",\\\x00\n\r") {
			return nil, fmt.Errorf("virtiofsd: %s %q must be an absolute path without ',', '\\', NUL or newline", what, p)
		}
	}
	if cache == "" {
		cache = "auto"
	}
	switch cache {
	case "auto", "always", "none":
	default:
		return nil, fmt.Errorf("virtiofsd: cache %q must be auto, always or none", cache)
	}
	return []string{"--socket-path=" + socket, "-o", "source=" + source + ",cache=" + cache + ",sandbox=namespace"}, nil
}
