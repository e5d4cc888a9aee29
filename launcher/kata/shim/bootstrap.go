package shim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	bootapi "github.com/containerd/containerd/api/runtime/bootstrap/v1"
	"google.golang.org/protobuf/proto"
)

// bootstrap is what a shim's `start` printed: where it serves and which
// task API version.
type bootstrap struct {
	// Socket is the path of the unix socket the shim serves ttrpc on.
	Socket string
	// Version is the task API version: 2 (containerd.task.v2.Task) or 3
	// (containerd.task.v3.Task).
	Version int
}

// parseBootstrap reads the stdout of `<shim> ... start`. Three forms exist
// (containerd core/runtime/v2/shim.go parseStartResponse is the reference):
//
//   - a bare address ("unix:///run/containerd/s/<hash>"): shims built on
//     containerd 1.x, task API v2;
//   - JSON {"version":3,"address":"unix://...","protocol":"ttrpc"}:
//     shims built on containerd 2.0 to 2.3;
//   - a protobuf containerd.runtime.bootstrap.v1.BootstrapResult (same
//     fields): shims built on containerd 2.4+ answering the bootstrap
//     parameters this package writes on their stdin.
//
// It returns an error naming the output when it is none of these, when the
// protocol is not ttrpc (a grpc shim is not supported) or the version is
// not 2 or 3.
func parseBootstrap(out []byte) (bootstrap, error) {
	text := bytes.TrimSpace(out)
	if len(text) == 0 {
		return bootstrap{}, fmt.Errorf("the shim's start printed nothing (expected its address)")
	}
	var version int
	var address, protocol string
	switch {
	case bytes.HasPrefix(text, []byte("unix://")) || text[0] == '/':
		version, address, protocol = 2, string(text), "ttrpc"
	case text[0] == '{':
		var j struct {
			Version  int    `json:"version"`
			Address  string `json:"address"`
			Protocol string `json:"protocol"`
		}
		if err := json.Unmarshal(text, &j); err != nil {
			return bootstrap{}, fmt.Errorf("the shim's start printed %q: not the JSON bootstrap result: %w", text, err)
		}
		version, address, protocol = j.Version, j.Address, j.Protocol
	default:
		var r bootapi.BootstrapResult
		if err := proto.Unmarshal(out, &r); err != nil {
			return bootstrap{}, fmt.Errorf("the shim's start printed %q: neither an address, JSON nor a protobuf bootstrap result: %w", out, err)
		}
		version, address, protocol = int(r.GetVersion()), r.GetAddress(), r.GetProtocol()
	}
	if protocol != "" && protocol != "ttrpc" {
		return bootstrap{}, fmt.Errorf("the shim serves protocol %q at %s: only ttrpc is supported (use a shim built for containerd's ttrpc task API)", protocol, address)
	}
	if version != 2 && version != 3 {
		return bootstrap{}, fmt.Errorf("the shim serves task API version %d at %s: only 2 and 3 are supported", version, address)
	}
	path := strings.TrimPrefix(address, "unix://")
	if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \t\n\x00") {
		return bootstrap{}, fmt.Errorf("the shim's start printed address %q: not unix://<absolute path>", address)
	}
	return bootstrap{Socket: path, Version: version}, nil
}

// bootstrapRequired is in the error of a shim built on containerd 2.4+
// started without bootstrap parameters (pkg/shim/compat.go,
// errDeprecatedBootstrapAPI).
const bootstrapRequired = "shim was started through the deprecated API"

// bootstrapParams is what containerd 2.4 writes on a shim's stdin at
// start (core/runtime/v2/command.go); shims built on 2.4+ refuse to start
// without it, and Debian's runc shim 1.6 fails on it (it parses stdin as
// runtime options), so Start sends it only when asked (bootstrapRequired).
func bootstrapParams(id, namespace, grpcAddress, ttrpcAddress string, debug bool) ([]byte, error) {
	level := bootapi.LogLevel_LOG_LEVEL_INFO
	if debug {
		level = bootapi.LogLevel_LOG_LEVEL_DEBUG
	}
	b, err := proto.Marshal(&bootapi.BootstrapParams{
		InstanceID:             id,
		Namespace:              namespace,
		LogLevel:               level,
		ContainerdTtrpcAddress: ttrpcAddress,
		ContainerdGrpcAddress:  grpcAddress,
	})
	if err != nil {
		return nil, fmt.Errorf("encode the shim's bootstrap parameters: %w", err)
	}
	return b, nil
}
