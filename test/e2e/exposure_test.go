package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/test/cluster"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
	"github.com/slurm-microvm/slurm-microvm/test/harness"
)

// The test binary doubles as the other user's probe (runExposureProbe)
// when envExposureProbe names the in-image path of the secret.
const envExposureProbe = "SMV_E2E_EXPOSURE_PROBE"

func init() {
	if secret := os.Getenv(envExposureProbe); secret != "" {
		os.Exit(runExposureProbe(secret))
	}
}

// runExposureProbe runs as a local user who does not own the image: it
// watches the temporary directory (where the check once mounted image
// disks) and, for every entry that appears there, tries for 3 s to read
// the secret through it (a mount point, or an extraction's root/). It
// prints READY once watching and "READ path: contents" for each success,
// until killed.
func runExposureProbe(secret string) int {
	dir := os.TempDir()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		fmt.Println("inotify:", err)
		return 1
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_ONLYDIR); err != nil {
		fmt.Println("watch", dir+":", err)
		return 1
	}
	var mu sync.Mutex
	say := func(s string) { mu.Lock(); fmt.Println(s); mu.Unlock() }
	try := func(name string) {
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			for _, p := range []string{filepath.Join(dir, name, secret), filepath.Join(dir, name, "root", secret)} {
				if b, err := os.ReadFile(p); err == nil {
					say("READ " + p + ": " + strings.TrimSpace(string(b)))
					return
				}
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	say("READY")
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil {
			say("read inotify: " + err.Error())
			return 1
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			name := strings.TrimRight(string(nameBytes), "\x00")
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if name != "" {
				go try(name)
			}
		}
	}
}

// hostWatch records, until stop, every mount the host's mount table
// gains of an image disk (an erofs mount, or a loop device backed by a
// file of the e2e image cache) and every loop device backed by such a
// file. The mount table is polled for changes (POLLPRI on mountinfo), the
// loop devices every 20 ms.
func hostWatch(stop <-chan struct{}) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	seen := map[string]bool{}
	var found []string
	note := func(s string) {
		if !seen[s] {
			seen[s] = true
			found = append(found, s)
		}
	}
	backing := func() map[string]string {
		out := map[string]string{}
		bfs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, bf := range bfs {
			b, err := os.ReadFile(bf)
			if p := strings.TrimSpace(string(b)); err == nil && strings.HasPrefix(p, harness.CacheDir) {
				out["/dev/"+filepath.Base(filepath.Dir(filepath.Dir(bf)))] = p
			}
		}
		return out
	}
	scan := func() {
		loops := backing()
		for dev, p := range loops {
			note("loop device " + dev + " backed by " + p)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER
			fields := strings.Fields(sc.Text())
			dash := -1
			for i, x := range fields {
				if x == "-" {
					dash = i
					break
				}
			}
			if dash < 0 || dash+2 >= len(fields) || len(fields) < 5 {
				continue
			}
			fstype, source, mnt := fields[dash+1], fields[dash+2], fields[4]
			if _, ok := loops[source]; ok || (fstype == "erofs" && strings.HasPrefix(mnt, os.TempDir()+"/")) {
				note(fstype + " mount of " + source + " on " + mnt)
			}
		}
	}
	scan()
	for {
		select {
		case <-stop:
			scan()
			return found, nil
		default:
		}
		// Wakes on a change of the mount table, else after 20 ms for
		// the loop devices.
		pfd := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLPRI}}
		if _, err := unix.Poll(pfd, 20); err != nil && err != unix.EINTR {
			return found, err
		}
		scan()
	}
}

// TestImageExposure: a user's private image (an archive only they can
// read, holding a file only the image's users should see) runs as a step
// on the real Slurm with the default --microvm-mpi=auto, whose check reads
// the image's disk as root. Meanwhile another local user (nobody) tries to
// read that file through anything appearing in the temporary directory,
// and the host's mount table and loop devices are watched: no mount of an
// image disk, no loop device backed by one, nothing read.
func TestImageExposure(t *testing.T) {
	e := harness.Setup(t)
	const secret = "secret/data"
	const contents = "only-the-owner-reads-this"
	owner, other := cluster.TestUser, "nobody"

	// The owner's private image.
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	fixture.BusyboxRootfs(t, rootfs, e.ImageName)
	if err := os.MkdirAll(filepath.Join(rootfs, filepath.Dir(secret)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, secret), []byte(contents+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(harness.Root, "images", "private-exposure.tar")
	fixture.OCIArchive(t, rootfs, img, "microvm-e2e/private:1", v1.Config{
		Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, WorkingDir: "/",
	})
	t.Cleanup(func() { os.Remove(img) })
	if err := os.Chown(img, e.TestUID, -1); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(img, 0o600); err != nil {
		t.Fatal(err)
	}

	// The other user's probe: the test binary, copied where nobody can
	// run it (the build directory is 0700).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	probeBin := filepath.Join(harness.Root, "bin", "exposure-probe")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(probeBin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(probeBin) })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	probe, err := e.C.Command(ctx, other, probeBin, "-test.run=^$")
	if err != nil {
		t.Fatal(err)
	}
	probe.Dir = "/"
	probe.Env = append(probe.Env, envExposureProbe+"="+secret)
	probeOut, err := probe.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	probe.Stderr = os.Stderr
	if err := probe.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(probeOut)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	if l := <-lines; l != "READY" {
		_ = probe.Process.Kill()
		t.Fatalf("probe as %s: %q, want READY", other, l)
	}
	stop := make(chan struct{})
	type watch struct {
		found []string
		err   error
	}
	watched := make(chan watch, 1)
	go func() { f, err := hostWatch(stop); watched <- watch{f, err} }()

	out, errOut, code := e.Srun(t, owner, "--microvm="+img, "sh", "-c", "echo JOB=$SLURM_JOB_ID; cat /"+secret)
	close(stop)
	w := <-watched
	time.Sleep(200 * time.Millisecond) // a read in flight reports
	_ = probe.Process.Kill()
	_ = probe.Wait()
	var reads []string
	for l := range lines {
		reads = append(reads, l)
	}

	if code != 0 || !strings.Contains(out, contents) {
		t.Fatalf("the owner's step: exit %d, stdout %q, stderr %q: want the image's file", code, out, errOut)
	}
	if w.err != nil {
		t.Errorf("watch the host: %v", w.err)
	}
	if len(w.found) > 0 {
		t.Errorf("while the step started, the host showed the image:\n  %s", strings.Join(w.found, "\n  "))
	}
	if len(reads) > 0 {
		t.Errorf("user %s, not the image's owner, got:\n  %s", other, strings.Join(reads, "\n  "))
	}
	e.WaitClean(t, jobOf(t, out))
}
