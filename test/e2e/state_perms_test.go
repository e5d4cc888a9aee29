package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/state"
	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// connectEnv makes this test binary, re-executed as another user, only
// try to connect to the unix socket it names (there is no socket client
// every node has).
const connectEnv = "SMV_E2E_CONNECT"

func init() {
	if p := os.Getenv(connectEnv); p != "" {
		c, err := net.Dial("unix", p)
		if err != nil {
			fmt.Println("NOT CONNECTED:", err)
			os.Exit(3)
		}
		c.Close()
		fmt.Println("CONNECTED")
		os.Exit(0)
	}
}

// asUser runs argv as u, with u's primary and supplementary groups.
func asUser(t *testing.T, u *user.User, env []string, argv ...string) (string, error) {
	t.Helper()
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	ids, err := u.GroupIds()
	if err != nil {
		t.Fatal(err)
	}
	var groups []uint32
	for _, s := range ids {
		g, _ := strconv.ParseUint(s, 10, 32)
		groups = append(groups, uint32(g))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: groups}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// While user A's step runs, user B — even a member of A's primary group —
// can read no file of A's state directory (logs, spec, console, records),
// cannot list it, cannot connect to its control socket, and cannot read
// A's scratch or the supervisor log kept for the admin; A itself can read
// what its tasks need and connect. After the step the kept log remains,
// root's.
func TestStatePermissions(t *testing.T) {
	e := harness.Setup(t)
	a, err := user.Lookup(cluster.TestUser)
	if err != nil {
		t.Fatal(err)
	}
	b := ensureUser(t, secondUser)
	// B shares A's primary group, as users of one project often do.
	grp, err := user.LookupGroupId(a.Gid)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("usermod", "-a", "-G", grp.Name, b.Username).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("gpasswd", "-d", b.Username, grp.Name).Run() })
	if b, err = user.Lookup(secondUser); err != nil {
		t.Fatal(err)
	}

	// The connect probe, where both users can execute it.
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	probe := filepath.Join(harness.Root, "bin", "e2e-connect-probe")
	if err := os.WriteFile(probe, self, 0o755); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd, err := e.C.Command(ctx, a.Username, "srun", "--microvm="+e.Image, "sh", "-c", "echo JOB=$SLURM_JOB_ID; echo READY; sleep 300")
	if err != nil {
		t.Fatal(err)
	}
	s, job := startUntilReady(t, ctx, cmd, nil)
	ended := false
	end := func() {
		if ended {
			return
		}
		ended = true
		_ = e.C.Scancel(context.Background(), strconv.Itoa(job))
		s.wait(t, ctx)
		e.WaitClean(t, job)
	}
	defer end()

	id := state.StepID{Job: uint32(job), Node: e.C.Node}.String()
	stateDir := filepath.Join(harness.RuntimeDir, id)
	ents, err := os.ReadDir(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	var files, sockets []string
	for _, en := range ents {
		p := filepath.Join(stateDir, en.Name())
		switch {
		case en.Type()&os.ModeSocket != 0:
			sockets = append(sockets, p)
		case en.Type().IsRegular():
			files = append(files, p)
		}
	}
	kept := filepath.Join(harness.LogDir, id+".log")
	scratch := filepath.Join(harness.ScratchDir, id)
	for _, want := range []string{"spec.json", "launcher.log", "vmm.log", "console.log", "supervisor", "ready"} {
		found := false
		for _, f := range files {
			found = found || filepath.Base(f) == want
		}
		if !found {
			t.Errorf("state of the running step lacks %s (has %v)", want, ents)
		}
	}
	if len(sockets) == 0 {
		t.Fatalf("no control socket in %s: %v", stateDir, ents)
	}
	t.Logf("state files %v, sockets %v", files, sockets)

	// A reads what its tasks need and connects.
	for _, f := range []string{filepath.Join(stateDir, "spec.json"), filepath.Join(stateDir, "console.log")} {
		if out, err := asUser(t, a, nil, "cat", f); err != nil {
			t.Errorf("job user A cannot read %s: %v %s", f, err, out)
		}
	}
	if out, err := asUser(t, a, []string{connectEnv + "=" + sockets[0]}, probe); err != nil || !strings.Contains(out, "CONNECTED") {
		t.Errorf("job user A cannot connect to %s: %v %s", sockets[0], err, out)
	}

	// B reaches nothing.
	for _, f := range append(append([]string{}, files...), kept) {
		if out, err := asUser(t, b, nil, "cat", f); err == nil {
			t.Errorf("user B read %s of A's step: %q", f, out)
		}
		if out, err := asUser(t, b, nil, "stat", f); err == nil {
			t.Errorf("user B can stat %s of A's step: %q", f, out)
		}
	}
	for _, d := range []string{stateDir, scratch, filepath.Dir(kept)} {
		if out, err := asUser(t, b, nil, "ls", "-a", d); err == nil {
			t.Errorf("user B listed %s: %q", d, out)
		}
	}
	for _, sock := range sockets {
		if out, err := asUser(t, b, []string{connectEnv + "=" + sock}, probe); err == nil {
			t.Errorf("user B connected to A's control socket %s: %q", sock, out)
		}
	}

	// The step ends; its state goes, the admin's log stays, root's.
	end()
	fi, err := os.Stat(kept)
	if err != nil {
		t.Fatalf("supervisor log not kept after the step: %v", err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 0 || fi.Mode().Perm() != 0o600 || fi.Size() == 0 {
		t.Errorf("kept log %s: uid %d mode %v size %d, want root's 0600 with the log", kept, st.Uid, fi.Mode().Perm(), fi.Size())
	}
}
