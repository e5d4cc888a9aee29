package fs

import (
	"strings"
	"testing"
)

// qemuOpts splits a QEMU option string the way QEMU's parser does
// (util/qemu-option.c): ',' separates, ",," is a literal comma.
func qemuOpts(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == ',' {
			if i+1 < len(s) && s[i+1] == ',' {
				cur.WriteByte(',')
				i++
				continue
			}
			out = append(out, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteByte(s[i])
	}
	return append(out, cur.String())
}

func optValue(opts []string, key string) (string, int) {
	v, n := "", 0
	for _, o := range opts {
		if k, val, ok := strings.Cut(o, "="); ok && k == key {
			v, n = val, n+1
		}
	}
	return v, n
}

func TestNinePArgs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		share   NineP
		errPart string
	}{
		{name: "descriptor path", share: NineP{ID: "smv0", Tag: "smv0", Path: ProcFDPath(3), ReadOnly: true}},
		{name: "writable", share: NineP{ID: "smv1", Tag: "smv1", Path: "/scratch/x"}},
		{name: "option text in a path", share: NineP{ID: "smv0", Tag: "smv0", Path: "/data,readonly=off,security_model=passthrough", ReadOnly: true}},
		{name: "comma colon space", share: NineP{ID: "smv0", Tag: "smv0", Path: "/a,b:c d", ReadOnly: true}},
		{name: "newline", share: NineP{ID: "smv0", Tag: "smv0", Path: "/data\nx"}, errPart: "newline"},
		{name: "NUL", share: NineP{ID: "smv0", Tag: "smv0", Path: "/data\x00x"}, errPart: "NUL"},
		{name: "relative", share: NineP{ID: "smv0", Tag: "smv0", Path: "data"}, errPart: "absolute"},
		{name: "tag with comma", share: NineP{ID: "smv0", Tag: "a,readonly=off", Path: "/d"}, errPart: "tag"},
		{name: "tag too long", share: NineP{ID: "smv0", Tag: strings.Repeat("t", 32), Path: "/d"}, errPart: "tag"},
		{name: "bad id", share: NineP{ID: "0x", Tag: "t", Path: "/d"}, errPart: "id"},
		{name: "bad model", share: NineP{ID: "a", Tag: "t", Path: "/d", SecurityModel: "none,readonly=off"}, errPart: "security model"},
		{name: "bad device", share: NineP{ID: "a", Tag: "t", Path: "/d", Device: "virtio-9p-device,x=y"}, errPart: "device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, err := tc.share.Args()
			if tc.errPart != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errPart) {
					t.Fatalf("Args() = %q, %v; want an error about %s", args, err, tc.errPart)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(args) != 4 || args[0] != "-fsdev" || args[2] != "-device" {
				t.Fatalf("args %q", args)
			}
			fsdev := qemuOpts(args[1])
			if fsdev[0] != "local" {
				t.Errorf("driver %q", fsdev[0])
			}
			if p, n := optValue(fsdev, "path"); p != tc.share.Path || n != 1 {
				t.Errorf("QEMU would read path %q (%d times), want %q: %q", p, n, tc.share.Path, args[1])
			}
			ro, n := optValue(fsdev, "readonly")
			if tc.share.ReadOnly && (ro != "on" || n != 1) || !tc.share.ReadOnly && n != 0 {
				t.Errorf("readonly=%q (%d times) for ReadOnly=%v: %q", ro, n, tc.share.ReadOnly, args[1])
			}
			if m, n := optValue(fsdev, "security_model"); m != "none" || n != 1 {
				t.Errorf("security_model=%q (%d times)", m, n)
			}
			dev := qemuOpts(args[3])
			if tag, _ := optValue(dev, "mount_tag"); dev[0] != "virtio-9p-device" || tag != tc.share.Tag {
				t.Errorf("device %q", args[3])
			}
		})
	}
}

func TestVirtioFSArgs(t *testing.T) {
	args, err := VirtioFS{ID: "vfs0", Tag: "smv0", Socket: "/run/x,server=on/vfs.sock", QueueSize: 1024}.Args()
	if err != nil {
		t.Fatal(err)
	}
	if p, n := optValue(qemuOpts(args[1]), "path"); p != "/run/x,server=on/vfs.sock" || n != 1 {
		t.Errorf("chardev path %q (%d): %q", p, n, args[1])
	}
	if _, n := optValue(qemuOpts(args[1]), "server"); n != 0 {
		t.Errorf("a path changed an option: %q", args[1])
	}
	if args[3] != "vhost-user-fs-device,chardev=vfs0,tag=smv0,queue-size=1024" {
		t.Errorf("device %q", args[3])
	}
	for _, bad := range []VirtioFS{
		{ID: "v", Tag: "t", Socket: "/s\n"},
		{ID: "v", Tag: "t,x", Socket: "/s"},
		{ID: "v", Tag: strings.Repeat("t", 37), Socket: "/s"},
		{ID: "v", Tag: "t", Socket: "s"},
	} {
		if _, err := bad.Args(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	m := VirtioFSMachineArgs(1024)
	if strings.Join(m, " ") != "-object memory-backend-memfd,id=mem,size=1024M,share=on -machine memory-backend=mem -global virtio-mmio.force-legacy=false" {
		t.Errorf("machine args %q", m)
	}
}

func TestVirtiofsdArgs(t *testing.T) {
	args, err := VirtiofsdArgs("/run/s/vfs.sock", "/run/s/share0", "")
	if err != nil || strings.Join(args, " ") != "--socket-path=/run/s/vfs.sock -o source=/run/s/share0,cache=auto,sandbox=namespace" {
		t.Errorf("%q %v", args, err)
	}
	for _, src := range []string{"/d,writeback", `/d\,x`, "/d\nx", "d"} {
		if _, err := VirtiofsdArgs("/s", src, ""); err == nil {
			t.Errorf("source %q accepted", src)
		}
	}
	if _, err := VirtiofsdArgs("/s", "/d", "always,writeback"); err == nil {
		t.Error("cache option injection accepted")
	}
}

func TestQEMUValue(t *testing.T) {
	for in, want := range map[string]string{"/a": "/a", "/a,b": "/a,,b", ",,": ",,,,", "/a=b c:d": "/a=b c:d"} {
		if got, err := QEMUValue(in); err != nil || got != want {
			t.Errorf("QEMUValue(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/a\n", "/a\r", "/a\x00"} {
		if _, err := QEMUValue(in); err == nil {
			t.Errorf("QEMUValue(%q) accepted", in)
		}
	}
}
