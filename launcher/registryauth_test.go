package launcher

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// TestPrivateRegistryStep starts steps whose image is in a registry that
// requires basic authentication (a real docker-registry with an htpasswd
// file), the credentials in the job user's ~/.docker/config.json, found
// through the passwd database as the launcher does on a node. With the
// right password the image is pulled (the step then fails later, at the
// guest assets, on purpose: no VM boots); with a wrong one the start
// fails naming the registry and the file. Neither password is in the
// supervisor's log, the step's state directory (spec.json, the error
// record) or the image cache.
func TestPrivateRegistryStep(t *testing.T) {
	fixture.RequireRoot(t)
	fixture.Require(t, "mkfs.erofs", "useradd", "usermod", "userdel")
	tmp := t.TempDir()
	for _, d := range []string{filepath.Dir(tmp), tmp} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(tmp, "home")
	u := regTestUser(t, home)

	const login = "smv-step-puller"
	password := "pw-" + regRandHex(t)
	wrong := "wrong-" + regRandHex(t)
	host := fixture.StartRegistry(t, fixture.Htpasswd(t, login, password))
	ref := host + "/team/private:1"
	pushTiny(t, ref, authn.FromConfig(authn.AuthConfig{Username: login, Password: password}))

	for _, tc := range []struct {
		name, password string
		errHas         string // the start error says this
		errHasNot      string
	}{
		{"right password", password, "", "refused"},
		{"wrong password", wrong, "refused the credentials (password) from " + filepath.Join(home, ".docker/config.json"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgJSON := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, host, base64.StdEncoding.EncodeToString([]byte(login+":"+tc.password)))
			if err := os.MkdirAll(filepath.Join(home, ".docker"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(home, ".docker/config.json"), []byte(cfgJSON), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{home, filepath.Join(home, ".docker"), filepath.Join(home, ".docker/config.json")} {
				if err := os.Chown(p, u.uid, u.gid); err != nil {
					t.Fatal(err)
				}
			}
			run := filepath.Join(tmp, "run-"+strings.ReplaceAll(tc.name, " ", "-"))
			cache := filepath.Join(tmp, "cache-"+strings.ReplaceAll(tc.name, " ", "-"))
			cfg := config.Defaults()
			cfg.RuntimeDir, cfg.CacheDir = run, cache
			cfg.Log.Dir = ""
			cfg.Mounts.ScratchBase = ""
			cfg.MPI.Default = "off"
			// The start stops at the guest assets, after the image: no VM.
			cfg.QEMU.Agent = filepath.Join(tmp, "no-such-agent")
			logs := &fixture.SyncBuffer{}
			l := &Launcher{Config: &cfg, Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
				imageHelper: []string{testBinary(t)}, imageHelperEnv: []string{envImageHelper + "=1"}}
			s := &Spec{ID: state.StepID{Job: 4000000000 + uint32(time.Now().UnixNano()%1000000), Step: 0},
				UID: uint32(u.uid), GID: uint32(u.gid), Groups: []uint32{uint32(u.gid)}, User: u.name,
				Image: ref, MemMiB: 512, CPUs: 1, LocalTasks: 1, Hostname: "launcher-test", Network: "none"}
			ctx := context.Background()
			if err := l.Prepare(ctx, s); err != nil {
				t.Fatal(err)
			}
			d := s.Dir(&cfg)
			t.Cleanup(func() {
				_ = os.Remove(d.File(state.SupervisorFile))
				if err := l.Stop(context.Background(), s.ID); err != nil {
					t.Errorf("stop: %v", err)
				}
			})
			err := l.Start(ctx, s.ID)
			if err == nil {
				t.Fatal("the step started with no agent")
			}
			t.Logf("start: %v", err)
			if tc.errHas != "" && !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("start error does not say %q: %v", tc.errHas, err)
			}
			if tc.errHasNot != "" && strings.Contains(err.Error(), tc.errHasNot) {
				t.Errorf("start error says %q: %v", tc.errHasNot, err)
			}
			if tc.errHas == "" && !strings.Contains(logs.String(), "image ready") {
				t.Errorf("the image was not pulled:\n%s", logs.String())
			}
			secrets := []string{password, wrong, base64.StdEncoding.EncodeToString([]byte(login + ":" + tc.password))}
			for _, sec := range secrets {
				if strings.Contains(logs.String(), sec) || strings.Contains(err.Error(), sec) {
					t.Errorf("a credential is in the log or the error:\n%v\n%s", err, logs.String())
				}
				for _, dir := range []string{run, cache} {
					filepath.WalkDir(dir, func(p string, de fs.DirEntry, werr error) error {
						if werr != nil || !de.Type().IsRegular() {
							return nil
						}
						if b, rerr := os.ReadFile(p); rerr == nil && bytes.Contains(b, []byte(sec)) {
							t.Errorf("%s holds a credential", p)
						}
						return nil
					})
				}
			}
			if _, serr := os.Stat(d.File(state.SpecFile)); serr != nil {
				t.Errorf("no spec.json was checked: %v", serr)
			}
			if t.Failed() {
				t.Logf("supervisor log:\n%s", logs.String())
			}
		})
	}
}

type regUser struct {
	name     string
	uid, gid int
}

// regTestUser makes (or re-homes) a system user whose passwd home is home.
func regTestUser(t *testing.T, home string) regUser {
	t.Helper()
	const nm = "smv-regtest"
	if _, err := user.Lookup(nm); err != nil {
		out, err := exec.Command("useradd", "--system", "--no-create-home", "--home-dir", home, "--shell", "/usr/sbin/nologin", "--user-group", nm).CombinedOutput()
		if err != nil {
			t.Fatalf("useradd: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("userdel", nm).Run() })
	} else if out, err := exec.Command("usermod", "--home", home, nm).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v: %s", err, out)
	}
	pw, err := user.Lookup(nm)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(pw.Uid)
	gid, _ := strconv.Atoi(pw.Gid)
	return regUser{nm, uid, gid}
}

// pushTiny pushes an image of one small file to ref.
func pushTiny(t *testing.T, ref string, a authn.Authenticator) {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	body := "private\n"
	if err := tw.WriteHeader(&tar.Header{Name: "etc/private", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(tw, body)
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithAuth(a)); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func regRandHex(t *testing.T) string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
