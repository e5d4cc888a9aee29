package guest

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/status"
)

// NewServer returns a ttrpc server with s registered and the interceptor
// that keeps every error message valid UTF-8 (validErrors).
func (s *Service) NewServer() (*ttrpc.Server, error) {
	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(validErrors))
	if err != nil {
		return nil, fmt.Errorf("create ttrpc server: %w", err)
	}
	s.Register(srv)
	return srv, nil
}

// validErrors escapes the bytes that are not UTF-8 in an error's message
// as \xNN: messages name paths and arguments, which may hold any byte, and
// a status whose message is not UTF-8 cannot be marshalled (the caller
// would get a protocol error that names nothing).
func validErrors(ctx context.Context, u ttrpc.Unmarshaler, _ *ttrpc.UnaryServerInfo, m ttrpc.Method) (any, error) {
	resp, err := m(ctx, u)
	if err == nil {
		return resp, nil
	}
	st := status.Convert(err)
	if utf8.ValidString(st.Message()) {
		return resp, err
	}
	return resp, status.Error(st.Code(), EscapeInvalid(st.Message()))
}

// EscapeInvalid returns s with every byte that is not part of a valid UTF-8
// sequence written as \xNN, the rest unchanged.
func EscapeInvalid(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && n <= 1 {
			fmt.Fprintf(&b, `\x%02x`, s[0])
			s = s[1:]
			continue
		}
		b.WriteString(s[:n])
		s = s[n:]
	}
	return b.String()
}
