package shim

import (
	"strings"
	"testing"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	taskv2 "github.com/containerd/containerd/api/runtime/task/v2"
	taskv3 "github.com/containerd/containerd/api/runtime/task/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

func TestParseBootstrap(t *testing.T) {
	pb, err := proto.Marshal(&bootapi.BootstrapResult{Version: 3, Address: "unix:///run/containerd/s/abc", Protocol: "ttrpc"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		out     string
		want    bootstrap
		wantErr string
	}{
		{name: "bare address (1.x)", out: "unix:///run/containerd/s/abc", want: bootstrap{"/run/containerd/s/abc", 2}},
		{name: "bare address with newline", out: "unix:///run/containerd/s/abc\n", want: bootstrap{"/run/containerd/s/abc", 2}},
		{name: "bare path", out: "/run/containerd/s/abc", want: bootstrap{"/run/containerd/s/abc", 2}},
		{name: "JSON v3 (2.0-2.3)", out: `{"version":3,"address":"unix:///run/containerd/s/abc","protocol":"ttrpc"}`, want: bootstrap{"/run/containerd/s/abc", 3}},
		{name: "JSON v2", out: `{"version":2,"address":"unix:///s","protocol":"ttrpc"}`, want: bootstrap{"/s", 2}},
		{name: "protobuf (2.4+)", out: string(pb), want: bootstrap{"/run/containerd/s/abc", 3}},
		{name: "empty", out: " \n", wantErr: "printed nothing"},
		{name: "grpc", out: `{"version":3,"address":"unix:///s","protocol":"grpc"}`, wantErr: "only ttrpc"},
		{name: "version 4", out: `{"version":4,"address":"unix:///s","protocol":"ttrpc"}`, wantErr: "version 4"},
		{name: "bad JSON", out: `{"version":`, wantErr: "not the JSON"},
		{name: "relative address", out: `{"version":3,"address":"unix://s","protocol":"ttrpc"}`, wantErr: "absolute path"},
		{name: "address with space", out: "unix:///s x", wantErr: "absolute path"},
		{name: "noise", out: "\xff\xff\xff", wantErr: "neither an address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseBootstrap([]byte(c.out))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("parseBootstrap(%q) = %+v, %v; want an error containing %q", c.out, got, err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("parseBootstrap(%q) = %+v, %v; want %+v", c.out, got, err, c.want)
			}
		})
	}
}

func TestBootstrapParams(t *testing.T) {
	b, err := bootstrapParams("job1", "ns", "/s/containerd.sock", "/s/containerd.sock.ttrpc", true)
	if err != nil {
		t.Fatal(err)
	}
	var p bootapi.BootstrapParams
	if err := proto.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.GetInstanceID() != "job1" || p.GetNamespace() != "ns" || p.GetContainerdTtrpcAddress() != "/s/containerd.sock.ttrpc" ||
		p.GetContainerdGrpcAddress() != "/s/containerd.sock" || p.GetLogLevel() != bootapi.LogLevel_LOG_LEVEL_DEBUG {
		t.Errorf("bootstrap params = %v", &p)
	}
}

// TestTaskAPIVersionsAgree backs the one client for both task API
// versions: every message of containerd.task.v2 has the same fields
// (number, name, kind, message type name within the package) in
// containerd.task.v3, and the services have the same methods.
func TestTaskAPIVersionsAgree(t *testing.T) {
	v2, v3 := taskv2.File_runtime_task_v2_shim_proto, taskv3.File_runtime_task_v3_shim_proto
	local := func(n protoreflect.FullName, pkg protoreflect.FullName) string {
		return strings.TrimPrefix(string(n), string(pkg)+".")
	}
	if v2.Messages().Len() != v3.Messages().Len() {
		t.Fatalf("v2 has %d messages, v3 %d", v2.Messages().Len(), v3.Messages().Len())
	}
	for i := range v2.Messages().Len() {
		m2 := v2.Messages().Get(i)
		m3 := v3.Messages().ByName(m2.Name())
		if m3 == nil {
			t.Errorf("v3 lacks message %s", m2.Name())
			continue
		}
		if m2.Fields().Len() != m3.Fields().Len() {
			t.Errorf("%s: %d fields in v2, %d in v3", m2.Name(), m2.Fields().Len(), m3.Fields().Len())
			continue
		}
		for j := range m2.Fields().Len() {
			f2 := m2.Fields().Get(j)
			f3 := m3.Fields().ByNumber(f2.Number())
			if f3 == nil || f3.Name() != f2.Name() || f3.Kind() != f2.Kind() || f3.Cardinality() != f2.Cardinality() {
				t.Errorf("%s field %d: v2 %v, v3 %v", m2.Name(), f2.Number(), f2, f3)
				continue
			}
			if f2.Message() != nil && local(f2.Message().FullName(), v2.Package()) != local(f3.Message().FullName(), v3.Package()) {
				t.Errorf("%s field %s: type %s in v2, %s in v3", m2.Name(), f2.Name(), f2.Message().FullName(), f3.Message().FullName())
			}
		}
	}
	s2, s3 := v2.Services().Get(0), v3.Services().Get(0)
	for i := range s2.Methods().Len() {
		m := s2.Methods().Get(i)
		if m3 := s3.Methods().ByName(m.Name()); m3 == nil || m3.Input().Name() != m.Input().Name() || m3.Output().Name() != m.Output().Name() {
			t.Errorf("method %s differs in v3", m.Name())
		}
	}
	if s2.Methods().Len() != s3.Methods().Len() {
		t.Errorf("v2 has %d methods, v3 %d", s2.Methods().Len(), s3.Methods().Len())
	}
}
