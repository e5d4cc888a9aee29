package driverset

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// The fake driver trees are made of real parts built at test time: kernel
// modules are relocatable ELF objects compiled by cc with a .modinfo
// section (compressed by the real xz and zstd), libraries are shared
// objects with the right soname, and the linker cache is written by the
// real ldconfig over them.

const (
	testRelease = "6.1.0-57-amd64"
	testVersion = "550.54.15"
)

func testVermagic(release string) string {
	return release + " SMP preempt mod_unload modversions "
}

// needTools stops t unless the tools the fixtures use are here.
func needTools(t testing.TB) {
	t.Helper()
	prereq.Tools(t, "cc", "xz", "zstd")
	ldconfigPath(t)
}

func ldconfigPath(t testing.TB) string {
	t.Helper()
	if p, err := exec.LookPath("ldconfig"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/ldconfig"); err == nil {
		return "/usr/sbin/ldconfig"
	}
	prereq.Missing(t, "ldconfig is missing (glibc's libc-bin; install it with hack/setup-debian.sh)")
	return ""
}

func run(t testing.TB, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// objCache holds what cc built, by a hash of its input, for the whole
// test binary: the same library or module is compiled once.
var objCache struct {
	sync.Mutex
	dir  string
	done map[string]string
}

func cached(t testing.TB, kind, in string, build func(dst string)) string {
	t.Helper()
	objCache.Lock()
	defer objCache.Unlock()
	if objCache.dir == "" {
		d, err := os.MkdirTemp("", "driverset-objs-")
		if err != nil {
			t.Fatal(err)
		}
		objCache.dir, objCache.done = d, map[string]string{}
	}
	sum := sha256.Sum256([]byte(kind + "\x00" + in))
	k := hex.EncodeToString(sum[:8])
	if p, ok := objCache.done[k]; ok {
		return p
	}
	dst := filepath.Join(objCache.dir, k+"."+kind)
	build(dst)
	objCache.done[k] = dst
	return dst
}

func TestMain(m *testing.M) {
	code := m.Run()
	if objCache.dir != "" {
		os.RemoveAll(objCache.dir)
	}
	os.Exit(code)
}

// mi is a module's .modinfo in order, as key=value strings.
type mi []string

// nvMod is the modinfo of one of NVIDIA's modules.
func nvMod(name, version, license, release string, firmware ...string) mi {
	m := mi{"name=" + name, "version=" + version, "license=" + license, "vermagic=" + testVermagic(release)}
	for _, f := range firmware {
		m = append(m, "firmware="+f)
	}
	return m
}

// gsp are the firmware files NVIDIA's 550 modules declare.
var gsp = []string{"nvidia/" + testVersion + "/gsp_ga10x.bin", "nvidia/" + testVersion + "/gsp_tu10x.bin"}

// moduleObject compiles a relocatable ELF object whose .modinfo section
// holds m, as the kernel's MODULE_INFO macros lay it out.
func moduleObject(t testing.TB, m mi) []byte {
	t.Helper()
	var lit strings.Builder
	for _, kv := range m {
		fmt.Fprintf(&lit, "%q \"\\0\" ", kv) // adjacent literals: no octal run-on
	}
	src := "static const char __attribute__((section(\".modinfo\"), used)) mi[] = " + lit.String() + ";\nint init_module(void) { return 0; }\n"
	p := cached(t, "o", src, func(dst string) {
		c := dst + ".c"
		if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, "cc", "-c", "-o", dst, c)
	})
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// compress compresses b as a .ko.<how> (xz, zst, gz) with the real tool.
func compress(t testing.TB, how string, b []byte) []byte {
	t.Helper()
	tool := map[string][]string{"xz": {"xz", "-c", "--check=crc32"}, "zst": {"zstd", "-q", "-c"}, "gz": {"gzip", "-c", "-n"}}[how]
	cmd := exec.Command(tool[0], tool[1:]...)
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", tool[0], err)
	}
	return out
}

// sharedLib compiles a shared library with the given soname.
func sharedLib(t testing.TB, soname string) string {
	t.Helper()
	src := "int " + strings.NewReplacer(".", "_", "-", "_").Replace(soname) + "(void) { return 1; }\n"
	return cached(t, "so", src, func(dst string) {
		c := dst + ".c"
		if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, "cc", "-shared", "-fPIC", "-Wl,-soname,"+soname, "-o", dst, c)
	})
}

// tree is a fake driver root.
type tree struct {
	t    testing.TB
	root string
}

func newTree(t testing.TB, root string) *tree {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return &tree{t: t, root: root}
}

func (tr *tree) path(rel string) string { return filepath.Join(tr.root, rel) }

func (tr *tree) write(rel string, data []byte, mode os.FileMode) {
	tr.t.Helper()
	p := tr.path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *tree) symlink(rel, target string) {
	tr.t.Helper()
	p := tr.path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	os.Remove(p)
	if err := os.Symlink(target, p); err != nil {
		tr.t.Fatal(err)
	}
}

// module writes a module file at rel (its suffix says the compression).
func (tr *tree) module(rel string, m mi) {
	tr.t.Helper()
	obj := moduleObject(tr.t, m)
	for _, how := range []string{"xz", "zst", "gz"} {
		if strings.HasSuffix(rel, ".ko."+how) {
			obj = compress(tr.t, how, obj)
		}
	}
	tr.write(rel, obj, 0o644)
}

// lib puts a shared library with soname at rel.
func (tr *tree) lib(rel, soname string) {
	tr.t.Helper()
	b, err := os.ReadFile(sharedLib(tr.t, soname))
	if err != nil {
		tr.t.Fatal(err)
	}
	tr.write(rel, b, 0o755)
}

// ldconfig writes etc/ld.so.conf with dirs and runs the real ldconfig
// over the tree (it makes the soname links too, unless noLinks).
func (tr *tree) ldconfig(noLinks bool, dirs ...string) {
	tr.t.Helper()
	tr.write("etc/ld.so.conf", []byte(strings.Join(dirs, "\n")+"\n"), 0o644)
	args := []string{"-r", tr.root, "-C", "/etc/ld.so.cache", "-f", "/etc/ld.so.conf"}
	if noLinks {
		args = append(args, "-X")
	}
	run(tr.t, ldconfigPath(tr.t), args...)
}

// lineup is the user-space driver of one version, by soname and file.
func driverLibs(version string) [][2]string {
	return [][2]string{
		{"libcuda.so.1", "libcuda.so." + version},
		{"libnvidia-ml.so.1", "libnvidia-ml.so." + version},
		{"libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so." + version},
		{"libnvidia-nvvm.so.4", "libnvidia-nvvm.so." + version},
		{"libnvidia-gpucomp.so." + version, "libnvidia-gpucomp.so." + version},
		{"libcudadebugger.so.1", "libcudadebugger.so." + version},
		{"libnvidia-cfg.so.1", "libnvidia-cfg.so." + version},
		{"libnvidia-opencl.so.1", "libnvidia-opencl.so." + version},
		{"libnvidia-allocator.so.1", "libnvidia-allocator.so." + version},
	}
}

// bins writes the driver's tools into dir.
func (tr *tree) bins(dir string, names ...string) {
	tr.t.Helper()
	for _, n := range names {
		tr.write(dir+"/"+n, []byte("#!/bin/sh\necho "+n+"\n"), 0o755)
	}
}

// runInstaller lays a tree out as NVIDIA's .run installer does on a RHEL
// node: modules in kernel/drivers/video, libraries in /usr/lib64 with the
// unversioned links it makes, tools in /usr/bin, firmware in
// /lib/firmware/nvidia/<version>; the driver is loaded.
func runInstaller(t testing.TB, root string) *tree {
	t.Helper()
	tr := newTree(t, root)
	md := "lib/modules/" + testRelease + "/"
	tr.module(md+"kernel/drivers/video/nvidia.ko", nvMod("nvidia", testVersion, "NVIDIA", testRelease, gsp...))
	tr.module(md+"kernel/drivers/video/nvidia-uvm.ko", nvMod("nvidia_uvm", testVersion, "Dual MIT/GPL", testRelease))
	tr.module(md+"kernel/drivers/video/nvidia-modeset.ko", nvMod("nvidia_modeset", testVersion, "NVIDIA", testRelease))
	tr.module(md+"kernel/drivers/video/nvidia-drm.ko", nvMod("nvidia_drm", testVersion, "Dual MIT/GPL", testRelease))
	tr.module(md+"kernel/drivers/video/nvidia-peermem.ko", nvMod("nvidia_peermem", testVersion, "Dual BSD/GPL", testRelease))
	tr.module(md+"kernel/drivers/video/fbdev/nvidia/nvidiafb.ko", mi{"name=nvidiafb", "license=GPL", "vermagic=" + testVermagic(testRelease)})
	tr.module(md+"kernel/drivers/gpu/drm/drm.ko", mi{"name=drm", "license=GPL and additional rights", "vermagic=" + testVermagic(testRelease)})
	tr.module(md+"kernel/drivers/gpu/drm/drm_kms_helper.ko", mi{"name=drm_kms_helper", "license=GPL and additional rights", "depends=drm", "vermagic=" + testVermagic(testRelease)})
	tr.write(md+"modules.dep", []byte(`kernel/drivers/gpu/drm/drm.ko:
kernel/drivers/gpu/drm/drm_kms_helper.ko: kernel/drivers/gpu/drm/drm.ko
kernel/drivers/video/fbdev/nvidia/nvidiafb.ko:
kernel/drivers/video/nvidia.ko:
kernel/drivers/video/nvidia-uvm.ko: kernel/drivers/video/nvidia.ko
kernel/drivers/video/nvidia-modeset.ko: kernel/drivers/video/nvidia.ko
kernel/drivers/video/nvidia-drm.ko: kernel/drivers/video/nvidia-modeset.ko kernel/drivers/video/nvidia.ko kernel/drivers/gpu/drm/drm_kms_helper.ko kernel/drivers/gpu/drm/drm.ko
kernel/drivers/video/nvidia-peermem.ko: kernel/drivers/video/nvidia.ko
`), 0o644)
	for _, g := range gsp {
		tr.write("lib/firmware/"+g, []byte("GSP firmware "+g), 0o644)
	}
	for _, l := range driverLibs(testVersion) {
		tr.lib("usr/lib64/"+l[1], l[0])
	}
	tr.symlink("usr/lib64/libcuda.so", "libcuda.so.1")
	tr.symlink("usr/lib64/libnvidia-ml.so", "libnvidia-ml.so.1")
	tr.ldconfig(false, "/usr/lib64")
	tr.bins("usr/bin", Binaries...)
	tr.write("sys/module/nvidia/version", []byte(testVersion+"\n"), 0o444)
	return tr
}

// nvidiaDKMS lays a tree out as NVIDIA's CUDA-repository packages with
// DKMS do on Ubuntu (nvidia-dkms-550-open, nvidia-firmware-550,
// libnvidia-compute-550): the open modules compressed (how: xz or zst) in
// updates/dkms, libraries in the multiarch directory, the driver loaded
// (seen through /proc only).
func nvidiaDKMS(t testing.TB, root, how string) *tree {
	t.Helper()
	tr := newTree(t, root)
	md := "lib/modules/" + testRelease + "/"
	ko := ".ko." + how
	tr.module(md+"updates/dkms/nvidia"+ko, nvMod("nvidia", testVersion, "Dual MIT/GPL", testRelease, gsp...))
	tr.module(md+"updates/dkms/nvidia-uvm"+ko, nvMod("nvidia_uvm", testVersion, "Dual MIT/GPL", testRelease))
	tr.module(md+"updates/dkms/nvidia-modeset"+ko, nvMod("nvidia_modeset", testVersion, "Dual MIT/GPL", testRelease))
	tr.module(md+"kernel/drivers/video/fbdev/nvidia/nvidiafb"+ko, mi{"name=nvidiafb", "license=GPL", "vermagic=" + testVermagic(testRelease)})
	tr.write(md+"modules.dep", []byte(fmt.Sprintf(`kernel/drivers/video/fbdev/nvidia/nvidiafb%[1]s:
updates/dkms/nvidia%[1]s:
updates/dkms/nvidia-uvm%[1]s: updates/dkms/nvidia%[1]s
updates/dkms/nvidia-modeset%[1]s: updates/dkms/nvidia%[1]s
`, ko)), 0o644)
	for _, g := range gsp {
		tr.write("lib/firmware/"+g, []byte("GSP firmware "+g), 0o644)
	}
	lib := "usr/lib/x86_64-linux-gnu"
	for _, l := range driverLibs(testVersion) {
		tr.lib(lib+"/"+l[1], l[0])
	}
	tr.ldconfig(false, "/"+lib)
	tr.bins("usr/bin", "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced")
	tr.write("proc/driver/nvidia/version", []byte("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "+testVersion+"  Release Build  (dvs-builder@U16-I3-D08-1-2)  Thu Feb 22 01:44:30 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"), 0o444)
	return tr
}

// debianDKMS lays a tree out as Debian's packages do (bookworm,
// usr-merged): nvidia-kernel-dkms builds updates/dkms/nvidia-current*.ko
// (file renamed, module name kept), libcuda1 and friends live in
// /usr/lib/x86_64-linux-gnu/nvidia/current and are reached through
// /etc/alternatives links, firmware-nvidia-gsp ships the firmware, and
// nvidia-smi is an alternative too. The driver is not loaded.
func debianDKMS(t testing.TB, root string) *tree {
	t.Helper()
	tr := newTree(t, root)
	tr.symlink("lib", "usr/lib")
	tr.symlink("bin", "usr/bin")
	md := "usr/lib/modules/" + testRelease + "/"
	tr.module(md+"updates/dkms/nvidia-current.ko", nvMod("nvidia", testVersion, "NVIDIA", testRelease, gsp[0]))
	tr.module(md+"updates/dkms/nvidia-current-uvm.ko", nvMod("nvidia_uvm", testVersion, "Dual MIT/GPL", testRelease))
	tr.module(md+"updates/dkms/nvidia-current-modeset.ko", nvMod("nvidia_modeset", testVersion, "NVIDIA", testRelease))
	tr.module(md+"kernel/drivers/video/fbdev/nvidia/nvidiafb.ko", mi{"name=nvidiafb", "license=GPL", "vermagic=" + testVermagic(testRelease)})
	tr.write(md+"modules.dep", []byte(`kernel/drivers/video/fbdev/nvidia/nvidiafb.ko:
updates/dkms/nvidia-current.ko:
updates/dkms/nvidia-current-uvm.ko: updates/dkms/nvidia-current.ko
updates/dkms/nvidia-current-modeset.ko: updates/dkms/nvidia-current.ko
`), 0o644)
	tr.write("usr/lib/firmware/"+gsp[0], []byte("GSP firmware"), 0o644)
	multi := "usr/lib/x86_64-linux-gnu"
	for _, l := range driverLibs(testVersion)[:4] {
		tr.lib(multi+"/nvidia/current/"+l[1], l[0])
		tr.symlink(multi+"/nvidia/current/"+l[0], l[1])
		alt := "etc/alternatives/nvidia--" + l[0] + "-x86_64-linux-gnu"
		tr.symlink(alt, "/"+multi+"/nvidia/current/"+l[0])
		tr.symlink(multi+"/"+l[0], "/"+alt)
	}
	tr.ldconfig(false, "/"+multi)
	tr.bins("usr/lib/nvidia/current", "nvidia-smi")
	tr.symlink("etc/alternatives/nvidia--nvidia-smi", "/usr/lib/nvidia/current/nvidia-smi")
	tr.symlink("usr/bin/nvidia-smi", "/etc/alternatives/nvidia--nvidia-smi")
	return tr
}

// gpuOperator lays out the driver container's root the NVIDIA GPU
// Operator mounts at /run/nvidia/driver: the .run installer's layout
// inside (Ubuntu base), with absolute soname links that only make sense
// re-rooted, and an NSCQ library of another version.
func gpuOperator(t testing.TB, root string) *tree {
	t.Helper()
	tr := newTree(t, root)
	md := "lib/modules/" + testRelease + "/"
	tr.module(md+"kernel/drivers/video/nvidia.ko", nvMod("nvidia", testVersion, "Dual MIT/GPL", testRelease, gsp...))
	tr.module(md+"kernel/drivers/video/nvidia-uvm.ko", nvMod("nvidia_uvm", testVersion, "Dual MIT/GPL", testRelease))
	tr.write(md+"modules.dep", []byte("kernel/drivers/video/nvidia.ko:\nkernel/drivers/video/nvidia-uvm.ko: kernel/drivers/video/nvidia.ko\n"), 0o644)
	for _, g := range gsp {
		tr.write("lib/firmware/"+g, []byte("GSP firmware "+g), 0o644)
	}
	lib := "usr/lib/x86_64-linux-gnu"
	for _, l := range driverLibs(testVersion)[:3] {
		tr.lib(lib+"/"+l[1], l[0])
	}
	tr.lib(lib+"/libnvidia-nscq.so.535.161.08", "libnvidia-nscq.so.2")
	tr.ldconfig(false, "/"+lib)
	for _, l := range driverLibs(testVersion)[:3] {
		tr.symlink(lib+"/"+l[0], "/"+lib+"/"+l[1]) // absolute, as some installers make them
	}
	tr.bins("usr/bin", "nvidia-smi", "nvidia-persistenced")
	return tr
}

// ubuntuPrebuilt lays out Ubuntu's signed prebuilt modules
// (linux-modules-nvidia-550-server-<release>: kernel/nvidia-550srv) with
// the user-space driver of the same version.
func ubuntuPrebuilt(t testing.TB, root string) *tree {
	t.Helper()
	tr := newTree(t, root)
	md := "lib/modules/" + testRelease + "/"
	tr.module(md+"kernel/nvidia-550srv/nvidia.ko", nvMod("nvidia", testVersion, "NVIDIA", testRelease, gsp...))
	tr.module(md+"kernel/nvidia-550srv/nvidia-uvm.ko", nvMod("nvidia_uvm", testVersion, "Dual MIT/GPL", testRelease))
	tr.write(md+"modules.dep", []byte("kernel/nvidia-550srv/nvidia.ko:\nkernel/nvidia-550srv/nvidia-uvm.ko: kernel/nvidia-550srv/nvidia.ko\n"), 0o644)
	for _, g := range gsp {
		tr.write("lib/firmware/"+g, []byte("GSP firmware "+g), 0o644)
	}
	lib := "usr/lib/x86_64-linux-gnu"
	for _, l := range driverLibs(testVersion)[:2] {
		tr.lib(lib+"/"+l[1], l[0])
	}
	tr.ldconfig(false, "/"+lib)
	tr.write("sys/module/nvidia/version", []byte("550.54.14\n"), 0o444)
	return tr
}
