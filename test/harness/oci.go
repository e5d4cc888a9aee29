package harness

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/slurm-microvm/slurm-microvm/test/cluster"
)

// OCIBundleDir is where OCIBundle lays out the bundle of the container
// baselines: under the cluster's base directory (0755 all the way), so
// the test user's runtime can read it.
const OCIBundleDir = cluster.BaseDir + "/oci-bundle"

// OCIBundle lays out an OCI bundle of image (a `docker save` archive,
// e.g. Env.Image) at dir for `srun --container=DIR`, as Slurm's
// containers guide makes one: the image's layers unpacked into
// dir/rootfs, and dir/config.json from `runc spec --rootless`. Both are
// made by cluster.TestUser (tar and runc run with its credentials), so
// the tree is that user's and config.json maps the container's root to
// that user's uid, the only mapping a rootless runtime may set up. The
// process gets the image's Env and WorkingDir and no terminal (Slurm sets
// terminal false and the arguments itself). dir is removed first and
// when t ends. It returns dir.
func OCIBundle(t testing.TB, image, dir string) string {
	t.Helper()
	u, err := user.Lookup(cluster.TestUser)
	if err != nil {
		t.Fatalf("oci bundle: %v", err)
	}
	cred, err := userCredential(u)
	if err != nil {
		t.Fatalf("oci bundle: %v", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatalf("oci bundle: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatalf("oci bundle: %v", err)
	}
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{dir, rootfs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatalf("oci bundle: %v", err)
		}
		if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("oci bundle: %v", err)
		}
	}

	img, err := tarball.ImageFromPath(image, nil)
	if err != nil {
		t.Fatalf("oci bundle: read image %s: %v", image, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatalf("oci bundle: config of image %s: %v", image, err)
	}
	layers := mutate.Extract(img)
	defer layers.Close()
	untar := exec.Command("tar", "-x", "-f", "-", "-C", rootfs)
	untar.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	untar.Stdin = layers
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("oci bundle: unpack image %s into %s as %s: %v\n%s", image, rootfs, u.Username, err, out)
	}

	spec := exec.Command("runc", "spec", "--rootless", "--bundle", dir)
	spec.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	spec.Dir = dir
	if out, err := spec.CombinedOutput(); err != nil {
		t.Fatalf("oci bundle: runc spec --rootless as %s: %v\n%s", u.Username, err, out)
	}
	path := filepath.Join(dir, "config.json")
	if err := editSpec(path, func(s *specs.Spec) {
		s.Process.Terminal = false
		s.Process.Args = []string{"true"}
		if len(cfg.Config.Env) > 0 {
			s.Process.Env = cfg.Config.Env
		}
		if cfg.Config.WorkingDir != "" {
			s.Process.Cwd = cfg.Config.WorkingDir
		}
	}); err != nil {
		t.Fatalf("oci bundle: %v", err)
	}
	return dir
}

// editSpec rewrites the OCI runtime config at path through edit, in place
// (the file keeps its owner and mode).
func editSpec(path string, edit func(*specs.Spec)) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	if s.Process == nil {
		return fmt.Errorf("%s has no process", path)
	}
	edit(&s)
	out, err := json.MarshalIndent(&s, "", "\t")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := io.WriteString(f, string(out)+"\n"); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// userCredential is u's uid, gid and supplementary groups.
func userCredential(u *user.User) (*syscall.Credential, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("uid %q of %s: %w", u.Uid, u.Username, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("gid %q of %s: %w", u.Gid, u.Username, err)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("groups of %s: %w", u.Username, err)
	}
	var groups []uint32
	for _, s := range ids {
		g, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("group id %q of %s: %w", s, u.Username, err)
		}
		groups = append(groups, uint32(g))
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}, nil
}
