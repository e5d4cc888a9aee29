// Package transport carries agent connections between the host and the guest.
//
// The control channel of the built-in QEMU driver is one virtio-serial port: a
// single byte stream with no notion of connections. hashicorp/yamux turns it
// into many independent streams with their own flow control, and each stream
// carries one ttrpc connection, so any number of exec clients, the supervisor
// and its health checks share the port without hand-rolled framing. The host
// side is the yamux client (it opens streams); the guest agent is the server.
//
// Design decision: yamux over virtio-serial rather than one ttrpc connection
// over the raw port. The raw port has no reconnect semantics: a second client
// (one `exec` per task) would interleave bytes with the first. Kata's agent
// used the same construction (yamux over a serial port) before vsock.
package transport

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"
)

// DefaultOpenTimeout is NewHostSession's stream-open bound when it is given
// none.
const DefaultOpenTimeout = 2 * time.Minute

func yamuxConfig(openTimeout time.Duration) *yamux.Config {
	c := yamux.DefaultConfig()
	// A guest under TCG can stall for seconds; liveness is the VMM's process
	// state, not a keepalive.
	c.EnableKeepAlive = false
	c.ConnectionWriteTimeout = 2 * time.Minute
	c.StreamOpenTimeout = openTimeout
	c.LogOutput = io.Discard
	return c
}

// Session is the host end of a multiplexed control channel.
type Session struct {
	s *yamux.Session
}

// NewHostSession starts the host (client) end of the multiplexer on conn, the
// host side of the virtio-serial port. It takes ownership of conn.
// openTimeout bounds how long a stream waits for the agent to accept it
// (yamux's StreamOpenTimeout, past which yamux closes the whole session);
// the first stream is opened as the VMM starts and waits for the whole
// boot, so the caller gives at least its boot timeout (a guest that took
// longer than a fixed 2 minutes to boot lost its session: nested TCG,
// test/cgroupv2). 0 means DefaultOpenTimeout.
func NewHostSession(conn io.ReadWriteCloser, openTimeout time.Duration) (*Session, error) {
	if openTimeout <= 0 {
		openTimeout = DefaultOpenTimeout
	}
	s, err := yamux.Client(conn, yamuxConfig(openTimeout))
	if err != nil {
		return nil, fmt.Errorf("start yamux client: %w", err)
	}
	return &Session{s: s}, nil
}

// Dial opens a new stream to the agent. It fails when ctx ends first.
func (s *Session) Dial(ctx context.Context) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := s.s.OpenStream()
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("open agent stream: %w", r.err)
		}
		return r.c, nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, fmt.Errorf("open agent stream: %w", ctx.Err())
	}
}

// Closed is closed when the session ends (guest gone or Close called).
func (s *Session) Closed() <-chan struct{} { return s.s.CloseChan() }

// Close ends the session and every stream on it.
func (s *Session) Close() error { return s.s.Close() }

// Listen starts the guest (server) end of the multiplexer on conn, the guest
// side of the virtio-serial port. Each accepted net.Conn is one stream.
func Listen(conn io.ReadWriteCloser) (net.Listener, error) {
	s, err := yamux.Server(conn, yamuxConfig(DefaultOpenTimeout))
	if err != nil {
		return nil, fmt.Errorf("start yamux server: %w", err)
	}
	return s, nil
}
