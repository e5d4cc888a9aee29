package e2e

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// TestSrunContainer proves the cluster's Options.OCIRuntime gives a
// working `srun --container=BUNDLE` (Slurm's own OCI containers, the
// bench's container baselines) with runc and with crun, switched by
// rewriting oci.conf between two steps (SetOCIRuntime, no slurmd restart):
// the command runs in the bundle's root filesystem (its os-release), in a
// user namespace whose root is the test user (uid_map "0 UID 1"), under
// the runtime oci.conf names, run by the test user. Without oci.conf
// Slurm ignores --container and runs the command on the host, which
// every one of these checks would catch.
func TestSrunContainer(t *testing.T) {
	c := cluster.Up(t, cluster.Options{OCIRuntime: "runc"})
	u, err := user.Lookup(cluster.TestUser)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	const osName = "Microvm OCI Busybox"
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	fixture.BusyboxRootfs(t, rootfs, osName)
	image := filepath.Join(t.TempDir(), "busybox.tar")
	fixture.OCIArchive(t, rootfs, image, "microvm-e2e/oci:1", v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, WorkingDir: "/"})
	bundle := harness.OCIBundle(t, image, harness.OCIBundleDir)

	for _, rt := range []string{"runc", "crun"} {
		t.Run(rt, func(t *testing.T) {
			if err := c.SetOCIRuntime(rt); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// The runtime process as the host sees it while the step
			// runs (the container sleeps for the look).
			watch, stopWatch := context.WithCancel(ctx)
			defer stopWatch()
			seen := make(chan map[string]bool, 1)
			go func() { seen <- watchRuntimes(watch, uid) }()
			stdout, stderr, code, err := c.Srun(ctx, cluster.TestUser, "--container="+bundle,
				"sh", "-c", `. /etc/os-release && echo "name=$NAME" && echo "uid_map=$(cat /proc/self/uid_map)" && sleep 1`)
			stopWatch()
			if err != nil || code != 0 {
				t.Fatalf("srun --container: exit %d, %v\nstdout: %s\nstderr: %s\nslurmd.log:\n%s", code, err, stdout, stderr, c.LogTail("slurmd.log", 30))
			}
			if !strings.Contains(stdout, "name="+osName+"\n") {
				t.Errorf("srun --container ran outside the bundle's root filesystem: want name=%s, got:\n%s", osName, stdout)
			}
			_, uidMap, _ := strings.Cut(stdout, "uid_map=")
			if want := fmt.Sprintf("0 %d 1", uid); strings.Join(strings.Fields(uidMap), " ") != want {
				t.Errorf("srun --container: want a user namespace mapping root to the test user (%s), got:\n%s", want, stdout)
			}
			got := <-seen
			if !got[rt] {
				t.Errorf("no %s process of uid %d seen during the step (saw %v): oci.conf's runtime was not used", rt, uid, got)
			}
			for other := range got {
				if other != rt {
					t.Errorf("a %s process ran the step although oci.conf names %s: oci.conf was not re-read for the step", other, rt)
				}
			}
		})
	}
}

// watchRuntimes polls /proc every 20 ms until ctx ends and returns the
// OCI runtimes (runc, crun) seen running as uid with the state root the
// cluster's oci.conf gives them (--root=/run/user/UID/).
func watchRuntimes(ctx context.Context, uid int) map[string]bool {
	seen := map[string]bool{}
	root := fmt.Sprintf("--root=/run/user/%d/", uid)
	for ctx.Err() == nil {
		procs, _ := filepath.Glob("/proc/[0-9]*")
		for _, p := range procs {
			b, err := os.ReadFile(filepath.Join(p, "cmdline"))
			if err != nil {
				continue
			}
			args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
			name := filepath.Base(args[0])
			if (name != "runc" && name != "crun") || !strings.Contains(string(b), root) {
				continue
			}
			fi, err := os.Stat(p)
			if err != nil {
				continue
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == uid {
				seen[name] = true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return seen
}
