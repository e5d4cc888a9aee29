package fs

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/fs/internal/sharebench"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// TestShareBench measures the two host-share mechanisms side by side in
// one run: a 512 MiB sequential read and a walk reading 10,000 4 KiB files,
// on the host and in a -M microvm guest through 9p (QEMU's server, fsdev
// readonly=on, QEMU dropped to nobody with -runas, the share given as
// /proc/self/fd/N of a descriptor opened beforehand) and virtio-fs (QEMU
// 7.2's C virtiofsd as root on a read-only bind in a private mount
// namespace, every submount remounted read-only too). Each guest also
// tries to write to the share and to a tmpfs mounted inside the source on
// the host, to remount read-write and write again: every write must fail
// with EROFS and the host tree must not change.
//
// It boots several VMs (minutes under TCG), so it runs only with
// SMV_SHARE_BENCH=1. SMV_SHARE_BENCH_MIB sets the big file's size (512),
// SMV_SHARE_BENCH_VARIANTS a comma list of variant names (all).
func TestShareBench(t *testing.T) {
	if os.Getenv("SMV_SHARE_BENCH") != "1" {
		prereq.OptIn(t, "set SMV_SHARE_BENCH=1 to run the share benchmark (boots VMs, minutes under TCG)")
	}
	prereq.Root(t, "virtiofsd, -runas")
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		prereq.Missing(t, "qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
	}
	kernel, err := assets.NewestKernel(assets.DefaultBootDir, assets.DefaultModulesRoot)
	if err != nil {
		prereq.Missing(t, "no guest kernel: %v (apt-get install linux-image-amd64)", err)
	}
	mib := 512
	if v := os.Getenv("SMV_SHARE_BENCH_MIB"); v != "" {
		if mib, err = strconv.Atoi(v); err != nil {
			t.Fatal(err)
		}
	}
	tmp := t.TempDir()
	initBin := filepath.Join(tmp, "shareinit")
	build := exec.Command("go", "build", "-trimpath", "-o", initBin, "./testdata/shareinit")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build shareinit: %v\n%s", err, b)
	}
	a, err := assets.Ensure(context.Background(), assets.Options{KernelImage: kernel, Agent: initBin, CacheDir: filepath.Join(tmp, "assets")})
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(tmp, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := sharebench.Create(data, mib); err != nil {
		t.Fatal(err)
	}
	// A submount inside the source: read-only must hold below it too.
	sub := filepath.Join(data, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("smv-bench-sub", sub, "tmpfs", 0, "size=1m,mode=0777"); err != nil {
		t.Fatalf("mount a tmpfs inside the share: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(sub, unix.MNT_DETACH) })

	// Host, same files, same code: best of three passes (the machine is
	// shared; the best pass is the least disturbed), all from the host page
	// cache, which is also what the guest's first pass reads through.
	var hb, ht sharebench.Result
	for i := 0; i < 3; i++ {
		b, err := sharebench.ReadBig(data)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := sharebench.WalkTree(data)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 || b.Took < hb.Took {
			hb = b
		}
		if i == 0 || tr.Took < ht.Took {
			ht = tr
		}
	}
	t.Logf("host: read %d MiB %.0f MB/s; tree %d files %.0f files/s (%.1f MB/s)",
		mib, hb.MBps(), ht.Files, ht.FilesPerSec(), ht.MBps())

	variants := []shareVariant{
		{name: "9p-none-cache=none", fs: "9p", model: SecurityNone, opts: "trans=virtio,version=9p2000.L,msize=512000,cache=none"},
		{name: "9p-none-cache=loose", fs: "9p", model: SecurityNone, opts: "trans=virtio,version=9p2000.L,msize=512000,cache=loose"},
		{name: "9p-passthrough-cache=none", fs: "9p", model: SecurityPassthrough, opts: "trans=virtio,version=9p2000.L,msize=512000,cache=none"},
		{name: "virtiofs-cache=auto", fs: "virtiofs", cache: "auto"},
		{name: "virtiofs-cache=none", fs: "virtiofs", cache: "none"},
	}
	if v := os.Getenv("SMV_SHARE_BENCH_VARIANTS"); v != "" {
		want := map[string]bool{}
		for _, n := range strings.Split(v, ",") {
			want[n] = true
		}
		var keep []shareVariant
		for _, sv := range variants {
			if want[sv.name] {
				keep = append(keep, sv)
			}
		}
		variants = keep
	}
	var report strings.Builder
	fmt.Fprintf(&report, "host: %d MiB read %.0f MB/s, %d files %.0f files/s\n", mib, hb.MBps(), ht.Files, ht.FilesPerSec())
	fmt.Fprintf(&report, "%-27s %9s %7s %9s %7s %10s %7s %10s %6s | %-8s %-8s %s\n",
		"variant", "read MB/s", "ratio", "warm MB/s", "ratio", "files/s", "ratio", "warm f/s", "ratio", "write", "remount", "write after remount (share, submount)")
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			res, console := runShareGuest(t, qemu, a, data, tmp, v)
			if res["done"] == "" {
				t.Fatalf("guest did not finish: %v\nconsole tail:\n%s", res, lastBytes(console, 3000))
			}
			big1, big2 := parseBig(t, res["big1"]), parseBig(t, res["big2"])
			tree1, tree2 := parseTree(t, res["tree1"]), parseTree(t, res["tree2"])
			for _, k := range []string{"write", "write_after_remount", "write_sub", "write_sub_after_remount", "chmod"} {
				if res[k] != "EROFS" {
					t.Errorf("%s: guest %s: %q, want EROFS", v.name, k, res[k])
				}
			}
			for _, p := range []string{"smv-write-test", "sub/smv-write-test"} {
				if _, err := os.Lstat(filepath.Join(data, p)); err == nil {
					t.Errorf("%s: the host tree changed: %s", v.name, p)
					os.Remove(filepath.Join(data, p))
				}
			}
			line := fmt.Sprintf("%-27s %9.0f %7.3f %9.0f %7.3f %10.0f %7.3f %10.0f %6.3f | %-8s %-8s %s, %s",
				v.name, big1.MBps(), big1.MBps()/hb.MBps(), big2.MBps(), big2.MBps()/hb.MBps(),
				tree1.FilesPerSec(), tree1.FilesPerSec()/ht.FilesPerSec(), tree2.FilesPerSec(), tree2.FilesPerSec()/ht.FilesPerSec(),
				res["write"], res["remount_rw"], res["write_after_remount"], res["write_sub_after_remount"])
			t.Log(line)
			fmt.Fprintln(&report, line)
		})
	}
	t.Logf("share benchmark (guest/host ratios; host warm page cache):\n%s", report.String())
	fmt.Print(report.String())
}

type shareVariant struct {
	name  string
	fs    string // "9p" or "virtiofs"
	model string // 9p security model
	opts  string // guest mount options
	cache string // virtiofsd cache
}

// runShareGuest boots one guest on the share and returns its SMV-BENCH
// lines as key -> value, and the console.
func runShareGuest(t *testing.T, qemu string, a *assets.Assets, data, tmp string, v shareVariant) (map[string]string, string) {
	t.Helper()
	const memMiB = 1536
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmdline := append(assets.KernelCmdline("tcg"), "quiet", "smv_fs="+v.fs, "smv_tag=smv0")
	if v.opts != "" {
		cmdline = append(cmdline, "smv_opts="+v.opts)
	}
	args := []string{
		"-M", "microvm,x-option-roms=off,isa-serial=on,rtc=on", "-accel", "tcg", "-cpu", "max",
		"-smp", "1", "-m", fmt.Sprintf("%dM", memMiB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-kernel", a.Kernel, "-initrd", a.Initrd, "-append", strings.Join(cmdline, " "),
	}
	var extra []*os.File
	switch v.fs {
	case "9p":
		fd, err := unix.Open(data, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), data)
		defer f.Close()
		extra = append(extra, f) // fd 3 in QEMU
		share, err := NineP{ID: "smv0", Tag: "smv0", Path: ProcFDPath(3), ReadOnly: true, SecurityModel: v.model}.Args()
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, share...)
		args = append(args, "-runas", "nobody")
	case "virtiofs":
		sock := filepath.Join(tmp, "vfs-"+v.cache+".sock")
		vargs, err := VirtiofsdArgs(sock, data, v.cache)
		if err != nil {
			t.Fatal(err)
		}
		// Read-only from the host side: a read-only bind of the source in a
		// private mount namespace, which virtiofsd's own sandbox inherits.
		// Recursively: every submount gets its own read-only remount.
		script := `set -e; mount --rbind "$1" "$1"; findmnt -R -n -r -o TARGET "$1" | while read -r m; do mount -o remount,bind,ro "$m"; done; shift; exec /usr/lib/qemu/virtiofsd "$@"`
		d := exec.CommandContext(ctx, "unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", script, "sh", data}, vargs...)...)
		d.Cancel = func() error { return d.Process.Kill() }
		var dlog strings.Builder
		d.Stdout, d.Stderr = &dlog, &dlog
		if err := d.Start(); err != nil {
			t.Fatalf("start virtiofsd: %v", err)
		}
		defer func() {
			d.Process.Kill() // by pid: ours
			d.Wait()
			if t.Failed() {
				t.Logf("virtiofsd log:\n%s", lastBytes(dlog.String(), 2000))
			}
		}()
		for i := 0; ; i++ {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			if i > 100 {
				t.Fatalf("virtiofsd socket %s did not appear: %s", sock, dlog.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		share, err := VirtioFS{ID: "smv0", Tag: "smv0", Socket: sock}.Args()
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, VirtioFSMachineArgs(memMiB)...)
		args = append(args, share...)
	}
	cmd := exec.CommandContext(ctx, qemu, args...)
	cmd.ExtraFiles = extra
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	res := map[string]string{}
	var console strings.Builder
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		l := strings.TrimRight(sc.Text(), "\r")
		console.WriteString(l + "\n")
		if i := strings.Index(l, "SMV-BENCH "); i >= 0 {
			k, val, _ := strings.Cut(l[i+len("SMV-BENCH "):], " ")
			res[k] = val
		}
	}
	werr := cmd.Wait()
	t.Logf("%s: QEMU ran %v (exit %v)", v.name, time.Since(start).Round(time.Millisecond), werr)
	if e := res["error"]; e != "" {
		t.Errorf("guest error: %s", e)
	}
	return res, console.String()
}

func parseBig(t *testing.T, s string) sharebench.Result {
	var r sharebench.Result
	var ns int64
	if _, err := fmt.Sscanf(s, "%d %d", &r.Bytes, &ns); err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	r.Files, r.Took = 1, time.Duration(ns)
	return r
}

func parseTree(t *testing.T, s string) sharebench.Result {
	var r sharebench.Result
	var ns int64
	if _, err := fmt.Sscanf(s, "%d %d %d", &r.Files, &r.Bytes, &ns); err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	r.Took = time.Duration(ns)
	return r
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
