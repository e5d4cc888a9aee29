package image

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// remoteOptions: anonymous pulls only. The launcher runs as root, and a
// keychain would lend root's registry credentials to any user naming a
// private image.
func remoteOptions(ctx context.Context) []remote.Option {
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuth(authn.Anonymous),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
		remote.WithUserAgent("slurm-microvm"),
	}
}

func prepareRegistry(ctx context.Context, ref string, o Options) (*Image, error) {
	r, err := parseRegistryRef(ref, o.Insecure)
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(r, remoteOptions(ctx)...)
	if err != nil {
		return nil, registryErr(r, err)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, registryErr(r, err)
	}
	dg, err := img.Digest()
	if err != nil {
		return nil, registryErr(r, err)
	}
	return prepareCached(ctx, ref, KindRegistry, dg.String(), 0, o, func(ctx context.Context, work, rootfs string, b budget) (Config, error) {
		cfg, err := unpackImage(ctx, img, rootfs, b, o)
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				return cfg, err
			}
			return cfg, registryErr(r, err)
		}
		return cfg, nil
	})
}

// checkRegistry asks the registry for the manifest (HEAD, 15 s at most).
func checkRegistry(ctx context.Context, ref string, o Options) error {
	r, err := parseRegistryRef(ref, o.Insecure)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := remote.Head(r, remoteOptions(ctx)...); err != nil {
		err = registryErr(r, err)
		if errors.Is(err, ErrRegistry) {
			o.Logger.Warn("cannot check the image in its registry; the compute node will try", "ref", ref, "err", err)
			return nil
		}
		return err
	}
	return nil
}

// registryErr classifies a go-containerregistry error.
func registryErr(r name.Reference, err error) error {
	where := r.Context().RegistryStr()
	var te *transport.Error
	if errors.As(err, &te) {
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode:
				return notFound(r)
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return newErr("", ErrPermission, "the registry "+where+" refused an anonymous pull", "images are pulled without credentials; use a public image or save it to a file (docker save, enroot import) and pass its path", nil)
			}
		}
		switch te.StatusCode {
		case http.StatusNotFound:
			return notFound(r)
		case http.StatusUnauthorized, http.StatusForbidden:
			return newErr("", ErrPermission, "the registry "+where+" refused an anonymous pull", "images are pulled without credentials; use a public image or save it to a file and pass its path", nil)
		}
		return newErr("", ErrRegistry, "the registry "+where+" answered with an error", "", err)
	}
	var ue *url.Error
	var ne net.Error
	if errors.As(err, &ue) || errors.As(err, &ne) {
		return newErr("", ErrRegistry, "cannot reach the registry "+where, "check the host name and port, and that this node can reach it", err)
	}
	if strings.Contains(err.Error(), "no child with platform") {
		return newErr("", ErrUnsupported, "the image has no linux/"+runtime.GOARCH+" variant", "", err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return newErr("", ErrRegistry, "pull from "+where+" failed", "", err)
}

func notFound(r name.Reference) error {
	return newErr("", ErrNotFound, "not found in the registry "+r.Context().RegistryStr()+" (unknown repository, tag or digest)",
		"check the repository and tag, e.g. with skopeo list-tags docker://"+r.Context().String(), nil)
}
