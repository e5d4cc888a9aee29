package shim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	eventsapi "github.com/containerd/containerd/api/services/ttrpc/events/v1"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// events is the ttrpc server a shim publishes its task events to
// (containerd.services.events.ttrpc.v1.Events/Forward), at the socket
// named by the shim's TTRPC_ADDRESS. The driver learns exits through Wait,
// so the events are only logged (debug). Without a server there, a shim
// built on containerd 1.6 retries each publish and its teardown stalls
// about 10 s (measured with Debian's containerd-shim-runc-v2 1.6.20).
type events struct {
	srv  *ttrpc.Server
	path string
	done chan struct{}
}

type forwarder struct{ log *slog.Logger }

func (f forwarder) Forward(ctx context.Context, r *eventsapi.ForwardRequest) (*emptypb.Empty, error) {
	if e := r.GetEnvelope(); e != nil {
		f.log.DebugContext(ctx, "shim event", "topic", e.GetTopic(), "namespace", e.GetNamespace(), "type", e.GetEvent().GetTypeUrl())
	}
	return &emptypb.Empty{}, nil
}

// serveEvents listens at path (removing a stale socket there) and serves
// the events API until close. A socket at path that answers means another
// Start (or a launcher) serves this state directory: it returns an error.
func serveEvents(path string, log *slog.Logger) (*events, error) {
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("the shim events socket %s is served: the state directory %s belongs to a running shim (each sandbox needs its own)", path, filepath.Dir(path))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove the stale events socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen for the shim's events at %s: %w", path, err)
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("create the events ttrpc server: %w", err)
	}
	eventsapi.RegisterTTRPCEventsService(srv, forwarder{log})
	e := &events{srv: srv, path: path, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		if err := srv.Serve(context.Background(), l); err != nil && !errors.Is(err, ttrpc.ErrServerClosed) {
			log.Warn("the shim events server stopped", "socket", path, "err", err)
		}
	}()
	return e, nil
}

// close stops the server and removes its socket.
func (e *events) close() {
	e.srv.Close()
	<-e.done
	_ = os.Remove(e.path)
}
