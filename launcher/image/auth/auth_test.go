package auth

import (
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestLookup(t *testing.T) {
	const reg = "registry.example.com:5000"
	cases := []struct {
		name     string
		files    map[string]string // path under home -> content
		env      func(home string) Env
		registry string
		repo     string
		want     Credential
		source   string   // file under home the credential comes from
		tried    []string // Result.Tried holds these substrings
	}{
		{name: "docker config auth field",
			files: map[string]string{".docker/config.json": fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg, b64("u:p:with:colons"))},
			want:  Credential{Username: "u", Password: "p:with:colons"}, source: ".docker/config.json"},
		{name: "docker config legacy URL key for Docker Hub",
			files:    map[string]string{".docker/config.json": fmt.Sprintf(`{"auths":{"https://index.docker.io/v1/":{"auth":%q}}}`, b64("hub:pw"))},
			registry: "index.docker.io", repo: "library/ubuntu",
			want: Credential{Username: "hub", Password: "pw"}, source: ".docker/config.json"},
		{name: "docker config identity token",
			files: map[string]string{".docker/config.json": fmt.Sprintf(`{"auths":{%q:{"identitytoken":"tok"}}}`, reg)},
			want:  Credential{IdentityToken: "tok"}, source: ".docker/config.json"},
		{name: "auth.json: the longest repository scope wins",
			files: map[string]string{".config/containers/auth.json": fmt.Sprintf(`{"auths":{%q:{"auth":%q},%q:{"auth":%q},%q:{"auth":%q}}}`,
				reg, b64("host:1"), reg+"/team", b64("team:2"), reg+"/teammate", b64("other:3"))},
			repo: "team/app", want: Credential{Username: "team", Password: "2"}, source: ".config/containers/auth.json"},
		{name: "auth.json first, then docker config",
			files: map[string]string{
				"a/auth.json":         fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg, b64("first:1")),
				".docker/config.json": fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg, b64("second:2"))},
			env:  func(h string) Env { return Env{Home: h, RegistryAuthFile: filepath.Join(h, "a/auth.json")} },
			want: Credential{Username: "first", Password: "1"}, source: "a/auth.json"},
		{name: "a broken file is skipped, its content not quoted",
			files: map[string]string{
				".docker/config.json":         `{"auths": {"` + reg + `": {"auth": "c2VjcmV0` + "\n",
				".config/enroot/.credentials": "machine registry.example.com login e password p\n"},
			want: Credential{Username: "e", Password: "p"}, source: ".config/enroot/.credentials",
			tried: []string{"config.json: not valid JSON"}},
		{name: "credential helper noted, next source read",
			files: map[string]string{
				".docker/config.json":         fmt.Sprintf(`{"credHelpers":{%q:"ecr-login"}}`, reg),
				".config/enroot/.credentials": "machine " + reg + " login e password p\n"},
			want: Credential{Username: "e", Password: "p"}, source: ".config/enroot/.credentials",
			tried: []string{`"credHelpers" names docker-credential-ecr-login`, "credential helpers are not run"}},
		{name: "enroot: multi-line entry, quotes, comments, default ignored",
			files: map[string]string{".config/enroot/.credentials": "# NGC\ndefault login d password d\nmachine other.example.com login o password o\nmachine registry.example.com\n  login $oauthtoken\n  password \"a b\\\"c\"\n"},
			want:  Credential{Username: "$oauthtoken", Password: `a b"c`}, source: ".config/enroot/.credentials"},
		{name: "enroot: auth.docker.io for Docker Hub",
			files:    map[string]string{".config/enroot/.credentials": "machine auth.docker.io login hub password pw\n"},
			registry: "index.docker.io", repo: "library/ubuntu",
			want: Credential{Username: "hub", Password: "pw"}, source: ".config/enroot/.credentials"},
		{name: "enroot: command substitution not run",
			files: map[string]string{".config/enroot/.credentials": "machine registry.example.com login oauth2accesstoken password $(gcloud auth print-access-token)\n"},
			tried: []string{"runs a shell command", "line 1"}},
		{name: "enroot from ENROOT_CONFIG_PATH",
			files: map[string]string{"e/.credentials": "machine registry.example.com login e password p\n"},
			env:   func(h string) Env { return Env{Home: h, EnrootConfigPath: filepath.Join(h, "e")} },
			want:  Credential{Username: "e", Password: "p"}, source: "e/.credentials"},
		{name: "another registry's entries do not match",
			files: map[string]string{".docker/config.json": fmt.Sprintf(`{"auths":{"registry.example.com:5001":{"auth":%q},"registry.example.com.evil":{"auth":%q}}}`, b64("x:1"), b64("y:2"))},
			tried: []string{"no entry for " + reg}},
		{name: "a FIFO is refused, not waited on",
			env: func(h string) Env {
				p := filepath.Join(h, "fifo")
				if err := syscall.Mkfifo(p, 0o600); err != nil {
					panic(err)
				}
				return Env{Home: h, RegistryAuthFile: p}
			},
			tried: []string{"fifo ($REGISTRY_AUTH_FILE): not a regular file"}},
		{name: "nothing anywhere",
			tried: []string{".config/containers/auth.json: no such file", ".docker/config.json: no such file", ".config/enroot/.credentials: no such file"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			for p, body := range tc.files {
				full := filepath.Join(home, p)
				if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(full, []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			env := Env{Home: home}
			if tc.env != nil {
				env = tc.env(home)
			}
			registry, repo := tc.registry, tc.repo
			if registry == "" {
				registry = reg
			}
			if repo == "" {
				repo = "team/app"
			}
			res, err := Lookup(env, registry, repo)
			if err != nil {
				t.Fatal(err)
			}
			if res.Cred != tc.want {
				t.Errorf("credential %+v, want %+v", res.Cred.raw(), tc.want.raw())
			}
			wantSource := ""
			if tc.source != "" {
				wantSource = filepath.Join(home, tc.source)
			}
			if res.Source != wantSource {
				t.Errorf("source %q, want %q", res.Source, wantSource)
			}
			all := strings.Join(res.Tried, "\n")
			for _, s := range tc.tried {
				if !strings.Contains(all, s) {
					t.Errorf("Tried does not say %q:\n%s", s, all)
				}
			}
			if strings.Contains(all, "c2VjcmV0") {
				t.Errorf("Tried quotes a file's content:\n%s", all)
			}
		})
	}
}

// raw shows the fields, for test failures only.
func (c Credential) raw() [4]string {
	return [4]string{c.Username, c.Password, c.IdentityToken, c.RegistryToken}
}

// TestCredentialRedacted: printing or logging a Credential (or a Result
// holding one) never shows its values.
func TestCredentialRedacted(t *testing.T) {
	c := Credential{Username: "user-x", Password: "secret-pw", IdentityToken: "secret-id", RegistryToken: "secret-reg"}
	r := Result{Cred: c, Source: "/h/.docker/config.json"}
	var logs strings.Builder
	slog.New(slog.NewTextHandler(&logs, nil)).Info("x", "cred", c, "res", r)
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "cred", c, "res", r)
	outs := []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s %q", c, c, c, c, c), fmt.Sprintf("%+v %#v", r, r), logs.String()}
	for _, o := range outs {
		for _, s := range []string{"secret-pw", "secret-id", "secret-reg"} {
			if strings.Contains(o, s) {
				t.Errorf("printed credential: %s", o)
			}
		}
	}
}
