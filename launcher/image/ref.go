package image

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// Kind is the detected kind of an image source.
type Kind string

// Kinds of sources, detected from content (never from the file name).
const (
	KindRegistry      Kind = "registry"       // a registry reference, pulled with go-containerregistry
	KindDockerArchive Kind = "docker-archive" // `docker save` tar (manifest.json)
	KindOCIArchive    Kind = "oci-archive"    // tar of an OCI image layout (oci-layout + index.json)
	KindOCILayout     Kind = "oci-layout"     // OCI image layout directory
	KindSquashfs      Kind = "squashfs"       // squashfs file (as enroot makes), magic "hsqs"
	KindRootfs        Kind = "rootfs"         // a root filesystem directory
)

// isLocal reports whether ref names a local path. The rule is pyxis': a
// local image path is absolute or starts with ./ or ../; anything else is a
// registry reference.
func isLocal(ref string) bool {
	return strings.HasPrefix(ref, "/") || strings.HasPrefix(ref, "./") ||
		strings.HasPrefix(ref, "../") || ref == "." || ref == ".."
}

// localPath makes a local reference absolute (relative to the current
// directory, which the caller should have set to the user's: the SPANK plugin
// and `validate` resolve relative paths on the submit side).
func localPath(ref string) (string, error) {
	p, err := filepath.Abs(ref)
	if err != nil {
		return "", newErr(ref, ErrInvalidRef, "cannot make the path absolute", hintRef, err)
	}
	return p, nil
}

// parseRegistryRef turns a user's registry reference into a name.Reference.
// Accepted forms: "docker://host[:port]/repo[:tag|@digest]", the same without
// the scheme, and enroot/pyxis' "host#repo:tag". Bare names default to Docker
// Hub like `docker pull`. insecure allows plain http, and is honoured only
// for registries on a loopback address.
func parseRegistryRef(ref string, insecure bool) (name.Reference, error) {
	s := strings.TrimPrefix(ref, "docker://")
	for _, t := range transportPrefixes {
		if strings.HasPrefix(s, t) {
			return nil, newErr(ref, ErrInvalidRef, fmt.Sprintf("%q is a skopeo/podman transport prefix, not used here", t),
				"give a local image as its path (absolute or starting with ./ or ../), a registry image as host/repo:tag or docker://host/repo:tag", nil)
		}
	}
	if strings.Contains(s, "://") {
		return nil, newErr(ref, ErrInvalidRef, "unknown scheme", hintRef, nil)
	}
	if at := strings.Index(s, "@"); at >= 0 && !strings.HasPrefix(s[at:], "@sha256:") {
		return nil, newErr(ref, ErrInvalidRef, "credentials in the reference are not supported", "name the image as host/repo:tag and keep the credentials in ~/.docker/config.json or ~/.config/enroot/.credentials", nil)
	}
	if i := strings.Index(s, "#"); i >= 0 {
		s = s[:i] + "/" + s[i+1:]
	}
	if s == "" {
		return nil, newErr(ref, ErrInvalidRef, "empty reference", hintRef, nil)
	}
	var opts []name.Option
	if insecure && loopbackRegistry(s) {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(s, opts...)
	if err != nil {
		return nil, newErr(ref, ErrInvalidRef, "not a valid registry reference", hintRef, err)
	}
	return r, nil
}

// transportPrefixes are the image transports of containers/image (skopeo,
// podman) that users may carry over; they are refused with a hint rather
// than read as a registry host.
var transportPrefixes = []string{"oci-archive:", "docker-archive:", "oci:", "dir:", "docker-daemon:", "containers-storage:", "sif:", "tarball:"}

// loopbackRegistry reports whether the registry part of s (before the first
// "/") is localhost or a loopback IP address, with an optional port.
func loopbackRegistry(s string) bool {
	host, _, ok := strings.Cut(s, "/")
	if !ok {
		return false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// String implements fmt.Stringer.
func (k Kind) String() string { return string(k) }
