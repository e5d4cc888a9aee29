package image

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/slurm-microvm/slurm-microvm/launcher/image/auth"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// syncBuffer collects log output from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPrivateRegistry pulls from a real docker-registry that requires HTTP
// basic authentication (htpasswd, bcrypt), with the job user's credentials
// in each of the formats users keep them in (containers-auth.json via
// REGISTRY_AUTH_FILE, Docker's config.json, enroot's .credentials), read as
// that user by the helper; without them, with a wrong password, through a
// symlink to root's file, and behind a credential helper the pull fails and
// says why. No password reaches the log, an error, or the cache directory.
func TestPrivateRegistry(t *testing.T) {
	needRoot(t)
	needTools(t, "htpasswd", "mkfs.erofs")
	const login = "smv-puller"
	password := "pw-" + randHex(t, 12)
	wrong := "wrong-" + randHex(t, 12)
	secrets := []string{password, wrong,
		base64.StdEncoding.EncodeToString([]byte(login + ":" + password)),
		base64.StdEncoding.EncodeToString([]byte(login + ":" + wrong))}

	// Everything the test user reads lies under a searchable directory.
	base, err := os.MkdirTemp("", "image-auth-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	htpasswd := fixture.Htpasswd(t, login, password)
	reg := startRegistryAuth(t, htpasswd)

	// A small image, pushed with the credentials.
	lt := filepath.Join(base, "layer.tar")
	if err := writeTar(lt, []tarEntry{{name: "etc/", dir: true, mode: 0o755}, {name: "etc/private", body: "from a private registry\n", mode: 0o644}}); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromFile(lt)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.host + "/team/private:1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	basic := authn.FromConfig(authn.AuthConfig{Username: login, Password: password})
	if err := remote.Write(r, img, remote.WithAuth(basic)); err != nil {
		t.Fatalf("push with credentials: %v", err)
	}
	if err := remote.Write(r, img); err == nil {
		t.Fatal("anonymous push succeeded: the registry does not require authentication")
	}
	digest, _ := img.Digest()

	// A root-only file holding valid credentials, for the symlink case.
	rootDir := filepath.Join(base, "root-only")
	if err := os.Mkdir(rootDir, 0o700); err != nil {
		t.Fatal(err)
	}
	rootConfig := filepath.Join(rootDir, "config.json")
	if err := os.WriteFile(rootConfig, dockerConfig(reg.host, login, password), 0o600); err != nil {
		t.Fatal(err)
	}

	type file struct {
		path string // relative to the home directory
		body []byte
		link string // a symlink to this instead
	}
	cases := []struct {
		name   string
		files  []file
		env    func(home string) auth.Env
		inProc bool     // run as the user itself (uid 0, no helper)
		want   error    // nil: the pull works
		errHas []string // the error names these
	}{
		{name: "containers-auth.json from REGISTRY_AUTH_FILE",
			files: []file{{path: "auth.json", body: []byte(fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg.host+"/team", b64(login+":"+password)))}},
			env:   func(h string) auth.Env { return auth.Env{Home: h, RegistryAuthFile: filepath.Join(h, "auth.json")} }},
		{name: "docker config.json in the home directory",
			files: []file{{path: ".docker/config.json", body: dockerConfig(reg.host, login, password)}}},
		{name: "docker config.json from DOCKER_CONFIG",
			files: []file{{path: "dcfg/config.json", body: dockerConfig("http://"+reg.host, login, password)}},
			env:   func(h string) auth.Env { return auth.Env{Home: h, DockerConfig: filepath.Join(h, "dcfg")} }},
		{name: "enroot .credentials",
			files: []file{{path: ".config/enroot/.credentials", body: []byte("# private\nmachine 127.0.0.1 login " + login + " password " + password + "\n")}}},
		{name: "enroot .credentials from ENROOT_CONFIG_PATH, read in-process",
			files:  []file{{path: "enroot/.credentials", body: []byte("machine " + reg.host + "\n  login " + login + "\n  password \"" + password + "\"\n")}},
			env:    func(h string) auth.Env { return auth.Env{Home: h, EnrootConfigPath: filepath.Join(h, "enroot")} },
			inProc: true},
		{name: "no credentials", want: ErrPermission,
			errHas: []string{reg.host, "requires authentication", "no credentials", ".config/containers/auth.json: no such file", ".docker/config.json: no such file", ".config/enroot/.credentials: no such file", "docker login"}},
		{name: "wrong password", want: ErrPermission,
			files:  []file{{path: ".docker/config.json", body: dockerConfig(reg.host, login, wrong)}},
			errHas: []string{reg.host, "refused the credentials", ".docker/config.json"}},
		{name: "symlink to a root-only file", want: ErrPermission,
			files:  []file{{path: ".docker/config.json", link: rootConfig}},
			errHas: []string{reg.host, "requires authentication", ".docker/config.json: permission denied"}},
		{name: "credential helper only", want: ErrPermission,
			files:  []file{{path: ".docker/config.json", body: []byte(fmt.Sprintf(`{"auths":{%q:{}},"credsStore":"pass"}`, reg.host))}},
			errHas: []string{reg.host, "requires authentication", `"credsStore" names docker-credential-pass`}},
	}
	var logs syncBuffer
	var errs []string
	var caches []string
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			uid, gid := testUID, testGID
			if tc.inProc {
				uid, gid = 0, 0
			}
			home := filepath.Join(base, "home-"+strings.ReplaceAll(tc.name, " ", "-"))
			for _, f := range tc.files {
				p := filepath.Join(home, f.path)
				if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
					t.Fatal(err)
				}
				if f.link != "" {
					err = os.Symlink(f.link, p)
				} else {
					err = os.WriteFile(p, f.body, 0o600)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := os.MkdirAll(home, 0o700); err != nil {
				t.Fatal(err)
			}
			chownTree(t, home, uid, gid)
			o := opts(t)
			o.UID, o.GID = uid, gid
			o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			o.Auth = auth.Env{Home: home}
			if tc.env != nil {
				o.Auth = tc.env(home)
			}
			caches = append(caches, o.CacheRoot)
			cerr := Check(ctx, ref, o)
			got, err := Prepare(ctx, ref, o)
			if tc.want == nil {
				if cerr != nil {
					t.Errorf("Check: %v", cerr)
				}
				if err != nil {
					t.Fatalf("Prepare: %v", err)
				}
				if got.Kind != KindRegistry || got.Digest != digest.String() {
					t.Errorf("Prepare = kind %s digest %s, want %s %s", got.Kind, got.Digest, KindRegistry, digest)
				}
				return
			}
			for _, e := range []error{cerr, err} {
				if !errors.Is(e, tc.want) {
					t.Fatalf("got %v, want %v", e, tc.want)
				}
				errs = append(errs, e.Error())
				for _, s := range tc.errHas {
					if !strings.Contains(e.Error(), s) {
						t.Errorf("error does not say %q:\n%v", s, e)
					}
				}
			}
			t.Logf("error: %v", err)
		})
	}
	// No secret anywhere it could be read back: the log, the errors, the
	// cache (disk metadata JSON, disks, locks).
	for _, s := range secrets {
		if strings.Contains(logs.String(), s) {
			t.Errorf("the log holds a credential:\n%s", logs.String())
		}
		for _, e := range errs {
			if strings.Contains(e, s) {
				t.Errorf("an error holds a credential: %s", e)
			}
		}
		for _, c := range caches {
			filepath.WalkDir(c, func(p string, d fs.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return nil
				}
				if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(s)) {
					t.Errorf("%s holds a credential", p)
				}
				return nil
			})
		}
	}
	if !strings.Contains(logs.String(), "registry credentials") {
		t.Errorf("the log does not record where the credentials came from:\n%s", logs.String())
	}
}

func dockerConfig(key, login, password string) []byte {
	return []byte(fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, key, b64(login+":"+password)))
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func randHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// chownTree gives dir and everything below it (symlinks themselves) to uid:gid.
func chownTree(t *testing.T, dir string, uid, gid uint32) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(uid), int(gid))
	})
	if err != nil {
		t.Fatal(err)
	}
}
