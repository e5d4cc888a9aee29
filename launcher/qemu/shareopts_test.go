package qemu_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/fs/guestpath"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/test/fixture"
)

// TestShareMountOptions boots a guest with a read-only and a writable share
// through the product path (fs.NineP args, the agent's mount with
// guestpath's per-kind options) and checks what the tuned options must not
// break: a file larger than several 9p messages (msize) and not a multiple
// of them reads back exactly; a directory of 3,000 long names lists
// completely; the guest mounted each kind with its options; the read-only
// share refuses writes and its host file is unchanged; on the writable
// share the guest's write reads back exactly on the host, so does a write
// through a shared writable mapping (refused with EINVAL under cache=none),
// and a host write after the guest's first read is what the guest reads
// next.
func TestShareMountOptions(t *testing.T) {
	fixture.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := newVMEnv(t, ctx, "Share Options OS", func(rootfs string) {
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(rootfs, "bin", "mmapwrite"), "./testdata/mmapwrite")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build mmapwrite: %v\n%s", err, out)
		}
	})

	roDir, rwDir := filepath.Join(e.tmp, "ro"), filepath.Join(e.tmp, "rw")
	big := make([]byte, 5<<20+12345)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	const wide = 3000
	var names []string
	for i := 0; i < wide; i++ {
		names = append(names, fmt.Sprintf("entry-%05d-with-a-long-name-so-that-one-readdir-reply-holds-few", i))
	}
	sort.Strings(names)
	for _, d := range []string{roDir, rwDir, filepath.Join(roDir, "wide")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, jobUID, jobGID); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(roDir, "wide", n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for p, b := range map[string][]byte{
		filepath.Join(roDir, "big"):    big,
		filepath.Join(roDir, "marker"): []byte("host\n"),
		filepath.Join(rwDir, "coh"):    []byte("one\n"),
	} {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, jobUID, jobGID); err != nil {
			t.Fatal(err)
		}
	}
	var shares []driver.Share
	for _, s := range []struct {
		dir, dst string
		ro       bool
	}{{roDir, "/data", true}, {rwDir, "/scratch", false}} {
		f, err := os.Open(s.dir)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		shares = append(shares, driver.Share{Dir: f, Destination: s.dst, ReadOnly: s.ro})
	}
	stateDir := e.stateDir(t, "state")
	cfg := jobConfig("shareopts", stateDir, e.disk)
	cfg.Shares = shares
	sb, err := e.driver(true).Start(ctx, cfg)
	if err != nil {
		con, _ := os.ReadFile(filepath.Join(stateDir, "console.log"))
		t.Fatalf("start: %v\n%s", err, con)
	}
	defer sb.Stop(context.Background())
	run := serve(t, ctx, sb, stateDir)
	sh := func(script string) string {
		t.Helper()
		out, st, err := run("sh", "-c", script)
		if err != nil || st.Code != 0 {
			t.Fatalf("guest %q: %v, status %v, output %q", script, err, st, out)
		}
		return out
	}
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

	// Each kind is mounted with its options (what the kernel kept of them).
	mounts := sh("cat /proc/mounts")
	for dst, want := range map[string]string{"/data": guestpath.NinePOptionsReadOnly, "/scratch": guestpath.NinePOptions} {
		var got string
		for _, l := range strings.Split(mounts, "\n") {
			if f := strings.Fields(l); len(f) >= 4 && f[1] == dst && f[2] == "9p" {
				got = f[3]
			}
		}
		if got == "" {
			t.Fatalf("no 9p mount on %s in the guest:\n%s", dst, mounts)
		}
		for _, o := range strings.Split(want, ",") {
			if o == "cache=none" || strings.HasPrefix(o, "version=") {
				continue // the kernel's default, not shown
			}
			o = strings.TrimPrefix(o, "cache=") // shown as "loose", "mmap"
			if !strings.Contains(","+got+",", ","+o+",") {
				t.Errorf("guest mounted %s with %q, want %s from %q", dst, got, o, want)
			}
		}
	}

	if got, want := strings.TrimSpace(sh("sha256sum /data/big | cut -d' ' -f1")), sum(big); got != want {
		t.Errorf("guest read %d bytes of /data/big with SHA-256 %s, want %s", len(big), got, want)
	}
	if got, want := sh("ls /data/wide | sha256sum | cut -d' ' -f1; ls /data/wide | wc -l"), fmt.Sprintf("%s\n%d\n", sum([]byte(strings.Join(names, "\n")+"\n")), wide); got != want {
		t.Errorf("guest listing of /data/wide (SHA-256 of the names, count): %q, want %q", got, want)
	}

	// Read-only: refused, and the host file unchanged.
	out := sh("echo guest > /data/marker 2>&1 && echo WROTE; touch /data/new 2>&1 && echo CREATED; true")
	if strings.Contains(out, "WROTE") || strings.Contains(out, "CREATED") {
		t.Errorf("guest wrote to the read-only share: %q", out)
	}
	if b, _ := os.ReadFile(filepath.Join(roDir, "marker")); string(b) != "host\n" {
		t.Errorf("read-only share's host file now holds %q", b)
	}
	if _, err := os.Lstat(filepath.Join(roDir, "new")); err == nil {
		t.Errorf("the guest created a file in the read-only share's host tree")
	}

	// Writable: the guest's copy is exact on the host, and a host write
	// after the guest's first read is what the guest reads next.
	sh("cp /data/big /scratch/copy && sync")
	if b, err := os.ReadFile(filepath.Join(rwDir, "copy")); err != nil || !bytes.Equal(b, big) {
		t.Errorf("the guest's copy on the writable share reads back on the host with %d bytes (err %v), want the %d bytes it copied", len(b), err, len(big))
	}
	const mapped = "written through a shared mapping"
	if out, st, err := run("mmapwrite", "/scratch/mapped", mapped); err != nil || st.Code != 0 {
		t.Errorf("guest write through a shared writable mapping on the writable share: %v, status %v, output %q", err, st, out)
	} else if b, _ := os.ReadFile(filepath.Join(rwDir, "mapped")); string(b) != mapped {
		t.Errorf("the guest's shared mapping wrote %q on the host, want %q", b, mapped)
	}
	if got := sh("cat /scratch/coh"); got != "one\n" {
		t.Fatalf("guest read %q from /scratch/coh, want %q", got, "one\n")
	}
	if err := os.WriteFile(filepath.Join(rwDir, "coh"), []byte("two, longer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := sh("cat /scratch/coh"); got != "two, longer\n" {
		t.Errorf("after a host write the guest reads %q from the writable share, want %q", got, "two, longer\n")
	}
}
