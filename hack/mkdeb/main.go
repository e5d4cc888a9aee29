package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
)

// Paths of the package (doc.go).
const (
	BinDir     = "/usr/bin"
	LibexecDir = "/usr/libexec/slurm-microvm"
	SpankDir   = "/usr/lib/x86_64-linux-gnu/slurm-wlm"
	Config     = "/etc/slurm/microvm.toml"
	// makeInstallAgent is qemu.agent in etc/microvm.toml (make install's
	// LIBEXECDIR, dirs.mk): the line the package's conffile rewrites.
	makeInstallAgent = "/usr/local/libexec/slurm-microvm/slurm-microvm-agent"
)

// PlugstackLine is the line postinst prints (scripts/postinst says the same).
const PlugstackLine = "required " + SpankDir + "/spank_microvm.so launcher=" + BinDir + "/slurm-microvm config=" + Config

// Options are mkdeb's inputs.
type Options struct {
	Repo    string // repository root: etc/, hack/mkdeb/scripts, LICENSE
	Bin     string // make build's output (default Repo/bin)
	Man     string // make man's output (default Bin/man)
	Version string // Debian version
	Out     string // the .deb to write
	// SpankHeader is <slurm/slurm_version.h> of the Slurm the plugin was
	// built against: the slurm-client dependency is its release.
	SpankHeader string
	// MTime of every file and of the archive members (reproducible builds).
	MTime time.Time
}

func main() {
	var o Options
	flag.StringVar(&o.Repo, "repo", "../..", "repository root")
	flag.StringVar(&o.Bin, "bin", "", "make build's output directory (default REPO/bin)")
	flag.StringVar(&o.Man, "man", "", "make man's output directory (default BIN/man)")
	flag.StringVar(&o.Version, "version", "", "Debian version (must start with a digit)")
	flag.StringVar(&o.Out, "o", "", "the .deb to write (default BIN/slurm-microvm_VERSION_amd64.deb)")
	flag.StringVar(&o.SpankHeader, "slurm-version-header", "/usr/include/slurm/slurm_version.h", "slurm_version.h the plugin was built against")
	mtime := flag.Int64("mtime", 0, "time of every file, Unix seconds (the Makefile: the commit's time; SOURCE_DATE_EPOCH)")
	flag.Parse()
	o.MTime = time.Unix(*mtime, 0).UTC()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	out, err := Build(context.Background(), o)
	if err != nil {
		log.Error("mkdeb", "err", err)
		os.Exit(1)
	}
	fmt.Println(out)
}

// Build writes the package and returns its path. Errors name the missing
// or malformed input and the make target that produces it.
func Build(ctx context.Context, o Options) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if !regexp.MustCompile(`^[0-9][A-Za-z0-9.+~-]*$`).MatchString(o.Version) {
		return "", fmt.Errorf("-version %q: a Debian version starts with a digit and has only letters, digits and . + ~ - (the Makefile's DEB_VERSION)", o.Version)
	}
	if o.Bin == "" {
		o.Bin = filepath.Join(o.Repo, "bin")
	}
	if o.Man == "" {
		o.Man = filepath.Join(o.Bin, "man")
	}
	if o.Out == "" {
		o.Out = filepath.Join(o.Bin, "slurm-microvm_"+o.Version+"_amd64.deb")
	}
	stage, err := os.MkdirTemp("", "mkdeb-")
	if err != nil {
		return "", fmt.Errorf("staging directory: %w", err)
	}
	defer os.RemoveAll(stage)

	slurmDep, err := slurmDepends(o.SpankHeader)
	if err != nil {
		return "", err
	}
	contents := files.Contents{}
	add := func(src, dst, typ string, mode os.FileMode) {
		contents = append(contents, &files.Content{Source: src, Destination: dst, Type: typ,
			FileInfo: &files.ContentFileInfo{Mode: mode, Owner: "root", Group: "root", MTime: o.MTime}})
	}
	for _, f := range []struct{ src, dst string }{
		{"slurm-microvm", BinDir + "/slurm-microvm"},
		{"slurm-microvm-agent", LibexecDir + "/slurm-microvm-agent"},
		{"spank_microvm.so", SpankDir + "/spank_microvm.so"},
	} {
		src := filepath.Join(o.Bin, f.src)
		if _, err := os.Stat(src); err != nil {
			return "", fmt.Errorf("%s: run make build first: %w", src, err)
		}
		add(src, f.dst, files.TypeFile, 0o755)
	}
	contents = append(contents, &files.Content{Source: "slurm-microvm", Destination: BinDir + "/slurm-microvm-exec", Type: files.TypeSymlink})

	// The conffile: etc/microvm.toml with the package's agent path.
	example, err := os.ReadFile(filepath.Join(o.Repo, "etc", "microvm.toml"))
	if err != nil {
		return "", fmt.Errorf("example configuration: %w", err)
	}
	conf, err := packageConfig(example)
	if err != nil {
		return "", err
	}
	confPath := filepath.Join(stage, "microvm.toml")
	if err := os.WriteFile(confPath, conf, 0o644); err != nil {
		return "", err
	}
	add(confPath, Config, files.TypeConfig, 0o644)

	// Man pages, gzipped (Debian policy 12.1).
	pages, err := filepath.Glob(filepath.Join(o.Man, "*.[18]"))
	if err != nil || len(pages) == 0 {
		return "", fmt.Errorf("no man pages in %s: run make man first", o.Man)
	}
	sort.Strings(pages)
	for _, p := range pages {
		gz := filepath.Join(stage, filepath.Base(p)+".gz")
		if err := gzipFile(p, gz); err != nil {
			return "", err
		}
		section := p[len(p)-1:]
		add(gz, "/usr/share/man/man"+section+"/"+filepath.Base(gz), files.TypeFile, 0o644)
	}
	add(filepath.Join(o.Repo, "etc", "bash-completion", "slurm-microvm"), "/usr/share/bash-completion/completions/slurm-microvm", files.TypeFile, 0o644)
	add(filepath.Join(o.Repo, "LICENSE"), "/usr/share/doc/slurm-microvm/copyright", files.TypeFile, 0o644)
	plug := filepath.Join(stage, "plugstack.conf")
	if err := os.WriteFile(plug, []byte("# The line that enables slurm-microvm (spank-microvm(8)); the package never\n# edits /etc/slurm/plugstack.conf.\n"+PlugstackLine+"\n"), 0o644); err != nil {
		return "", err
	}
	add(plug, "/usr/share/doc/slurm-microvm/plugstack.conf", files.TypeFile, 0o644)
	units, _ := filepath.Glob(filepath.Join(o.Repo, "etc", "systemd", "*.[st][ei]*")) // .service, .timer
	for _, u := range units {
		add(u, "/lib/systemd/system/"+filepath.Base(u), files.TypeFile, 0o644)
	}

	scripts := filepath.Join(o.Repo, "hack", "mkdeb", "scripts")
	info := &nfpm.Info{
		Name:          "slurm-microvm",
		Arch:          "amd64",
		Platform:      "linux",
		Version:       o.Version,
		VersionSchema: "none",
		Section:       "admin",
		Priority:      "optional",
		Maintainer:    "slurm-microvm developers <slurm-microvm@localhost>",
		Description: "microVM per Slurm job step\n" +
			"A SPANK plugin (srun --microvm=IMAGE) and its launcher run every task of\n" +
			"a step inside a QEMU microVM booted from an OCI image, one VM per step\n" +
			"per node. Enable it with the plugstack.conf line in\n" +
			"/usr/share/doc/slurm-microvm/plugstack.conf.",
		Homepage: "https://github.com/slurm-microvm/slurm-microvm",
		License:  "see /usr/share/doc/slurm-microvm/copyright",
		MTime:    o.MTime,
		Overridables: nfpm.Overridables{
			Depends:    []string{"qemu-system-x86", "erofs-utils", "squashfs-tools", slurmDep[0], slurmDep[1]},
			Recommends: []string{"slurmd", "linux-image-amd64"},
			Contents:   contents,
			Scripts: nfpm.Scripts{
				PostInstall: filepath.Join(scripts, "postinst"),
				PreRemove:   filepath.Join(scripts, "prerm"),
				PostRemove:  filepath.Join(scripts, "postrm"),
			},
			Deb: nfpm.Deb{Compression: "xz"},
		},
	}
	info = nfpm.WithDefaults(info)
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return "", fmt.Errorf("package contents: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(o.Out), 0o755); err != nil {
		return "", err
	}
	tmp := o.Out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return "", fmt.Errorf("write the package: %w", err)
	}
	defer os.Remove(tmp)
	if err := deb.Default.Package(info, f); err != nil {
		f.Close()
		return "", fmt.Errorf("write the package %s: %w", o.Out, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("write the package %s: %w", o.Out, err)
	}
	return o.Out, os.Rename(tmp, o.Out)
}

// packageConfig is the example with qemu.agent at the package's path.
// Error: the example's agent line is not make install's path.
func packageConfig(example []byte) ([]byte, error) {
	old := []byte(`agent = "` + makeInstallAgent + `"`)
	if bytes.Count(example, old) != 1 {
		return nil, fmt.Errorf("etc/microvm.toml: no line %s (make install's agent path): update hack/mkdeb, which rewrites it to %s", old, LibexecDir)
	}
	conf := bytes.Replace(example, old, []byte(`agent = "`+LibexecDir+`/slurm-microvm-agent"`), 1)
	if bytes.Contains(conf, []byte(`"/usr/local/`)) {
		return nil, errors.New("etc/microvm.toml names another /usr/local path: the package installs under /usr; update hack/mkdeb")
	}
	return conf, nil
}

// slurmDepends is the slurm-client dependency of the Slurm release in
// slurm_version.h (SLURM_VERSION_NUMBER 0xMMmmuu): Slurm loads SPANK
// plugins of its own major.minor only.
func slurmDepends(header string) ([2]string, error) {
	b, err := os.ReadFile(header)
	if err != nil {
		return [2]string{}, fmt.Errorf("slurm version (the plugin's build): %w (install libslurm-dev)", err)
	}
	m := regexp.MustCompile(`#define SLURM_VERSION_NUMBER 0x([0-9a-fA-F]+)`).FindSubmatch(b)
	if m == nil {
		return [2]string{}, fmt.Errorf("%s: no SLURM_VERSION_NUMBER", header)
	}
	n, err := strconv.ParseUint(string(m[1]), 16, 32)
	if err != nil {
		return [2]string{}, fmt.Errorf("%s: SLURM_VERSION_NUMBER: %w", header, err)
	}
	major, minor := n>>16&0xff, n>>8&0xff
	return [2]string{
		fmt.Sprintf("slurm-client (>= %d.%02d)", major, minor),
		fmt.Sprintf("slurm-client (<< %d.%02d)", major, minor+1),
	}, nil
}

func gzipFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("man page: %w", err)
	}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	zw.Name = "" // no name or time: reproducible (gzip -n)
	if _, err := zw.Write(b); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(dst, buf.Bytes(), 0o644)
}
