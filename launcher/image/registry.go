package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/slurm-microvm/slurm-microvm/launcher/image/auth"
)

// remoteOptions: the job user's own credential when one was found (see
// credentials), else anonymous. Never root's keychain: it would lend root's
// registry credentials to any user naming a private image.
func remoteOptions(ctx context.Context, res auth.Result) []remote.Option {
	var a authn.Authenticator = authn.Anonymous
	if res.Found() {
		c := res.Cred
		a = authn.FromConfig(authn.AuthConfig{Username: c.Username, Password: c.Password, IdentityToken: c.IdentityToken, RegistryToken: c.RegistryToken})
	}
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuth(a),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
		remote.WithUserAgent("slurm-microvm"),
	}
}

func prepareRegistry(ctx context.Context, ref string, o Options) (*Image, error) {
	r, err := parseRegistryRef(ref, o.Insecure)
	if err != nil {
		return nil, err
	}
	res, err := o.credentials(ctx, r)
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(r, remoteOptions(ctx, res)...)
	if err != nil {
		return nil, registryErr(r, err, res)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, registryErr(r, err, res)
	}
	dg, err := img.Digest()
	if err != nil {
		return nil, registryErr(r, err, res)
	}
	return prepareCached(ctx, ref, KindRegistry, dg.String(), 0, o, func(ctx context.Context, work, rootfs string, b budget) (Config, error) {
		cfg, err := unpackImage(ctx, img, rootfs, b, o)
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				return cfg, err
			}
			return cfg, registryErr(r, err, res)
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
	res, err := o.credentials(ctx, r)
	if err != nil {
		return err
	}
	if _, err := remote.Head(r, remoteOptions(ctx, res)...); err != nil {
		err = registryErr(r, err, res)
		if errors.Is(err, ErrRegistry) {
			o.Logger.Warn("cannot check the image in its registry; the compute node will try", "ref", ref, "err", err)
			return nil
		}
		return err
	}
	return nil
}

// credentials looks up the job user's credential for r's registry, read
// as that user (package auth): in this process when it runs as o.UID,
// else in the helper child. The lookup is logged by its source file and
// kind, never its values.
func (o *Options) credentials(ctx context.Context, r name.Reference) (auth.Result, error) {
	reg, repo := r.Context().RegistryStr(), r.Context().RepositoryStr()
	var res auth.Result
	if os.Geteuid() == int(o.UID) {
		// A home directory that cannot be looked up is in res.Tried.
		res, _ = auth.Lookup(o.Auth, reg, repo)
	} else {
		env, err := json.Marshal(o.Auth)
		if err != nil {
			return res, err
		}
		args := []string{"auth", string(env), reg, repo}
		cmd, stderr, err := o.helperCmd(ctx, true, args...)
		if err != nil {
			return res, err
		}
		out, werr := cmd.Output()
		if err := helperResult(args[:1], werr, stderr); err != nil {
			return res, err
		}
		if err := json.Unmarshal(out, &res); err != nil {
			return res, newErr("", errHelper, "helper auth printed bad JSON", "", nil)
		}
	}
	if res.Found() {
		o.Logger.Info("registry credentials", "registry", reg, "source", res.Source, "kind", res.Cred.Kind())
	} else {
		o.Logger.Debug("no registry credentials; pulling anonymously", "registry", reg, "tried", strings.Join(res.Tried, "; "))
	}
	return res, nil
}

// registryErr classifies a go-containerregistry error; res is the
// credential lookup the request used (named in an authentication error).
func registryErr(r name.Reference, err error, res auth.Result) error {
	where := r.Context().RegistryStr()
	var te *transport.Error
	if errors.As(err, &te) {
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode:
				return notFound(r)
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return authErr(r, res)
			}
		}
		switch te.StatusCode {
		case http.StatusNotFound:
			return notFound(r)
		case http.StatusUnauthorized, http.StatusForbidden:
			return authErr(r, res)
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

// authErr is the error of a registry that refused the request: without a
// credential it names every source read and what it held; with one, the
// file it came from (never the credential).
func authErr(r name.Reference, res auth.Result) error {
	where := r.Context().RegistryStr()
	login := fmt.Sprintf("log in with `docker login %s` (or `podman login --authfile ~/.docker/config.json %s`), or add `machine %s login USER password TOKEN` to ~/.config/enroot/.credentials", where, where, where)
	if !res.Found() {
		return newErr("", ErrPermission, "the registry "+where+" requires authentication and no credentials for it were found",
			"credentials are read as the job's user from, in order: "+strings.Join(res.Tried, "; ")+"; "+login, nil)
	}
	return newErr("", ErrPermission, fmt.Sprintf("the registry %s refused the credentials (%s) from %s", where, res.Cred.Kind(), res.Source),
		"the password or token is wrong or expired, or the account may not pull "+r.Context().RepositoryStr()+"; "+login, nil)
}

func notFound(r name.Reference) error {
	return newErr("", ErrNotFound, "not found in the registry "+r.Context().RegistryStr()+" (unknown repository, tag or digest)",
		"check the repository and tag, e.g. with skopeo list-tags docker://"+r.Context().String(), nil)
}
