package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Size limits for the small JSON documents of an archive; a larger one is
// treated as corrupt rather than read into memory.
const (
	maxIndexBytes  = 4 << 20  // index.json, manifest.json, a manifest or an index
	maxConfigBytes = 16 << 20 // an image config
)

// tarArchive indexes the regular files of a tar held in an io.ReaderAt (a
// file), so that its members can be read in any order without rescanning.
type tarArchive struct {
	r     io.ReaderAt
	files map[string]tarMember // cleaned name -> data location
	links map[string]string    // cleaned name -> cleaned target (symlinks and hard links)
}

type tarMember struct{ off, size int64 }

// indexTar scans the tar headers of r (size bytes), skipping the data by
// seeking, so a multi-gigabyte archive is indexed in milliseconds. A tar cut
// inside a member is reported as ErrCorrupt.
func indexTar(r io.ReaderAt, size int64) (*tarArchive, error) {
	sr := io.NewSectionReader(r, 0, size)
	tr := tar.NewReader(sr)
	a := &tarArchive{r: r, files: map[string]tarMember{}, links: map[string]string{}}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, newErr("", ErrCorrupt, "truncated or malformed tar", "the archive must be complete; write it again (docker save -o FILE IMAGE, or skopeo copy ... oci-archive:FILE)", err)
		}
		name := cleanMember(hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeReg: // archive/tar reads the old TypeRegA as TypeReg
			off, err := sr.Seek(0, io.SeekCurrent)
			if err != nil {
				return nil, newErr("", ErrCorrupt, "cannot index tar", "", err)
			}
			if off+hdr.Size > size {
				return nil, newErr("", ErrCorrupt, fmt.Sprintf("truncated tar: member %q ends past the end of the file", hdr.Name), "the archive must be complete; write it again", nil)
			}
			a.files[name] = tarMember{off: off, size: hdr.Size}
		case tar.TypeSymlink:
			if path.IsAbs(hdr.Linkname) {
				a.links[name] = cleanMember(hdr.Linkname)
			} else {
				a.links[name] = cleanMember(path.Join(path.Dir(name), hdr.Linkname))
			}
		case tar.TypeLink:
			a.links[name] = cleanMember(hdr.Linkname)
		}
	}
	return a, nil
}

// cleanMember normalises a member name: no leading "./" or "/", no "..".
func cleanMember(n string) string {
	return strings.TrimPrefix(path.Clean("/"+n), "/")
}

// member resolves name (following links inside the archive, at most 8) to
// its data.
func (a *tarArchive) member(name string) (tarMember, error) {
	name = cleanMember(name)
	for range 8 {
		if m, ok := a.files[name]; ok {
			return m, nil
		}
		t, ok := a.links[name]
		if !ok {
			return tarMember{}, fs.ErrNotExist
		}
		name = t
	}
	return tarMember{}, fmt.Errorf("%s: too many levels of links", name)
}

func (a *tarArchive) open(name string) (*io.SectionReader, error) {
	m, err := a.member(name)
	if err != nil {
		return nil, err
	}
	return io.NewSectionReader(a.r, m.off, m.size), nil
}

// readFile and fileSize implement layoutFS for an OCI layout inside a tar.
func (a *tarArchive) readFile(name string, max int64) ([]byte, error) {
	m, err := a.member(name)
	if err != nil {
		return nil, err
	}
	if m.size > max {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d allowed", name, m.size, max)
	}
	b := make([]byte, m.size)
	if _, err := a.r.ReadAt(b, m.off); err != nil {
		return nil, err
	}
	return b, nil
}

func (a *tarArchive) fileSize(name string) (int64, error) {
	m, err := a.member(name)
	return m.size, err
}

// layoutFS is the read access inspectOCI needs to an OCI image layout,
// whether a directory or a tar of one.
type layoutFS interface {
	readFile(name string, max int64) ([]byte, error)
	fileSize(name string) (int64, error)
}

// dirLayout is an OCI layout directory read with the caller's credentials.
type dirLayout string

func (d dirLayout) readFile(name string, max int64) ([]byte, error) {
	f, err := os.Open(filepath.Join(string(d), filepath.FromSlash(name)))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is more than the %d bytes allowed", name, max)
	}
	return b, nil
}

func (d dirLayout) fileSize(name string) (int64, error) {
	fi, err := os.Stat(filepath.Join(string(d), filepath.FromSlash(name)))
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("%s is not a regular file", name)
	}
	return fi.Size(), nil
}

// archiveInfo is what inspecting an image archive or layout yields.
type archiveInfo struct {
	kind     Kind
	digest   v1.Hash // OCI: the image manifest's digest; docker save: the config's digest (the image ID)
	manifest *v1.Manifest
	rawMan   []byte
	config   *v1.ConfigFile
	rawCfg   []byte
}

// inspect decides whether the tar is an OCI archive or a `docker save`
// archive and validates it: every document parses, every blob it names is
// present with the right size, the small blobs hash to their digests.
// `docker save` of Docker 25+ writes both formats; the OCI view is used then.
func (a *tarArchive) inspect() (archiveInfo, error) {
	_, errLayout := a.member("oci-layout")
	_, errIndex := a.member("index.json")
	if errLayout == nil && errIndex == nil {
		info, err := inspectOCI(a)
		info.kind = KindOCIArchive
		return info, err
	}
	if _, err := a.member("manifest.json"); err == nil {
		return a.inspectDocker()
	}
	return archiveInfo{}, newErr("", ErrUnsupported, "a tar that is neither a docker save archive (manifest.json) nor an OCI archive (oci-layout, index.json)", hintLocal, nil)
}

func (a *tarArchive) inspectDocker() (archiveInfo, error) {
	corrupt := func(detail string, err error) (archiveInfo, error) {
		return archiveInfo{}, newErr("", ErrCorrupt, detail, "the archive must be written by docker save (or an equivalent) and be complete", err)
	}
	b, err := a.readFile("manifest.json", maxIndexBytes)
	if err != nil {
		return corrupt("cannot read manifest.json", err)
	}
	var m tarball.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return corrupt("malformed manifest.json", err)
	}
	switch {
	case len(m) == 0:
		return corrupt("manifest.json lists no image", nil)
	case len(m) > 1:
		return archiveInfo{}, newErr("", ErrUnsupported, fmt.Sprintf("the archive holds %d images", len(m)), "save a single image: docker save -o FILE IMAGE:TAG", nil)
	}
	d := m[0]
	rawCfg, err := a.readFile(d.Config, maxConfigBytes)
	if err != nil {
		return corrupt(fmt.Sprintf("cannot read the image config %q", d.Config), err)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(rawCfg))
	if err != nil {
		return corrupt("malformed image config", err)
	}
	if len(cfg.RootFS.DiffIDs) != len(d.Layers) {
		return corrupt(fmt.Sprintf("the config names %d layers, manifest.json %d", len(cfg.RootFS.DiffIDs), len(d.Layers)), nil)
	}
	for _, l := range d.Layers {
		if _, err := a.member(l); err != nil {
			return corrupt(fmt.Sprintf("layer %q is missing", l), nil)
		}
	}
	sum := sha256.Sum256(rawCfg)
	return archiveInfo{
		kind:   KindDockerArchive,
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])},
		config: cfg,
		rawCfg: rawCfg,
	}, nil
}

// inspectOCI resolves the single image of an OCI layout for this platform
// (linux/GOARCH), following nested indexes, and validates it.
func inspectOCI(l layoutFS) (archiveInfo, error) {
	corrupt := func(detail string, err error) (archiveInfo, error) {
		return archiveInfo{}, newErr("", ErrCorrupt, detail, "an OCI layout needs oci-layout, index.json and every blob they name, e.g. as written by skopeo copy or docker buildx --output type=oci", err)
	}
	b, err := l.readFile("oci-layout", 4096)
	if err != nil {
		return corrupt("cannot read oci-layout", err)
	}
	var lay struct {
		Version string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(b, &lay); err != nil || lay.Version == "" {
		return corrupt("malformed oci-layout", err)
	}
	b, err = l.readFile("index.json", maxIndexBytes)
	if err != nil {
		return corrupt("cannot read index.json", err)
	}
	idx, err := v1.ParseIndexManifest(bytes.NewReader(b))
	if err != nil {
		return corrupt("malformed index.json", err)
	}
	desc, err := pickManifest(l, idx.Manifests, 0)
	if err != nil {
		return archiveInfo{}, err
	}
	rawMan, err := readBlob(l, desc, maxIndexBytes)
	if err != nil {
		return archiveInfo{}, err
	}
	man, err := v1.ParseManifest(bytes.NewReader(rawMan))
	if err != nil {
		return corrupt("malformed image manifest "+desc.Digest.String(), err)
	}
	rawCfg, err := readBlob(l, man.Config, maxConfigBytes)
	if err != nil {
		return archiveInfo{}, err
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(rawCfg))
	if err != nil {
		return corrupt("malformed image config "+man.Config.Digest.String(), err)
	}
	if len(cfg.RootFS.DiffIDs) != len(man.Layers) {
		return corrupt(fmt.Sprintf("the config names %d layers, the manifest %d", len(cfg.RootFS.DiffIDs), len(man.Layers)), nil)
	}
	for _, ld := range man.Layers {
		name, err := blobName(ld.Digest)
		if err != nil {
			return corrupt("bad layer digest", err)
		}
		n, err := l.fileSize(name)
		if err != nil {
			return corrupt("layer blob "+ld.Digest.String()+" is missing", nil)
		}
		if n != ld.Size {
			return corrupt(fmt.Sprintf("layer blob %s has %d bytes, the manifest says %d (truncated?)", ld.Digest, n, ld.Size), nil)
		}
	}
	return archiveInfo{kind: KindOCILayout, digest: desc.Digest, manifest: man, rawMan: rawMan, config: cfg, rawCfg: rawCfg}, nil
}

// pickManifest chooses the one image manifest among descs for linux/GOARCH,
// descending into nested indexes (at most 4 deep). Attestation manifests
// (platform unknown/unknown) are ignored.
func pickManifest(l layoutFS, descs []v1.Descriptor, depth int) (v1.Descriptor, error) {
	if depth > 4 {
		return v1.Descriptor{}, newErr("", ErrCorrupt, "image indexes nested too deep", "", nil)
	}
	want := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	var cands []v1.Descriptor
	for _, d := range descs {
		if d.Platform != nil && (d.Platform.OS != want.OS || d.Platform.Architecture != want.Architecture) {
			continue
		}
		switch d.MediaType {
		case types.OCIManifestSchema1, types.DockerManifestSchema2, types.OCIImageIndex, types.DockerManifestList:
			cands = append(cands, d)
		}
	}
	switch {
	case len(cands) == 0:
		return v1.Descriptor{}, newErr("", ErrUnsupported, "no image for "+want.String(), "the archive must hold a linux/"+runtime.GOARCH+" image", nil)
	case len(cands) > 1:
		return v1.Descriptor{}, newErr("", ErrUnsupported, fmt.Sprintf("the layout holds %d images for %s", len(cands), want.String()), "keep one image in the layout (e.g. skopeo copy docker://REF oci:DIR:TAG into an empty directory)", nil)
	}
	d := cands[0]
	if d.MediaType == types.OCIImageIndex || d.MediaType == types.DockerManifestList {
		b, err := readBlob(l, d, maxIndexBytes)
		if err != nil {
			return v1.Descriptor{}, err
		}
		idx, err := v1.ParseIndexManifest(bytes.NewReader(b))
		if err != nil {
			return v1.Descriptor{}, newErr("", ErrCorrupt, "malformed image index "+d.Digest.String(), "", err)
		}
		return pickManifest(l, idx.Manifests, depth+1)
	}
	return d, nil
}

// blobName is the path of a blob inside an OCI layout. The digest is
// validated (algorithm sha256, 64 hex digits) so it cannot name another path.
func blobName(h v1.Hash) (string, error) {
	if h.Algorithm != "sha256" || len(h.Hex) != 64 {
		return "", fmt.Errorf("unsupported digest %q", h.String())
	}
	if _, err := hex.DecodeString(h.Hex); err != nil {
		return "", fmt.Errorf("bad digest %q", h.String())
	}
	return "blobs/sha256/" + h.Hex, nil
}

// readBlob reads a small blob and verifies its size and digest.
func readBlob(l layoutFS, d v1.Descriptor, max int64) ([]byte, error) {
	name, err := blobName(d.Digest)
	if err != nil {
		return nil, newErr("", ErrCorrupt, "bad descriptor", "", err)
	}
	b, err := l.readFile(name, max)
	if err != nil {
		return nil, newErr("", ErrCorrupt, "cannot read blob "+d.Digest.String(), "", err)
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != d.Digest.Hex || int64(len(b)) != d.Size {
		return nil, newErr("", ErrCorrupt, "blob "+d.Digest.String()+" does not match its digest or size", "", nil)
	}
	return b, nil
}

// ociTarImage is an OCI image read straight out of a tar of an OCI layout
// (no unpacking to disk). Layer blobs are verified against their digests as
// they are read.
type ociTarImage struct {
	a    *tarArchive
	info archiveInfo
}

var _ partial.CompressedImageCore = (*ociTarImage)(nil)

func (i *ociTarImage) RawConfigFile() ([]byte, error) { return i.info.rawCfg, nil }
func (i *ociTarImage) RawManifest() ([]byte, error)   { return i.info.rawMan, nil }
func (i *ociTarImage) MediaType() (types.MediaType, error) {
	if i.info.manifest.MediaType != "" {
		return i.info.manifest.MediaType, nil
	}
	return types.OCIManifestSchema1, nil
}

func (i *ociTarImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for _, d := range i.info.manifest.Layers {
		if d.Digest == h {
			return &ociTarLayer{a: i.a, desc: d}, nil
		}
	}
	if h == i.info.manifest.Config.Digest {
		return &ociTarLayer{a: i.a, desc: i.info.manifest.Config}, nil
	}
	return nil, fmt.Errorf("blob %s not in manifest", h)
}

type ociTarLayer struct {
	a    *tarArchive
	desc v1.Descriptor
}

func (l *ociTarLayer) Digest() (v1.Hash, error)            { return l.desc.Digest, nil }
func (l *ociTarLayer) Size() (int64, error)                { return l.desc.Size, nil }
func (l *ociTarLayer) MediaType() (types.MediaType, error) { return l.desc.MediaType, nil }
func (l *ociTarLayer) Compressed() (io.ReadCloser, error) {
	name, err := blobName(l.desc.Digest)
	if err != nil {
		return nil, err
	}
	r, err := l.a.open(name)
	if err != nil {
		return nil, err
	}
	return newVerifyReader(io.NopCloser(r), l.desc.Digest, "layer blob "+l.desc.Digest.String()), nil
}

// verifyReader hashes what is read through it and fails at EOF when the
// sha256 differs from want.
type verifyReader struct {
	rc   io.ReadCloser
	h    hash.Hash
	want v1.Hash
	what string
}

func newVerifyReader(rc io.ReadCloser, want v1.Hash, what string) *verifyReader {
	return &verifyReader{rc: rc, h: sha256.New(), want: want, what: what}
}

func (v *verifyReader) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	if errors.Is(err, io.EOF) {
		if got := hex.EncodeToString(v.h.Sum(nil)); got != v.want.Hex {
			return n, newErr("", ErrCorrupt, fmt.Sprintf("%s does not match its digest (got sha256:%s)", v.what, got), "the archive is damaged; write it again", nil)
		}
	}
	return n, err
}

func (v *verifyReader) Close() error { return v.rc.Close() }

// verifiedImage checks every layer's uncompressed bytes against the
// config's rootfs.diff_ids while mutate.Extract reads them, so the image
// config digest (which covers the diff_ids) is a content address of the
// flattened filesystem, whatever the source.
type verifiedImage struct {
	v1.Image
	diffIDs []v1.Hash
}

func (i verifiedImage) Layers() ([]v1.Layer, error) {
	ls, err := i.Image.Layers()
	if err != nil {
		return nil, err
	}
	if len(ls) != len(i.diffIDs) {
		return nil, newErr("", ErrCorrupt, fmt.Sprintf("the image has %d layers, its config %d diff_ids", len(ls), len(i.diffIDs)), "", nil)
	}
	out := make([]v1.Layer, len(ls))
	for n, l := range ls {
		out[n] = verifiedLayer{Layer: l, want: i.diffIDs[n]}
	}
	return out, nil
}

type verifiedLayer struct {
	v1.Layer
	want v1.Hash
}

func (l verifiedLayer) Uncompressed() (io.ReadCloser, error) {
	rc, err := l.Layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	if l.want.Algorithm != "sha256" {
		return rc, nil
	}
	return newVerifyReader(rc, l.want, "layer "+l.want.String()), nil
}

// imageFromTar opens the v1.Image of a validated archive held in the file
// at p, whose index is a and inspection info.
func imageFromTar(p string, a *tarArchive, info archiveInfo) (v1.Image, error) {
	var img v1.Image
	var err error
	switch info.kind {
	case KindDockerArchive:
		img, err = tarball.Image(func() (io.ReadCloser, error) { return os.Open(p) }, nil)
	default:
		img, err = partial.CompressedToImage(&ociTarImage{a: a, info: info})
	}
	if err != nil {
		return nil, newErr("", ErrCorrupt, "cannot read the image", "", err)
	}
	return verifiedImage{Image: img, diffIDs: info.config.RootFS.DiffIDs}, nil
}
