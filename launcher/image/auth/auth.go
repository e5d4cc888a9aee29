package auth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Env says where a user's credentials are looked for: the user's home
// directory and the environment variables podman, Docker and enroot honour.
// Empty fields take their defaults (see Sources).
type Env struct {
	// Home is the user's home directory; "" looks it up in the passwd
	// database by the reading process's uid.
	Home string `json:"home,omitempty"`
	// RegistryAuthFile is REGISTRY_AUTH_FILE (a containers-auth.json(5) file).
	RegistryAuthFile string `json:"registry_auth_file,omitempty"`
	// DockerConfig is DOCKER_CONFIG (a directory holding config.json).
	DockerConfig string `json:"docker_config,omitempty"`
	// EnrootConfigPath is ENROOT_CONFIG_PATH (a directory holding .credentials).
	EnrootConfigPath string `json:"enroot_config_path,omitempty"`
}

// EnvFrom reads the variables of Env from getenv (os.Getenv for the
// calling user's own environment); HOME gives Home.
func EnvFrom(getenv func(string) string) Env {
	return Env{
		Home:             getenv("HOME"),
		RegistryAuthFile: getenv("REGISTRY_AUTH_FILE"),
		DockerConfig:     getenv("DOCKER_CONFIG"),
		EnrootConfigPath: getenv("ENROOT_CONFIG_PATH"),
	}
}

// Credential is what a registry is sent: a user name and password (HTTP
// basic, or exchanged for a token), or an identity token (an OAuth2 refresh
// token), or a registry token (a bearer token used as is). Its String,
// GoString and LogValue never show the values.
type Credential struct {
	Username      string `json:"username,omitempty"`
	Password      string `json:"password,omitempty"`
	IdentityToken string `json:"identity_token,omitempty"`
	RegistryToken string `json:"registry_token,omitempty"`
}

// Empty reports whether c holds nothing to send.
func (c Credential) Empty() bool {
	return c.Username == "" && c.Password == "" && c.IdentityToken == "" && c.RegistryToken == ""
}

func (c Credential) String() string   { return "[credential redacted]" }
func (c Credential) GoString() string { return "auth.Credential{[redacted]}" }

// Format keeps %v, %+v, %#v and %s from printing the fields.
func (c Credential) Format(f fmt.State, _ rune) { fmt.Fprint(f, c.String()) }

// LogValue keeps every slog handler (JSON ones marshal structs) from
// printing the fields: only the kind is logged.
func (c Credential) LogValue() slog.Value { return slog.StringValue(c.Kind()) }

// Kind names the kind of credential (for logs): "password", "identity
// token", "registry token" or "none".
func (c Credential) Kind() string {
	switch {
	case c.RegistryToken != "":
		return "registry token"
	case c.IdentityToken != "":
		return "identity token"
	case !c.Empty():
		return "password"
	}
	return "none"
}

// Result is the outcome of Lookup.
type Result struct {
	// Cred is the credential found; Empty when none was.
	Cred Credential `json:"cred"`
	// Source is the file Cred came from ("" when none was found).
	Source string `json:"source,omitempty"`
	// Tried lists every source read, in order, with what it held for the
	// registry ("/home/u/.docker/config.json: no such file"), for the
	// error a refused pull shows. Never a credential value.
	Tried []string `json:"tried"`
}

// LogValue logs the source and what was tried, never the credential (the
// JSON form, which the image helper sends its parent, holds it).
func (r Result) LogValue() slog.Value {
	return slog.GroupValue(slog.String("kind", r.Cred.Kind()), slog.String("source", r.Source), slog.String("tried", strings.Join(r.Tried, "; ")))
}

// Found reports whether a credential was found.
func (r Result) Found() bool { return !r.Cred.Empty() }

// source kinds
const (
	kindAuthJSON = "containers-auth.json"
	kindDocker   = "docker config.json"
	kindEnroot   = "enroot .credentials"
)

type source struct {
	path string
	kind string
	why  string // where the path came from, e.g. "$REGISTRY_AUTH_FILE"
}

// Sources returns the files Lookup reads, in order (podman's and enroot's
// rules):
//
//  1. $REGISTRY_AUTH_FILE; when unset, ~/.config/containers/auth.json
//     (podman's persistent file; its $XDG_RUNTIME_DIR one lives only as
//     long as a login session and is not on a compute node)
//  2. $DOCKER_CONFIG/config.json; when unset, ~/.docker/config.json
//  3. $ENROOT_CONFIG_PATH/.credentials; when unset,
//     ~/.config/enroot/.credentials
//
// A relative path in a variable is taken relative to the reader's working
// directory, "/" for the image helper: give absolute paths.
func Sources(env Env) ([]string, error) {
	ss, err := sources(env)
	var out []string
	for _, s := range ss {
		out = append(out, s.path)
	}
	return out, err
}

func sources(env Env) ([]source, error) {
	home := env.Home
	var herr error
	if home == "" {
		u, err := user.LookupId(strconv.Itoa(os.Getuid()))
		if err != nil {
			herr = fmt.Errorf("look up the home directory of uid %d: %w", os.Getuid(), err)
		} else {
			home = u.HomeDir
		}
	}
	inHome := func(p string) string {
		if home == "" {
			return ""
		}
		return filepath.Join(home, p)
	}
	var ss []source
	if env.RegistryAuthFile != "" {
		ss = append(ss, source{env.RegistryAuthFile, kindAuthJSON, "$REGISTRY_AUTH_FILE"})
	} else if p := inHome(".config/containers/auth.json"); p != "" {
		ss = append(ss, source{p, kindAuthJSON, ""})
	}
	if env.DockerConfig != "" {
		ss = append(ss, source{filepath.Join(env.DockerConfig, "config.json"), kindDocker, "$DOCKER_CONFIG"})
	} else if p := inHome(".docker/config.json"); p != "" {
		ss = append(ss, source{p, kindDocker, ""})
	}
	if env.EnrootConfigPath != "" {
		ss = append(ss, source{filepath.Join(env.EnrootConfigPath, ".credentials"), kindEnroot, "$ENROOT_CONFIG_PATH"})
	} else if p := inHome(".config/enroot/.credentials"); p != "" {
		ss = append(ss, source{p, kindEnroot, ""})
	}
	return ss, herr
}

// maxFile bounds what is read of one credentials file.
const maxFile = 1 << 20

// Lookup finds the credential for repository repo ("ns/name") of registry
// ("host[:port]", as go-containerregistry's RegistryStr gives it, Docker Hub
// as index.docker.io) in the sources of env, read with the calling
// process's own rights (the caller is the job's user). The first source
// holding a credential for the registry wins. A missing, unreadable or
// malformed file is not an error: it is noted in Result.Tried and the next
// source is read, so that a broken file never stops a pull that needs no
// credentials. The only error is a home directory that cannot be looked up,
// returned with the Result of the sources that did not need it.
func Lookup(env Env, registry, repo string) (Result, error) {
	ss, err := sources(env)
	var r Result
	if err != nil {
		r.Tried = append(r.Tried, err.Error())
	}
	for _, s := range ss {
		name := s.path
		if s.why != "" {
			name = s.path + " (" + s.why + ")"
		}
		b, rerr := readFile(s.path)
		if rerr != nil {
			r.Tried = append(r.Tried, name+": "+rerr.Error())
			continue
		}
		var c Credential
		var note string
		switch s.kind {
		case kindEnroot:
			c, note = fromEnroot(b, registry)
		default:
			c, note = fromJSON(b, s.kind, registry, repo)
		}
		if !c.Empty() {
			r.Cred, r.Source = c, s.path
			r.Tried = append(r.Tried, name+": credentials for "+registry)
			return r, err
		}
		r.Tried = append(r.Tried, name+": "+note)
	}
	return r, err
}

// readFile reads at most maxFile bytes of a regular file (a FIFO or a
// device would block or never end: opened non-blocking, then refused);
// errors say what, never the content.
func readFile(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, describe(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, describe(err)
	}
	if !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if fi.Size() > maxFile {
		return nil, fmt.Errorf("larger than %d bytes, not read", maxFile)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFile))
	if err != nil {
		return nil, describe(err)
	}
	return b, nil
}

func describe(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errors.New("no such file")
	case errors.Is(err, fs.ErrPermission):
		return errors.New("permission denied (read as the job's user)")
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// dockerHub holds the names of Docker Hub's registry, which config files
// spell in several ways; index.docker.io is go-containerregistry's.
var dockerHub = map[string]bool{
	"docker.io": true, "index.docker.io": true, "registry-1.docker.io": true,
	"registry.hub.docker.com": true,
}

func sameHost(a, b string) bool {
	a, b = strings.ToLower(a), strings.ToLower(b)
	return a == b || dockerHub[a] && dockerHub[b]
}

// configFile is the part of containers-auth.json(5) and Docker's
// config.json read here.
type configFile struct {
	Auths       map[string]configAuth `json:"auths"`
	CredsStore  string                `json:"credsStore"`
	CredHelpers map[string]string     `json:"credHelpers"`
}

type configAuth struct {
	Auth          string `json:"auth"`
	Username      string `json:"username"`
	Password      string `json:"password"`
	IdentityToken string `json:"identitytoken"`
	RegistryToken string `json:"registrytoken"`
}

// fromJSON finds registry/repo in a containers-auth.json or Docker
// config.json. A key is "host[:port]", "host[:port]/namespace[/repo]"
// (the longest that prefixes registry/repo wins, as in
// containers-auth.json(5)), or Docker's legacy URL form
// "https://host/v1/" (scheme and path dropped). Credential helpers
// ("credsStore", "credHelpers") are not run: noted, and the next source is
// read.
func fromJSON(b []byte, kind, registry, repo string) (Credential, string) {
	var cf configFile
	if err := json.Unmarshal(b, &cf); err != nil {
		// The JSON error may quote the content: say where, not what.
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return Credential{}, fmt.Sprintf("not valid JSON (%s at byte %d), not used", kind, se.Offset)
		}
		return Credential{}, "not a " + kind + " file (unexpected JSON types), not used"
	}
	full := registry + "/" + repo
	best, bestLen := "", -1
	for k := range cf.Auths {
		key := k
		legacy := false
		if i := strings.Index(key, "://"); i >= 0 {
			key, legacy = key[i+3:], true
		}
		host, path, _ := strings.Cut(strings.TrimRight(key, "/"), "/")
		if legacy {
			path = ""
		}
		if !sameHost(host, registry) {
			continue
		}
		if path != "" && full != registry+"/"+path && !strings.HasPrefix(full, registry+"/"+path+"/") {
			continue
		}
		if len(path) > bestLen {
			best, bestLen = k, len(path)
		}
	}
	helper := ""
	for h, name := range cf.CredHelpers {
		if sameHost(h, registry) {
			helper = fmt.Sprintf("%q names docker-credential-%s for %s", "credHelpers", name, h)
		}
	}
	if helper == "" && cf.CredsStore != "" {
		helper = fmt.Sprintf("%q names docker-credential-%s", "credsStore", cf.CredsStore)
	}
	helperNote := ""
	if helper != "" {
		helperNote = "; " + helper + ", but credential helpers are not run here"
	}
	if best == "" {
		return Credential{}, "no entry for " + registry + helperNote
	}
	a := cf.Auths[best]
	c := Credential{Username: a.Username, Password: a.Password, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
	if a.Auth != "" {
		dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(a.Auth))
		if err != nil {
			return Credential{}, fmt.Sprintf("entry %q: \"auth\" is not base64, not used", best)
		}
		u, p, ok := strings.Cut(string(dec), ":")
		if !ok {
			return Credential{}, fmt.Sprintf("entry %q: \"auth\" is not base64 of user:password, not used", best)
		}
		c.Username, c.Password = u, p
	}
	if c.Empty() {
		return Credential{}, fmt.Sprintf("entry %q holds no credential%s", best, helperNote)
	}
	return c, ""
}

// fromEnroot finds registry in an enroot .credentials file: netrc(5)
// tokens "machine HOST login USER password PASS" (on one line or several;
// "#" starts a comment line; double-quoted values as curl reads them). HOST
// matches the registry's host with or without its port; Docker Hub's
// entries may name auth.docker.io (its token server, as enroot's docs
// write them). Values are taken literally ("$oauthtoken" is NGC's user
// name): enroot hands the file to curl through a shell, so an entry whose
// value holds "$(" or a backquote (a command substitution) cannot mean the
// same here and is skipped with a note. "default" entries are not used: they
// would send one password to every registry a job names.
func fromEnroot(b []byte, registry string) (Credential, string) {
	host := registry
	if h, _, ok := strings.Cut(registry, ":"); ok && !strings.HasPrefix(registry, "[") {
		host = h
	}
	match := func(m string) bool {
		m = strings.ToLower(m)
		if sameHost(m, registry) || sameHost(m, host) {
			return true
		}
		return m == "auth.docker.io" && dockerHub[strings.ToLower(host)]
	}
	toks := netrcTokens(string(b))
	type entry struct {
		machine, login, password string
		line                     int
	}
	var entries []entry
	var cur *entry
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		val := func() string {
			if i+1 < len(toks) {
				i++
				return toks[i].s
			}
			return ""
		}
		switch t.s {
		case "machine":
			entries = append(entries, entry{machine: val(), line: t.line})
			cur = &entries[len(entries)-1]
		case "default":
			cur = nil
		case "login":
			v := val()
			if cur != nil {
				cur.login = v
			}
		case "password":
			v := val()
			if cur != nil {
				cur.password = v
			}
		case "account":
			val()
		}
	}
	note := "no machine entry for " + host
	for _, e := range entries {
		if !match(e.machine) {
			continue
		}
		if strings.Contains(e.login+e.password, "$(") || strings.ContainsRune(e.login+e.password, '`') {
			note = fmt.Sprintf("the entry for %s on line %d runs a shell command (enroot's shell expansion), which is not done here; not used", e.machine, e.line)
			continue
		}
		if e.login == "" && e.password == "" {
			note = fmt.Sprintf("the entry for %s on line %d has no login or password", e.machine, e.line)
			continue
		}
		return Credential{Username: e.login, Password: e.password}, ""
	}
	return Credential{}, note
}

type token struct {
	s    string
	line int
}

// netrcTokens splits netrc text into whitespace-separated tokens; a line
// whose first non-blank character is "#" is a comment; a token may be
// double-quoted with backslash escapes.
func netrcTokens(s string) []token {
	var out []token
	for ln, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		i := 0
		for i < len(line) {
			for i < len(line) && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r') {
				i++
			}
			if i >= len(line) {
				break
			}
			var sb strings.Builder
			if line[i] == '"' {
				i++
				for i < len(line) && line[i] != '"' {
					if line[i] == '\\' && i+1 < len(line) {
						i++
					}
					sb.WriteByte(line[i])
					i++
				}
				i++
			} else {
				for i < len(line) && line[i] != ' ' && line[i] != '\t' && line[i] != '\r' {
					sb.WriteByte(line[i])
					i++
				}
			}
			out = append(out, token{sb.String(), ln + 1})
		}
	}
	return out
}
