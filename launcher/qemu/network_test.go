package qemu

import (
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

func TestNetworkSetup(t *testing.T) {
	mac := [6]byte{0x52, 0x54, 0, 10, 99, 2}
	tests := []struct {
		name string
		in   driver.GuestNetwork
		want *api.Network
	}{
		{name: "everything", in: driver.GuestNetwork{
			MAC: mac, Addr: netip.MustParsePrefix("10.99.0.2/24"), MTU: 1450, Gateway: netip.MustParseAddr("10.99.0.1"),
			Routes:    []driver.Route{{Dst: netip.MustParsePrefix("10.98.0.0/16"), Via: netip.MustParseAddr("10.99.0.1")}},
			Neighbors: []driver.Neighbor{{Addr: netip.MustParseAddr("10.99.0.3"), MAC: [6]byte{0x52, 0x54, 0, 10, 99, 3}}},
			Hosts:     []driver.HostEntry{{Addr: netip.MustParseAddr("10.99.0.3"), Names: []string{"n2", "n2.c"}}},
			DNS:       []netip.Addr{netip.MustParseAddr("10.0.2.3")},
		}, want: &api.Network{
			Mac: mac[:], Address: "10.99.0.2/24", Mtu: 1450, Gateway: "10.99.0.1",
			Routes:    []*api.Route{{Destination: "10.98.0.0/16", Via: "10.99.0.1"}},
			Neighbors: []*api.Neighbor{{Address: "10.99.0.3", Mac: []byte{0x52, 0x54, 0, 10, 99, 3}}},
			Hosts:     []*api.HostEntry{{Address: "10.99.0.3", Names: []string{"n2", "n2.c"}}},
			Dns:       []string{"10.0.2.3"},
		}},
		{name: "no gateway, MTU kept", in: driver.GuestNetwork{MAC: mac, Addr: netip.MustParsePrefix("10.0.2.15/24")},
			want: &api.Network{Mac: mac[:], Address: "10.0.2.15/24"}},
		// An invalid address goes as "" and the guest refuses it, naming
		// the field: the host does not hide a bad configuration.
		{name: "no address", in: driver.GuestNetwork{MAC: mac, MTU: -1}, want: &api.Network{Mac: mac[:]}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := networkSetup(tt.in)
			if !proto.Equal(got, tt.want) {
				t.Errorf("networkSetup =\n%v\nwant\n%v", got, tt.want)
			}
			// The wire form round-trips (field 12 of SetupRequest).
			b, err := proto.Marshal(&api.SetupRequest{Network: got})
			if err != nil {
				t.Fatal(err)
			}
			var back api.SetupRequest
			if err := proto.Unmarshal(b, &back); err != nil || !proto.Equal(back.Network, tt.want) {
				t.Errorf("round trip: %v %v", back.Network, err)
			}
		})
	}
}

// TestStartInNetns: a child started by startIn runs in the given network
// namespace, and the calling goroutine's thread, like every other, stays
// in the original one.
func TestStartInNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		prereq.Root(t, "setns")
	}
	self, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	ns := newNetns(t)
	want, err := os.Readlink("/proc/self/fd/" + itoa(int(ns.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		cmd := exec.Command("readlink", "/proc/self/ns/net")
		var out strings.Builder
		cmd.Stdout = &out
		if err := startIn(cmd, ns); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(out.String()); got != want {
			t.Errorf("child in %s, want %s", got, want)
		}
		if got, _ := os.Readlink("/proc/thread-self/ns/net"); got != self {
			t.Errorf("this thread is in %s after startIn, want %s", got, self)
		}
	}
	// Without a namespace: the caller's.
	cmd := exec.Command("readlink", "/proc/self/ns/net")
	var out strings.Builder
	cmd.Stdout = &out
	if err := startIn(cmd, nil); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if got := strings.TrimSpace(out.String()); got != self {
		t.Errorf("child without a namespace in %s, want %s", got, self)
	}
}

// newNetns makes a fresh network namespace (on a locked thread that then
// dies) and returns it open; it goes when the file is closed.
func newNetns(t *testing.T) *os.File {
	t.Helper()
	type res struct {
		f   *os.File
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies in its new namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- res{nil, err}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		ch <- res{f, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("new network namespace: %v", r.err)
	}
	t.Cleanup(func() { r.f.Close() })
	return r.f
}

func itoa(i int) string { return strconv.Itoa(i) }
