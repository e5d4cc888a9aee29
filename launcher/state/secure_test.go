package state

import (
	"errors"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Real uids other than the test's own: the kernel needs no passwd entry to
// run a process as them or to own a file.
const (
	userA = 43101 // the job's user
	userB = 43102 // another tenant
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		prereq.Root(t, "chown to other uids, run as other uids")
	}
}

// rootOnly is a new directory under /run (its parents root's, 0755).
func rootOnly(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/run", "smv-state-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// A directory another user created first (or made writable for others,
// or replaced by a symlink) is refused, not reused.
func TestMakeDirRefusesForeign(t *testing.T) {
	needRoot(t)
	base := rootOnly(t)
	mk := func(name string, mode os.FileMode, uid int) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	foreign := mk("foreign", 0o700, userB)
	groupW := mk("group-writable", 0o770, 0)
	openParent := mk("open-parent", 0o777, 0) // not sticky
	stickyParent := mk("sticky-parent", os.ModeSticky|0o777, 0)
	link := filepath.Join(base, "link")
	if err := os.Symlink(mk("target", 0o700, 0), link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, wantErr string
	}{
		{foreign, "owned by uid 43102"},
		{groupW, "mode 0770"},
		{link, "not a symlink"},
		{filepath.Join(openParent, "x"), "must be sticky"},
		{filepath.Join(foreign, "x"), "owned by uid 43102"},
		{filepath.Join(base, "new"), ""},
		{filepath.Join(stickyParent, "x"), ""},
	}
	for _, tt := range tests {
		err := MakeDir(tt.path, 0o700)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("MakeDir(%s): %v", tt.path, err)
			} else if err := CheckDir(tt.path); err != nil {
				t.Errorf("CheckDir(%s) after MakeDir: %v", tt.path, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("MakeDir(%s) = %v, want an error containing %q", tt.path, err, tt.wantErr)
		}
		if err := CheckDir(tt.path); err == nil {
			t.Errorf("CheckDir(%s) accepted", tt.path)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(foreign, &st); err != nil || st.Uid != userB || st.Mode&0o777 != 0o700 {
		t.Errorf("the refused directory was changed: %+v %v", st, err)
	}
}

// A planted symlink is never followed: not by OpenFile (logs), not by
// WriteFileAtomic (its temporary file had a fixed name), and a FIFO or
// another user's file is refused without blocking or truncating.
func TestNoFollow(t *testing.T) {
	needRoot(t)
	dir := rootOnly(t)
	victim := filepath.Join(rootOnly(t), "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"launcher.log", "spec.json.tmp", "spec.json"} {
		if err := os.Symlink(victim, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if f, err := OpenFile(filepath.Join(dir, "launcher.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644); err == nil {
		f.Close()
		t.Error("OpenFile followed a symlink")
	}
	if err := WriteFileAtomic(filepath.Join(dir, "spec.json"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("symlink target written: %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "spec.json")); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Fatalf("spec.json: %v %v, want a regular file 0644 replacing the link", fi, err)
	}
	fifo := filepath.Join(dir, "fifo.log")
	if err := unix.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		f, err := OpenFile(fifo, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err == nil {
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("OpenFile opened a FIFO")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OpenFile blocked on a planted FIFO")
	}
	theirs := filepath.Join(dir, "theirs.log")
	if err := os.WriteFile(theirs, []byte("b's"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, userB, userB); err != nil {
		t.Fatal(err)
	}
	if f, err := OpenFile(theirs, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644); err == nil {
		f.Close()
		t.Error("OpenFile opened another user's file")
	}
	if b, _ := os.ReadFile(theirs); string(b) != "b's" {
		t.Errorf("another user's file truncated: %q", b)
	}
}

// runAs runs argv as uid and returns its combined output and error.
func runAs(uid int, argv ...string) (string, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// GrantSearch: the job's user opens the files it knows, by their own
// modes, and cannot list or write; another user (here even one in the
// directory's group) cannot enter at all.
func TestGrantSearch(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(rootOnly(t), "1.0.0")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 0, userB); err != nil { // B in the owning group
		t.Fatal(err)
	}
	if err := GrantSearch(dir, userA); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "spec.json")
	if err := os.WriteFile(f, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runAs(userA, "cat", f); err != nil || out != "{}" {
		t.Errorf("job user cannot read %s: %q %v", f, out, err)
	}
	if out, err := runAs(userA, "ls", dir); err == nil {
		t.Errorf("job user listed the step directory: %q", out)
	}
	if out, err := runAs(userA, "touch", filepath.Join(dir, "planted")); err == nil {
		t.Errorf("job user wrote in the step directory: %q", out)
	}
	for _, argv := range [][]string{{"cat", f}, {"ls", dir}, {"stat", f}} {
		if out, err := runAs(userB, argv...); err == nil {
			t.Errorf("other user: %v succeeded: %q", argv, out)
		}
	}
}

// The stop protocol: once MarkStopped began, the supervisor cannot record
// itself and no phase starts; a prepare of a stopped step is refused even
// after the step's directory is gone; a supervisor that recorded itself
// before is in the record when MarkStopped returns.
func TestStopWinsOverStart(t *testing.T) {
	root := t.TempDir()
	d := Dir{Root: root, ID: StepID{Job: 9, Step: 1}}
	if err := os.MkdirAll(d.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.CheckNotStopped("boot"); err != nil {
		t.Fatalf("a fresh step reads as stopped: %v", err)
	}
	if err := d.RecordSupervisor(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	// A supervisor in the middle of recording holds the lock: the mark
	// waits for it and sees the record afterwards.
	unlock, err := d.lock()
	if err != nil {
		t.Fatal(err)
	}
	marked := make(chan error, 1)
	go func() { marked <- d.MarkStopped() }()
	select {
	case err := <-marked:
		t.Fatalf("MarkStopped did not wait for the lock: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	unlock()
	if err := <-marked; err != nil {
		t.Fatal(err)
	}
	if p, err := ReadProc(d.File(SupervisorFile)); err != nil || p.Pid != os.Getpid() {
		t.Fatalf("record after the mark: %+v %v", p, err)
	}
	for _, err := range []error{d.RecordSupervisor(os.Getpid()), d.CheckNotStopped("boot"), d.CheckPrepare()} {
		if !errors.Is(err, ErrStopped) {
			t.Errorf("after the mark: %v, want ErrStopped", err)
		}
	}
	// The stop removes the state; the record remains for a late prepare.
	if err := os.RemoveAll(d.Path()); err != nil {
		t.Fatal(err)
	}
	if err := d.CheckPrepare(); !errors.Is(err, ErrStopped) {
		t.Errorf("prepare after the stop: %v", err)
	}
	if err := d.RecordSupervisor(os.Getpid()); !errors.Is(err, ErrStopped) {
		t.Errorf("record after the stop: %v", err)
	}
	// gc of the job removes its records; records of other jobs stay
	// until StopRecordTTL.
	other := Dir{Root: root, ID: StepID{Job: 10}}
	if err := os.MkdirAll(other.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := other.MarkStopped(); err != nil {
		t.Fatal(err)
	}
	if err := PruneStopRecords(root, 9, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	if d.CheckPrepare() != nil || other.CheckPrepare() == nil {
		t.Errorf("prune of job 9: job 9 stopped %v, job 10 stopped %v", d.CheckPrepare(), other.CheckPrepare())
	}
	if err := PruneStopRecords(root, 0, "", time.Now().Add(StopRecordTTL+time.Hour)); err != nil {
		t.Fatal(err)
	}
	if other.CheckPrepare() != nil {
		t.Error("a record older than StopRecordTTL was kept")
	}
}
