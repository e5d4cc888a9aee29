package transport

import (
	"context"
	"net"
	"testing"
	"time"
)

// A stream waits for an agent that starts serving late as long as the
// session's open timeout allows, and no longer: the bound is the caller's
// (the boot timeout), not a constant.
func TestOpenTimeout(t *testing.T) {
	for _, tt := range []struct {
		name        string
		openTimeout time.Duration
		agentAfter  time.Duration
		ok          bool
	}{
		{"agent within the timeout", 3 * time.Second, 700 * time.Millisecond, true},
		{"agent after the timeout", 300 * time.Millisecond, 1500 * time.Millisecond, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			hostEnd, guestEnd := net.Pipe()
			defer guestEnd.Close()
			sess, err := NewHostSession(hostEnd, tt.openTimeout)
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			served := make(chan error, 1)
			go func() {
				time.Sleep(tt.agentAfter)
				l, err := Listen(guestEnd)
				if err != nil {
					served <- err
					return
				}
				c, err := l.Accept()
				if err == nil {
					_, err = c.Write([]byte("x"))
				}
				served <- err
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := sess.Dial(ctx)
			if err != nil {
				if tt.ok {
					t.Fatal(err)
				}
				return // the session gave up on the stream: as wanted
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, rerr := c.Read(make([]byte, 1))
			if tt.ok && rerr != nil {
				t.Fatalf("read from an agent that served after %s (open timeout %s): %v", tt.agentAfter, tt.openTimeout, rerr)
			}
			if !tt.ok {
				select {
				case <-sess.Closed():
				case <-time.After(5 * time.Second):
					t.Fatalf("session still open %s after an agent that did not accept within %s", 5*time.Second, tt.openTimeout)
				}
			}
		})
	}
}
