package image

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// The test binary doubles as the helper child: with IMAGE_TEST_HELPER=1 it
// runs RunHelper, as `slurm-microvm image helper` does; with
// IMAGE_TEST_PREPARE=REF it runs Prepare in a separate process (for the
// cross-process locking test) and prints the result as JSON.
const (
	envHelper  = "IMAGE_TEST_HELPER"
	envPrepare = "IMAGE_TEST_PREPARE"
)

var (
	// testBin is a copy of the test binary that any user can execute (the
	// go build cache directory is not searchable by others).
	testBin string
	// testUser is an unprivileged user created for the tests when missing.
	testUser *user.User
	testUID  uint32
	testGID  uint32
)

const testUserName = "smv-imgtest"

func TestMain(m *testing.M) {
	if os.Getenv(envHelper) == "1" {
		os.Exit(RunHelper(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	if ref := os.Getenv(envPrepare); ref != "" {
		os.Exit(childPrepare(ref))
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "image-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	testBin = filepath.Join(dir, "image.test")
	if err := copyFile(os.Args[0], testBin, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if os.Geteuid() == 0 {
		created, err := ensureUser(testUserName)
		if err != nil {
			fmt.Fprintln(os.Stderr, "create test user:", err)
			return 1
		}
		if created {
			defer exec.Command("userdel", testUserName).Run()
		}
		testUser, err = user.Lookup(testUserName)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		u, _ := strconv.ParseUint(testUser.Uid, 10, 32)
		g, _ := strconv.ParseUint(testUser.Gid, 10, 32)
		testUID, testGID = uint32(u), uint32(g)
	}
	defer cleanupFixtures()
	return m.Run()
}

// ensureUser creates a system user without a home when it does not exist.
func ensureUser(name string) (bool, error) {
	if _, err := user.Lookup(name); err == nil {
		return false, nil
	}
	out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name).CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("useradd %s: %w: %s", name, err, out)
	}
	return true, nil
}

func childPrepare(ref string) int {
	var o Options
	if err := json.Unmarshal([]byte(os.Getenv("IMAGE_TEST_OPTIONS")), &o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	img, err := Prepare(context.Background(), ref, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	json.NewEncoder(os.Stdout).Encode(img)
	return 0
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// needRoot skips a test that needs root (credentials switching, chown,
// mount namespaces): the launcher runs as root.
func needRoot(t *testing.T) {
	t.Helper()
	prereq.Root(t, "the launcher reads images as the job's user by switching credentials")
}

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			prereq.Missing(t, "needs %s (%v)", tool, err)
		}
	}
}

// opts returns Options for the test user with a fresh cache.
func opts(t *testing.T) Options {
	t.Helper()
	return Options{
		UID: testUID, GID: testGID,
		CacheRoot: filepath.Join(t.TempDir(), "cache"),
		Insecure:  true,
		Logger:    testLogger(t),
		Helper:    []string{testBin},
		HelperEnv: []string{envHelper + "=1"},
	}
}
