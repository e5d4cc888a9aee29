package bench

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

	"github.com/slurm-microvm/slurm-microvm/fs"
	"github.com/slurm-microvm/slurm-microvm/fs/guestpath"
	"github.com/slurm-microvm/slurm-microvm/launcher/assets"
	"github.com/slurm-microvm/slurm-microvm/launcher/qemu"
	"github.com/slurm-microvm/slurm-microvm/test/bench/internal/sharebench"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

// Shape of the share benchmark's guests and data.
const (
	shareGuestMiB = 1536
	shareBigMiB   = 256 // the read-only share's big file
	shareWriteMiB = 64  // the file written to the writable share
	// virtiofsd is QEMU 7.2's C virtio-fs daemon (Debian's
	// qemu-system-common); Debian 12 packages no other.
	virtiofsd = "/usr/lib/qemu/virtiofsd"
)

// shareVariant is one way of sharing a host directory.
type shareVariant struct {
	name  string
	fs    string // "9p" or "virtiofs"
	opts  string // guest mount options (9p)
	cache string // virtiofsd -o cache=
}

// shareVariants are the mechanisms measured side by side. QEMU 7.2 has no
// DAX window for vhost-user-fs (no cache-size property), so virtio-fs runs
// without DAX; 9p cache=fscache needs a cachefiles store on a guest disk
// and is not measured (see fs/doc.go).
func shareVariants() []shareVariant {
	ninep := func(msize int, cache string) shareVariant {
		o := fmt.Sprintf("trans=virtio,version=9p2000.L,msize=%d,cache=%s", msize, cache)
		return shareVariant{name: fmt.Sprintf("9p msize=%d cache=%s", msize, cache), fs: "9p", opts: o}
	}
	vfs := func(cache string) shareVariant {
		return shareVariant{name: "virtio-fs cache=" + cache, fs: "virtiofs", cache: cache}
	}
	return []shareVariant{
		ninep(131072, "none"), ninep(512000, "none"), ninep(1048576, "none"),
		ninep(512000, "loose"), ninep(512000, "mmap"),
		vfs("none"), vfs("auto"), vfs("always"),
	}
}

// product names the mount kinds the product mounts with v's options: ro
// (read-only shares, the GPU driver) and rw (writable shares, scratch).
func (v shareVariant) product() string {
	if v.fs != "9p" {
		return ""
	}
	var kinds []string
	for _, k := range []struct {
		name string
		opts string
	}{{"ro", guestpath.NinePOptionsReadOnly}, {"rw", guestpath.NinePOptions}} {
		if k.opts == v.opts {
			kinds = append(kinds, k.name)
		}
	}
	if kinds == nil {
		return ""
	}
	return " [product " + strings.Join(kinds, ", ") + "]"
}

// BenchmarkShares measures host shares side by side in one run, as guest /
// host ratios of the same workload (test/bench/internal/sharebench) on the
// same files: a sequential read of a 256 MiB file in 1 MiB requests, a
// tree of 2,000 4 KiB files opened, read and closed, and the same tree
// listed and stat'ed, each cold (the guest's first pass) and warm (its
// second); and on a writable share, a 64 MiB write with fsync and 500
// small files created. Host figures are the best of three passes from the
// page cache, which is also what the guest's first pass reads through.
// Each variant boots one -M microvm guest (1 vCPU, 1536 MiB) whose /init is
// test/bench/testdata/shareinit. 9p is QEMU's server (fsdev as fs.NineP
// writes it: readonly=on for the read-only share, QEMU dropped to nobody,
// the share given as /proc/self/fd/N); virtio-fs is QEMU 7.2's C virtiofsd
// as root, on a recursive read-only bind in a private mount namespace for
// the read-only share. Every guest also checks what it read (the big
// file's SHA-256, a directory of 3,000 long names listed completely) and
// tries to write to the read-only share, to a tmpfs mounted inside its
// source, and again after remounting it rw: every write must fail with
// EROFS and the host tree must not change.
//
// SMV_SHARE_BENCH_VARIANTS limits the run to a comma list of variant
// names (as printed, e.g. "9p msize=512000 cache=none").
func BenchmarkShares(b *testing.B) {
	prereq.Root(b, "virtiofsd, QEMU -runas, a tmpfs inside the share")
	qemuBin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		prereq.Missing(b, "qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
	}
	kernel, err := assets.NewestKernel(assets.DefaultBootDir, assets.DefaultModulesRoot)
	if err != nil {
		prereq.Missing(b, "no guest kernel: %v (apt-get install linux-image-amd64)", err)
	}
	if _, err := os.Stat(virtiofsd); err != nil {
		prereq.Missing(b, "no virtio-fs daemon: %v (apt-get install qemu-system-common)", err)
	}
	accel := qemu.DetectAccel()
	report.Environment(accel, filepath.Base(kernel))
	tmp := b.TempDir()
	initBin := filepath.Join(tmp, "shareinit")
	build := exec.Command("go", "build", "-trimpath", "-o", initBin, "./testdata/shareinit")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build shareinit: %v\n%s", err, out)
	}
	a, err := assets.Ensure(context.Background(), assets.Options{KernelImage: kernel, Agent: initBin, CacheDir: filepath.Join(tmp, "assets")})
	if err != nil {
		b.Fatal(err)
	}
	data := filepath.Join(tmp, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := sharebench.Create(data, shareBigMiB); err != nil {
		b.Fatal(err)
	}
	// A submount inside the source: read-only must hold below it too.
	sub := filepath.Join(data, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := unix.Mount("smv-bench-sub", sub, "tmpfs", 0, "size=1m,mode=0777"); err != nil {
		b.Fatalf("mount a tmpfs inside the share: %v", err)
	}
	b.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })

	// Host, same files, same code: best of three passes (the machine is
	// shared; the best pass is the least disturbed).
	host := map[string]sharebench.Result{}
	hostDo := func(k string, f func() (sharebench.Result, error)) {
		for i := 0; i < 3; i++ {
			r, err := f()
			if err != nil {
				b.Fatalf("host %s: %v", k, err)
			}
			if old, ok := host[k]; !ok || r.Took < old.Took {
				host[k] = r
			}
		}
	}
	hostDo("big", func() (sharebench.Result, error) { return sharebench.ReadBig(data) })
	hostDo("tree", func() (sharebench.Result, error) { return sharebench.WalkTree(data) })
	hostDo("stat", func() (sharebench.Result, error) { return sharebench.StatTree(data) })
	hostDo("wbig", func() (sharebench.Result, error) {
		d, err := os.MkdirTemp(tmp, "hostw")
		if err != nil {
			return sharebench.Result{}, err
		}
		defer os.RemoveAll(d)
		return sharebench.WriteBig(d, shareWriteMiB)
	})
	hostDo("wtree", func() (sharebench.Result, error) {
		d, err := os.MkdirTemp(tmp, "hostw")
		if err != nil {
			return sharebench.Result{}, err
		}
		defer os.RemoveAll(d)
		return sharebench.WriteTree(d, sharebench.TreeDirs/4)
	})
	wantSum := host["big"].Sum
	wantWSum := func() string { // what WriteBig writes, read back on the host
		d, err := os.MkdirTemp(tmp, "hostw")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(d)
		if _, err := sharebench.WriteBig(d, shareWriteMiB); err != nil {
			b.Fatal(err)
		}
		return hostSum(b, d)
	}()
	hostCmd := "go test -run XXX -bench BenchmarkShares -benchtime 1x ./test/bench/ (host side, best of 3)"
	report.Add(Figure{Section: "shares", Name: fmt.Sprintf("host: read %d MiB file", shareBigMiB), Value: host["big"].MBps(), Unit: "MB/s", Command: hostCmd})
	report.Add(Figure{Section: "shares", Name: fmt.Sprintf("host: open+read+close %d 4 KiB files", host["tree"].Files), Value: host["tree"].FilesPerSec(), Unit: "files/s", Command: hostCmd})
	report.Add(Figure{Section: "shares", Name: fmt.Sprintf("host: readdir+stat %d files", host["stat"].Files), Value: host["stat"].FilesPerSec(), Unit: "files/s", Command: hostCmd})
	report.Add(Figure{Section: "shares", Name: fmt.Sprintf("host: write %d MiB + fsync", shareWriteMiB), Value: host["wbig"].MBps(), Unit: "MB/s", Command: hostCmd})
	report.Add(Figure{Section: "shares", Name: fmt.Sprintf("host: create %d 4 KiB files", host["wtree"].Files), Value: host["wtree"].FilesPerSec(), Unit: "files/s", Command: hostCmd})

	variants := shareVariants()
	if v := os.Getenv("SMV_SHARE_BENCH_VARIANTS"); v != "" {
		want := map[string]bool{}
		for _, n := range strings.Split(v, ",") {
			want[strings.TrimSpace(n)] = true
		}
		var keep []shareVariant
		for _, sv := range variants {
			if want[sv.name] {
				keep = append(keep, sv)
			}
		}
		variants = keep
	}
	// Guest/host figures are in % (the report prints two decimals; small
	// files run at a few thousandths of the host's rate under TCG).
	var table strings.Builder
	fmt.Fprintf(&table, "%-32s %8s %8s %8s %8s %8s %8s %8s %8s  %s\n", "guest/host", "read", "warm", "files", "warm", "stat", "warm", "write", "create", "negotiated")
	for _, v := range variants {
		b.Run(strings.NewReplacer(" ", "_", "=", "-").Replace(v.name), func(b *testing.B) {
			rw := filepath.Join(tmp, "rw")
			_ = os.RemoveAll(rw)
			if err := os.Mkdir(rw, 0o777); err != nil {
				b.Fatal(err)
			}
			_ = os.Chown(rw, 65534, 65534) // QEMU's 9p server runs as nobody
			cmd, res, console := runShareGuest(b, qemuBin, a, accel, data, rw, tmp, v)
			if res["done"] == "" {
				b.Fatalf("%s: guest did not finish: %v\nconsole tail:\n%s", v.name, res, lastBytes(console, 3000))
			}
			g := map[string]sharebench.Result{}
			for _, k := range []string{"stat1", "tree1", "tree2", "stat2", "big1", "big2", "wbig", "wtree", "rwbig"} {
				g[k] = parseResult(b, k, res[k])
			}
			for k, want := range map[string]string{"big1": wantSum, "big2": wantSum, "rwbig": wantWSum} {
				if g[k].Sum != want {
					b.Errorf("%s: guest %s read SHA-256 %s, want %s", v.name, k, g[k].Sum, want)
				}
			}
			if s := hostSum(b, rw); s != wantWSum {
				b.Errorf("%s: the guest's write to the writable share reads back on the host with SHA-256 %s, want %s", v.name, s, wantWSum)
			}
			if res["wide"] != "ok" {
				b.Errorf("%s: guest listing of %s: %s", v.name, sharebench.WideDir, res["wide"])
			}
			for _, k := range []string{"write", "write_after_remount", "write_sub", "write_sub_after_remount", "chmod"} {
				if res[k] != "EROFS" {
					b.Errorf("%s: guest %s on the read-only share: %q, want EROFS", v.name, k, res[k])
				}
			}
			for _, p := range []string{"smv-write-test", "sub/smv-write-test"} {
				if _, err := os.Lstat(filepath.Join(data, p)); err == nil {
					b.Errorf("%s: the read-only share's host tree changed: %s", v.name, p)
					_ = os.Remove(filepath.Join(data, p))
				}
			}
			ratios := []struct {
				name       string
				guest, hst float64
			}{
				{fmt.Sprintf("read %d MiB", shareBigMiB), g["big1"].MBps(), host["big"].MBps()},
				{fmt.Sprintf("read %d MiB again", shareBigMiB), g["big2"].MBps(), host["big"].MBps()},
				{"open+read+close small files", g["tree1"].FilesPerSec(), host["tree"].FilesPerSec()},
				{"open+read+close small files again", g["tree2"].FilesPerSec(), host["tree"].FilesPerSec()},
				{"readdir+stat", g["stat1"].FilesPerSec(), host["stat"].FilesPerSec()},
				{"readdir+stat again", g["stat2"].FilesPerSec(), host["stat"].FilesPerSec()},
				{fmt.Sprintf("write %d MiB + fsync (rw share)", shareWriteMiB), g["wbig"].MBps(), host["wbig"].MBps()},
				{"create small files (rw share)", g["wtree"].FilesPerSec(), host["wtree"].FilesPerSec()},
			}
			fmt.Fprintf(&table, "%-32s", v.name)
			for _, r := range ratios {
				report.Add(Figure{Section: "shares", Name: v.name + v.product() + ": " + r.name + ", guest/host", Value: 100 * r.guest / r.hst, Unit: "%", Command: cmd})
				fmt.Fprintf(&table, " %8.4f", r.guest/r.hst)
			}
			report.Add(Figure{Section: "shares", Name: v.name + ": read, guest", Value: g["big1"].MBps(), Unit: "MB/s", Command: cmd})
			report.Add(Figure{Section: "shares", Name: v.name + ": small files, guest", Value: g["tree1"].FilesPerSec(), Unit: "files/s", Command: cmd})
			fmt.Fprintf(&table, "  %s\n", res["mount_options"])
			b.Logf("%s: read %.0f/%.0f MB/s, files %.0f/%.0f/s, stat %.0f/%.0f/s, write %.0f MB/s, create %.0f/s; mounted %s",
				v.name, g["big1"].MBps(), g["big2"].MBps(), g["tree1"].FilesPerSec(), g["tree2"].FilesPerSec(),
				g["stat1"].FilesPerSec(), g["stat2"].FilesPerSec(), g["wbig"].MBps(), g["wtree"].FilesPerSec(), res["mount_options"])
		})
	}
	b.Logf("host shares, guest/host (cold, warm; host from its page cache):\n%s", table.String())
}

// runShareGuest boots one guest with the two shares (data read-only as
// ro0, rw writable as rw0) and returns the command that measures it, its
// SMV-BENCH lines as key -> value, and the console.
func runShareGuest(b *testing.B, qemuBin string, a *assets.Assets, accel, data, rw, tmp string, v shareVariant) (string, map[string]string, string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmdline := append(assets.KernelCmdline(accel), "quiet", "smv_fs="+v.fs, "smv_write_mib="+strconv.Itoa(shareWriteMiB))
	if v.opts != "" {
		cmdline = append(cmdline, "smv_opts="+v.opts)
	}
	args := []string{
		"-M", "microvm,x-option-roms=off,isa-serial=on,rtc=on", "-accel", accel, "-cpu", "max",
		"-smp", "1", "-m", fmt.Sprintf("%dM", shareGuestMiB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-kernel", a.Kernel, "-initrd", a.Initrd, "-append", strings.Join(cmdline, " "),
	}
	var extra []*os.File
	var how string
	switch v.fs {
	case "9p":
		for i, s := range []struct {
			tag, dir string
			ro       bool
		}{{"ro0", data, true}, {"rw0", rw, false}} {
			fd, err := unix.Open(s.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				b.Fatal(err)
			}
			f := os.NewFile(uintptr(fd), s.dir)
			defer f.Close()
			extra = append(extra, f) // fd 3+i in QEMU
			share, err := fs.NineP{ID: s.tag, Tag: s.tag, Path: fs.ProcFDPath(3 + i), ReadOnly: s.ro}.Args()
			if err != nil {
				b.Fatal(err)
			}
			args = append(args, share...)
		}
		args = append(args, "-runas", "nobody")
		how = "fs.NineP fsdev (readonly=on for ro0), mount -t 9p -o " + v.opts
	case "virtiofs":
		for _, s := range []struct {
			tag, dir string
			ro       bool
		}{{"ro0", data, true}, {"rw0", rw, false}} {
			sock := filepath.Join(tmp, "vfs-"+s.tag+".sock")
			startVirtiofsd(ctx, b, sock, s.dir, v.cache, s.ro)
			share, err := fs.VirtioFS{ID: s.tag, Tag: s.tag, Socket: sock}.Args()
			if err != nil {
				b.Fatal(err)
			}
			args = append(args, share...)
		}
		args = append(args, fs.VirtioFSMachineArgs(shareGuestMiB)...)
		how = "virtiofsd -o cache=" + v.cache + " (ro0 on a recursive ro bind), mount -t virtiofs"
	}
	command := fmt.Sprintf("SMV_SHARE_BENCH_VARIANTS=%q go test -run XXX -bench BenchmarkShares -benchtime 1x ./test/bench/ (guest: %s, -M microvm, 1 vCPU, %d MiB; %s)",
		v.name, accel, shareGuestMiB, how)
	cmd := exec.CommandContext(ctx, qemuBin, args...)
	cmd.ExtraFiles = extra
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
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
	b.Logf("%s: QEMU ran %v (exit %v)", v.name, time.Since(start).Round(time.Millisecond), werr)
	if e := res["error"]; e != "" {
		b.Errorf("%s: guest error: %s", v.name, e)
	}
	return command, res, console.String()
}

// startVirtiofsd serves dir on sock with QEMU 7.2's C virtiofsd until ctx
// ends or the benchmark cleans up. Read-only from the host side (ro): a
// recursive read-only bind of dir in a private mount namespace, which
// virtiofsd's own sandbox inherits; every submount gets its own read-only
// remount (a plain "mount --bind -o ro" leaves submounts writable).
func startVirtiofsd(ctx context.Context, b *testing.B, sock, dir, cache string, ro bool) {
	b.Helper()
	_ = os.Remove(sock)
	vargs, err := fs.VirtiofsdArgs(sock, dir, cache)
	if err != nil {
		b.Fatal(err)
	}
	script := `set -e; d=$1; shift; exec "$0" "$@"`
	if ro {
		script = `set -e; d=$1; shift; mount --rbind "$d" "$d"; findmnt -R -n -r -o TARGET "$d" | while read -r m; do mount -o remount,bind,ro "$m"; done; exec "$0" "$@"`
	}
	d := exec.CommandContext(ctx, "unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", script, virtiofsd, dir}, vargs...)...)
	d.Cancel = func() error { return d.Process.Kill() }
	var dlog strings.Builder
	d.Stdout, d.Stderr = &dlog, &dlog
	if err := d.Start(); err != nil {
		b.Fatalf("start virtiofsd: %v", err)
	}
	b.Cleanup(func() {
		_ = d.Process.Kill() // by pid: ours
		_ = d.Wait()
		if b.Failed() {
			b.Logf("virtiofsd %s log:\n%s", dir, lastBytes(dlog.String(), 2000))
		}
	})
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			return
		}
		if i > 100 {
			b.Fatalf("virtiofsd socket %s did not appear: %s", sock, dlog.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// parseResult reads a guest line "FILES BYTES NANOSECONDS SUM".
func parseResult(b *testing.B, k, s string) sharebench.Result {
	b.Helper()
	var r sharebench.Result
	var ns int64
	if _, err := fmt.Sscanf(s, "%d %d %d %s", &r.Files, &r.Bytes, &ns, &r.Sum); err != nil {
		b.Fatalf("guest %s: parse %q: %v", k, s, err)
	}
	if r.Sum == "-" {
		r.Sum = ""
	}
	r.Took = time.Duration(ns)
	return r
}

// hostSum is the SHA-256 of dir's sharebench.BigFile, read on the host.
func hostSum(b *testing.B, dir string) string {
	b.Helper()
	r, err := sharebench.ReadBig(dir)
	if err != nil {
		b.Fatalf("host read of %s: %v", filepath.Join(dir, sharebench.BigFile), err)
	}
	return r.Sum
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
