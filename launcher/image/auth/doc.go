// Package auth finds a job user's registry credentials where users already
// keep them, for image pulls: podman's containers-auth.json(5), Docker's
// config.json, and enroot's .credentials (netrc(5) lines
// `machine HOST login USER password PASS`).
//
//	res, err := auth.Lookup(auth.Env{Home: "/home/u"}, "nvcr.io", "nvidia/pytorch")
//	// res.Cred: the credential; res.Source: the file; res.Tried: what each file held
//
// Sources, in order, first with a credential for the registry wins (see
// Sources): $REGISTRY_AUTH_FILE, else ~/.config/containers/auth.json;
// $DOCKER_CONFIG/config.json, else ~/.docker/config.json;
// $ENROOT_CONFIG_PATH/.credentials, else ~/.config/enroot/.credentials.
// This is podman's order (its auth file, then Docker's), with enroot's file
// last since it names hosts only (no repository scope, no port).
//
// # Design decisions (each with the alternative and why not)
//
// Who reads. Lookup reads with the rights of the process that calls it;
// the image package calls it in the job user's own process only: in-process
// when the caller is that user (`validate`, a user's `image prepare`), else
// in the image helper child, which runs with the user's uid, gid and groups
// and an empty environment. So a symlink ~/.docker/config.json ->
// /root/.docker/config.json (or to another user's file) is opened as the
// user and refused by the kernel, on every path component, with ACLs.
// Alternatives: open as root after an access(2) check (a race: the link is
// swapped between check and open); setfsuid on a locked OS thread (Go may
// run another goroutine's syscalls on it; a bug reads as root); root's own
// keychain (authn.DefaultKeychain: root's credentials lent to any user
// naming a private image).
//
// What the helper returns is the user's: a user may ptrace their helper
// and make it return any credential. That credential only ever goes to the
// registry the same user named, for an image that lands in that user's own
// cache, so nothing is gained.
//
// Environment. REGISTRY_AUTH_FILE, DOCKER_CONFIG and ENROOT_CONFIG_PATH
// are honoured where the caller passes them in Env: the CLI passes its own
// environment when it runs as the user whose image it reads. A job step
// does not: the spec the SPANK plugin writes carries no environment values,
// so a step (and `validate`, so that srun checks what the node will do)
// reads the default locations in the home directory from the passwd
// database. Forwarding the three variables through the spec would be safe
// (the files are still opened as the user) and is the way to add them.
//
// Credential helpers ("credsStore", "credHelpers" in config.json) are not
// run: they are programs (docker-credential-pass, -secretservice, -desktop)
// that need the user's desktop session or keyring, absent in a batch job,
// and running a user-named program from the launcher is a new exec path.
// They are not refused either: Docker Desktop and `docker login` with a
// keyring write "credsStore" for every registry, so refusing would break
// public pulls for every such user. Instead Result.Tried notes the key
// (`"credsStore" names docker-credential-pass, but credential helpers are
// not run here`), the next source is read, and a pull the registry then
// refuses shows that note. `podman login --authfile ~/.docker/config.json`
// or `docker login` without a helper writes a usable entry.
//
// Parsers of its own, not docker/cli's configfile or go-containerregistry's
// keychain: those read only Docker's format (containers-auth.json and
// enroot's netrc lines are not theirs), resolve credential helpers by
// running them, and read the process's own environment and home (root's,
// in the supervisor). The three formats here are small JSON and line
// parsers behind one Lookup.
//
// Broken files. A missing, unreadable, oversized (1 MiB), non-regular or
// malformed file is noted and skipped, never an error: a pull of a public
// image must not fail for a stale credentials file. The notes name the
// file and the problem, never its content (a JSON syntax error is reported
// by offset, not by the text around it).
//
// Secrets. Credential's String, GoString and Format print "[redacted]", so
// a credential logged or wrapped by mistake shows no value; Result.Tried
// and Source hold paths and host names only. Nothing here writes a file.
//
// Matching. containers-auth.json(5) keys are host[:port][/namespace[/repo]],
// the longest prefix of host/repo wins; a key with a scheme (Docker's
// "https://index.docker.io/v1/") is host only. Docker Hub's names
// (docker.io, index.docker.io, registry-1.docker.io) are one registry. An
// enroot machine matches the registry's host with or without the port (curl
// matches netrc entries by host name), and auth.docker.io matches Docker
// Hub as enroot's docs write it. enroot runs its file through a shell;
// here values are literal ("$oauthtoken" is NGC's user name) and an entry
// with a command substitution ("$(", backquote) is skipped with a note;
// netrc "default" entries are not used (one password for every registry a
// job names).
package auth
