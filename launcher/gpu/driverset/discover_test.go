package driverset

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// want is what a discovery should find, paths relative to the root.
type want struct {
	open      bool
	loaded    string
	modules   []string // name[+dep]=path
	firmware  []string // rel=path
	libraries []string // soname=rel
	binaries  []string // rel=path
	notes     []string // substrings, one note each
}

func setSummary(root string, s *Set) want {
	rel := func(p string) string {
		r, err := filepath.Rel(root, p)
		if err != nil {
			return p
		}
		return r
	}
	w := want{open: s.Open, loaded: s.LoadedVersion}
	for _, m := range s.Modules {
		n := m.Name
		if m.Dependency {
			n += "+dep"
		}
		if m.Params != "" {
			n += "(" + m.Params + ")"
		}
		w.modules = append(w.modules, n+"="+rel(m.Path))
	}
	for _, f := range s.Firmware {
		w.firmware = append(w.firmware, f.Rel+"="+rel(f.Path))
	}
	for _, l := range s.Libraries {
		w.libraries = append(w.libraries, l.Soname+"="+l.Rel+"="+rel(l.Path))
	}
	for _, f := range s.Binaries {
		w.binaries = append(w.binaries, f.Rel+"="+rel(f.Path))
	}
	return w
}

func libsWant(dir string, n int) []string {
	var out []string
	for _, l := range driverLibs(testVersion)[:n] {
		out = append(out, l[0]+"=lib64/"+l[1]+"="+dir+"/"+l[1])
	}
	return out
}

// sortedLibs orders libraries as Discover does: by Libraries.
func sortedLibs(in []string) []string {
	idx := func(s string) int {
		for i, n := range Libraries {
			if strings.HasPrefix(s, n+".so.") {
				return i
			}
		}
		return -1
	}
	out := slices.Clone(in)
	slices.SortStableFunc(out, func(a, b string) int { return idx(a) - idx(b) })
	return out
}

func TestDiscoverLayouts(t *testing.T) {
	needTools(t)
	md := "lib/modules/" + testRelease + "/"
	fw := func(prefix string) []string {
		return []string{"firmware/" + gsp[0] + "=" + prefix + gsp[0], "firmware/" + gsp[1] + "=" + prefix + gsp[1]}
	}
	tests := []struct {
		name    string
		layout  func(t testing.TB, root string) *tree
		root    string // under the test's directory
		modules []string
		params  map[string]string
		want    want
	}{
		{
			name:    "run installer",
			layout:  runInstaller,
			modules: []string{"nvidia", "nvidia_uvm", "nvidia-drm"},
			params:  map[string]string{"nvidia": "NVreg_EnableGpuFirmware=1 NVreg_DeviceFileMode=0660", "drm": "modeset=1"},
			want: want{
				loaded: testVersion,
				modules: []string{
					"nvidia(NVreg_EnableGpuFirmware=1 NVreg_DeviceFileMode=0660)=" + md + "kernel/drivers/video/nvidia.ko",
					"nvidia_uvm=" + md + "kernel/drivers/video/nvidia-uvm.ko",
					"drm+dep(modeset=1)=" + md + "kernel/drivers/gpu/drm/drm.ko",
					"drm_kms_helper+dep=" + md + "kernel/drivers/gpu/drm/drm_kms_helper.ko",
					"nvidia_modeset+dep=" + md + "kernel/drivers/video/nvidia-modeset.ko",
					"nvidia_drm=" + md + "kernel/drivers/video/nvidia-drm.ko",
				},
				firmware:  fw("lib/firmware/"),
				libraries: sortedLibs(libsWant("usr/lib64", 9)),
				binaries: []string{"bin/nvidia-smi=usr/bin/nvidia-smi", "bin/nvidia-debugdump=usr/bin/nvidia-debugdump",
					"bin/nvidia-persistenced=usr/bin/nvidia-persistenced", "bin/nvidia-cuda-mps-control=usr/bin/nvidia-cuda-mps-control",
					"bin/nvidia-cuda-mps-server=usr/bin/nvidia-cuda-mps-server"},
			},
		},
		{
			name:   "NVIDIA DKMS packages, xz",
			layout: func(t testing.TB, root string) *tree { return nvidiaDKMS(t, root, "xz") },
			want: want{
				open: true, loaded: testVersion,
				modules:   []string{"nvidia=" + md + "updates/dkms/nvidia.ko.xz", "nvidia_uvm=" + md + "updates/dkms/nvidia-uvm.ko.xz"},
				firmware:  fw("lib/firmware/"),
				libraries: sortedLibs(libsWant("usr/lib/x86_64-linux-gnu", 9)),
				binaries: []string{"bin/nvidia-smi=usr/bin/nvidia-smi", "bin/nvidia-debugdump=usr/bin/nvidia-debugdump",
					"bin/nvidia-persistenced=usr/bin/nvidia-persistenced"},
			},
		},
		{
			name:    "NVIDIA DKMS packages, zstd, with modeset",
			layout:  func(t testing.TB, root string) *tree { return nvidiaDKMS(t, root, "zst") },
			modules: []string{"nvidia_uvm", "nvidia_modeset"},
			want: want{
				open: true, loaded: testVersion,
				modules: []string{"nvidia+dep=" + md + "updates/dkms/nvidia.ko.zst", "nvidia_uvm=" + md + "updates/dkms/nvidia-uvm.ko.zst",
					"nvidia_modeset=" + md + "updates/dkms/nvidia-modeset.ko.zst"},
				firmware:  fw("lib/firmware/"),
				libraries: sortedLibs(libsWant("usr/lib/x86_64-linux-gnu", 9)),
				binaries: []string{"bin/nvidia-smi=usr/bin/nvidia-smi", "bin/nvidia-debugdump=usr/bin/nvidia-debugdump",
					"bin/nvidia-persistenced=usr/bin/nvidia-persistenced"},
			},
		},
		{
			name:   "Debian nvidia-kernel-dkms",
			layout: debianDKMS,
			want: want{
				modules:  []string{"nvidia=usr/" + md + "updates/dkms/nvidia-current.ko", "nvidia_uvm=usr/" + md + "updates/dkms/nvidia-current-uvm.ko"},
				firmware: []string{"firmware/" + gsp[0] + "=usr/lib/firmware/" + gsp[0]},
				libraries: sortedLibs(func() []string {
					var out []string
					for _, l := range driverLibs(testVersion)[:4] {
						out = append(out, l[0]+"=lib64/"+l[1]+"=usr/lib/x86_64-linux-gnu/nvidia/current/"+l[1])
					}
					return out
				}()),
				binaries: []string{"bin/nvidia-smi=usr/lib/nvidia/current/nvidia-smi"},
			},
		},
		{
			name:   "GPU Operator driver root",
			layout: gpuOperator,
			root:   "run/nvidia/driver",
			want: want{
				open:      true,
				modules:   []string{"nvidia=" + md + "kernel/drivers/video/nvidia.ko", "nvidia_uvm=" + md + "kernel/drivers/video/nvidia-uvm.ko"},
				firmware:  fw("lib/firmware/"),
				libraries: sortedLibs(libsWant("usr/lib/x86_64-linux-gnu", 3)),
				binaries:  []string{"bin/nvidia-smi=usr/bin/nvidia-smi", "bin/nvidia-persistenced=usr/bin/nvidia-persistenced"},
				notes:     []string{"libnvidia-nscq skipped: libnvidia-nscq.so.2 is", "libnvidia-nscq.so.535.161.08"},
			},
		},
		{
			name:   "Ubuntu prebuilt modules, another version loaded",
			layout: ubuntuPrebuilt,
			want: want{
				loaded:    "550.54.14",
				modules:   []string{"nvidia=" + md + "kernel/nvidia-550srv/nvidia.ko", "nvidia_uvm=" + md + "kernel/nvidia-550srv/nvidia-uvm.ko"},
				firmware:  fw("lib/firmware/"),
				libraries: sortedLibs(libsWant("usr/lib/x86_64-linux-gnu", 2)),
				notes:     []string{"the node runs driver 550.54.14", "nvidia-smi is in none of"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), tt.root)
			tt.layout(t, root)
			s, err := Discover(context.Background(), Options{Root: root, KernelRelease: testRelease, Modules: tt.modules, Params: tt.params})
			if err != nil {
				t.Fatal(err)
			}
			got := setSummary(root, s)
			if s.Version != testVersion || s.KernelRelease != testRelease || s.Root != root {
				t.Errorf("version %q release %q root %q", s.Version, s.KernelRelease, s.Root)
			}
			check := func(what string, got, want any) {
				t.Helper()
				if !equalAny(got, want) {
					t.Errorf("%s:\n got %q\nwant %q", what, got, want)
				}
			}
			check("open", got.open, tt.want.open)
			check("loaded", got.loaded, tt.want.loaded)
			check("modules", got.modules, tt.want.modules)
			check("firmware", got.firmware, tt.want.firmware)
			check("libraries", got.libraries, tt.want.libraries)
			check("binaries", got.binaries, tt.want.binaries)
			for _, n := range tt.want.notes {
				if !slices.ContainsFunc(s.Notes, func(x string) bool { return strings.Contains(x, n) }) {
					t.Errorf("no note says %q: %q", n, s.Notes)
				}
			}
			if len(tt.want.notes) == 0 && len(s.Notes) > 0 {
				t.Errorf("notes %q, want none", s.Notes)
			}
		})
	}
}

func equalAny(a, b any) bool {
	switch x := a.(type) {
	case []string:
		return slices.Equal(x, b.([]string))
	default:
		return a == b
	}
}

func TestDiscoverRefuses(t *testing.T) {
	needTools(t)
	md := "lib/modules/" + testRelease + "/"
	lib := "usr/lib64/"
	tests := []struct {
		name    string
		modify  func(tr *tree)
		opts    func(o *Options)
		wantErr []string // substrings of the error
	}{
		{
			name:    "no modules for the release",
			opts:    func(o *Options) { o.KernelRelease = "6.1.0-99-amd64" },
			wantErr: []string{"not built for the guest kernel 6.1.0-99-amd64", "lib/modules/6.1.0-99-amd64/modules.dep does not exist", "boot guests with the node's own kernel"},
		},
		{
			name: "release without nvidia",
			modify: func(tr *tree) {
				tr.write("lib/modules/6.1.0-58-amd64/modules.dep", []byte("kernel/drivers/video/fbdev/nvidia/nvidiafb.ko:\n"), 0o644)
				tr.module("lib/modules/6.1.0-58-amd64/kernel/drivers/video/fbdev/nvidia/nvidiafb.ko", mi{"name=nvidiafb", "vermagic=6.1.0-58-amd64 SMP"})
			},
			opts:    func(o *Options) { o.KernelRelease = "6.1.0-58-amd64" },
			wantErr: []string{"not built for the guest kernel 6.1.0-58-amd64", "lib/modules/6.1.0-58-amd64/modules.dep has no nvidia, nvidia_uvm", "install the driver's DKMS module"},
		},
		{
			name:    "no depmod",
			modify:  func(tr *tree) { os.Remove(tr.path(md + "modules.dep")) },
			wantErr: []string{"has no modules.dep (run depmod " + testRelease + ")"},
		},
		{
			name: "vermagic of another kernel",
			modify: func(tr *tree) {
				tr.module(md+"kernel/drivers/video/nvidia-uvm.ko", nvMod("nvidia_uvm", testVersion, "NVIDIA", "6.1.0-56-amd64"))
			},
			wantErr: []string{"nvidia-uvm.ko is built for kernel \"6.1.0-56-amd64\"", "not the guest kernel " + testRelease},
		},
		{
			name: "module versions differ",
			modify: func(tr *tree) {
				tr.module(md+"kernel/drivers/video/nvidia-uvm.ko", nvMod("nvidia_uvm", "550.54.14", "NVIDIA", testRelease))
			},
			wantErr: []string{"nvidia_uvm", "is driver version \"550.54.14\" but nvidia", "is " + testVersion},
		},
		{
			name: "libcuda of another version",
			modify: func(tr *tree) {
				os.Remove(tr.path(lib + "libcuda.so." + testVersion))
				tr.lib(lib+"libcuda.so.550.54.14", "libcuda.so.1")
				tr.ldconfig(false, "/usr/lib64")
			},
			wantErr: []string{"libcuda.so.1 is ", "libcuda.so.550.54.14, not of the kernel module's version " + testVersion, "CUDA driver version is insufficient"},
		},
		{
			name: "no libcuda",
			modify: func(tr *tree) {
				os.Remove(tr.path(lib + "libcuda.so." + testVersion))
				os.Remove(tr.path(lib + "libcuda.so.1"))
				tr.ldconfig(false, "/usr/lib64")
			},
			wantErr: []string{"libcuda (libcuda.so.*) is not in the linker cache", "etc/ld.so.cache", "run ldconfig"},
		},
		{
			name: "no linker cache",
			modify: func(tr *tree) {
				os.Remove(tr.path("etc/ld.so.cache"))
			},
			wantErr: []string{"read the linker cache", "run ldconfig"},
		},
		{
			name: "open modules without firmware",
			modify: func(tr *tree) {
				tr.module(md+"kernel/drivers/video/nvidia.ko", nvMod("nvidia", testVersion, "Dual MIT/GPL", testRelease, gsp...))
				os.RemoveAll(tr.path("lib/firmware"))
			},
			wantErr: []string{"open kernel modules " + testVersion + " need their GSP firmware", gsp[0] + ", " + gsp[1], "firmware-nvidia-gsp"},
		},
		{
			name: "open modules declaring none, no firmware directory",
			modify: func(tr *tree) {
				tr.module(md+"kernel/drivers/video/nvidia.ko", nvMod("nvidia", testVersion, "Dual MIT/GPL", testRelease))
				os.RemoveAll(tr.path("lib/firmware"))
			},
			wantErr: []string{"need their GSP firmware", "nvidia/" + testVersion + "/*"},
		},
		{
			name: "libcuda linked out of the root",
			modify: func(tr *tree) {
				os.Remove(tr.path(lib + "libcuda.so." + testVersion))
				// The real ldconfig, chrooted, finds the file in the
				// root's /etc; resolving without a chroot would leave it.
				tr.lib("etc/libcuda.so."+testVersion, "libcuda.so.1")
				tr.symlink(lib+"libcuda.so.1", "../../../../../../../../etc/libcuda.so."+testVersion)
				tr.ldconfig(true, "/usr/lib64")
			},
			wantErr: []string{"symbolic link", "usr/lib64/libcuda.so.1 -> ../../../../../../../../etc/libcuda.so." + testVersion, "leads out of the driver root"},
		},
		{
			name:    "parameters for a module not loaded",
			opts:    func(o *Options) { o.Params = map[string]string{"nvidia_drm": "modeset=1"} },
			wantErr: []string{"module parameters for nvidia_drm: it is not among the modules loaded (nvidia, nvidia_uvm)"},
		},
		{
			name:    "parameters on two lines",
			opts:    func(o *Options) { o.Params = map[string]string{"nvidia": "a=1\nb=2"} },
			wantErr: []string{"module parameters for nvidia", "newline or NUL"},
		},
		{
			name:    "bad module name",
			opts:    func(o *Options) { o.Modules = []string{"nvidia", "../x"} },
			wantErr: []string{`kernel module "../x"`},
		},
		{
			name:    "no release",
			opts:    func(o *Options) { o.KernelRelease = "" },
			wantErr: []string{"guest kernel release \"\""},
		},
		{
			name:    "no nvidia asked",
			opts:    func(o *Options) { o.Modules = []string{"drm"} },
			wantErr: []string{"do not include nvidia"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			tr := runInstaller(t, root)
			if tt.modify != nil {
				tt.modify(tr)
			}
			o := Options{Root: root, KernelRelease: testRelease}
			if tt.opts != nil {
				tt.opts(&o)
			}
			s, err := Discover(context.Background(), o)
			if err == nil {
				t.Fatalf("found %s, want an error", s.Summary())
			}
			t.Log(err)
			if !errors.Is(err, ErrNoDriver) {
				t.Errorf("%v does not wrap ErrNoDriver", err)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not say %q", err, w)
				}
			}
		})
	}
}

func TestDiscoverNotes(t *testing.T) {
	needTools(t)
	root := t.TempDir()
	tr := runInstaller(t, root)
	// Proprietary modules without firmware run pre-Hopper GPUs; an
	// optional library of another version is left out.
	os.RemoveAll(tr.path("lib/firmware"))
	tr.lib("usr/lib64/libnvidia-nscq.so.535.161.08", "libnvidia-nscq.so.2")
	tr.write("sys/module/nvidia/version", []byte("550.40.07\n"), 0o444)
	tr.ldconfig(false, "/usr/lib64")
	s, err := Discover(context.Background(), Options{Root: root, KernelRelease: testRelease})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{
		"GSP firmware " + gsp[0] + ", " + gsp[1] + ": not found under " + root + "/lib/firmware: Hopper and later GPUs need it",
		"libnvidia-nscq skipped: libnvidia-nscq.so.2 is " + root + "/usr/lib64/libnvidia-nscq.so.535.161.08, not of the kernel module's version",
		"the node runs driver 550.40.07 (" + root + "/sys/module/nvidia/version) but " + testVersion + " is installed; guests get the installed " + testVersion,
	} {
		if !slices.ContainsFunc(s.Notes, func(x string) bool { return strings.Contains(x, n) }) {
			t.Errorf("no note says %q:\n%s", n, strings.Join(s.Notes, "\n"))
		}
	}
	if len(s.Firmware) != 0 || len(s.Libraries) != 9 {
		t.Errorf("firmware %v, %d libraries", s.Firmware, len(s.Libraries))
	}
	if got, want := s.Summary(), testVersion+" for "+testRelease+": modules nvidia,nvidia_uvm; 0 firmware; 9 libraries; 5 tools"; got != want {
		t.Errorf("Summary() = %q, want %q", got, want)
	}
}

func TestDiscoverFirmwareFallbackAndOrder(t *testing.T) {
	needTools(t)
	root := t.TempDir()
	tr := runInstaller(t, root)
	md := "lib/modules/" + testRelease + "/"
	// Declared firmware: lib/firmware/updates wins over lib/firmware, as
	// in the kernel's search.
	tr.write("lib/firmware/updates/"+gsp[0], []byte("newer"), 0o644)
	s, err := Discover(context.Background(), Options{Root: root, KernelRelease: testRelease})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Firmware[0].Path; got != tr.path("lib/firmware/updates/"+gsp[0]) {
		t.Errorf("firmware %s from %s, want lib/firmware/updates", gsp[0], got)
	}
	// None declared: every regular file of lib/firmware/nvidia/<version>.
	tr.module(md+"kernel/drivers/video/nvidia.ko", nvMod("nvidia", testVersion, "NVIDIA", testRelease))
	tr.symlink("lib/firmware/nvidia/"+testVersion+"/link.bin", "gsp_ga10x.bin")
	s, err = Discover(context.Background(), Options{Root: root, KernelRelease: testRelease})
	if err != nil {
		t.Fatal(err)
	}
	var rels []string
	for _, f := range s.Firmware {
		rels = append(rels, f.Rel)
	}
	if want := []string{"firmware/" + gsp[0], "firmware/" + gsp[1]}; !slices.Equal(rels, want) {
		t.Errorf("firmware %q, want %q", rels, want)
	}
}

func TestDiscoverCancelled(t *testing.T) {
	needTools(t)
	root := t.TempDir()
	runInstaller(t, root)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Discover(ctx, Options{Root: root, KernelRelease: testRelease})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrNoDriver) {
		t.Fatalf("Discover with a cancelled context: %v", err)
	}
}

// TestDiscoverLoadedVersionUnreadable: a loaded-version file that cannot
// be read (here a link out of the root) is a note, not silence.
func TestDiscoverLoadedVersionUnreadable(t *testing.T) {
	needTools(t)
	root := t.TempDir()
	tr := runInstaller(t, root)
	if err := os.MkdirAll(tr.path("sys/module/nvidia"), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(tr.path("sys/module/nvidia/version"))
	if err := os.Symlink("../../../../../../../etc/hostname", tr.path("sys/module/nvidia/version")); err != nil {
		t.Fatal(err)
	}
	s, err := Discover(context.Background(), Options{Root: root, KernelRelease: testRelease})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(s.Notes, func(n string) bool { return strings.Contains(n, "the loaded driver's version is unknown") }) {
		t.Errorf("no note about the unreadable version:\n%s", strings.Join(s.Notes, "\n"))
	}
}
