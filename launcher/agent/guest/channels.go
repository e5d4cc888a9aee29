package guest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slurm-microvm/slurm-microvm/launcher/agent/api"
)

// A channel is one byte pipe between a host task and its process here: the
// guest end of an fd forward (PMI2) or one accepted connection of a listener
// forward (PMIx).
type channel struct {
	conn   net.Conn
	readMu sync.Mutex
	// hostClosed: the host sent ChannelClose; guestEOF: the host read
	// the process's EOF. With both, the channel is done and forgotten.
	hostClosed, guestEOF bool
}

// finish records one end of a channel and forgets the channel once both
// ends are done.
func (s *Service) finish(id string, host bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.channels[id]
	if !ok {
		return
	}
	if host {
		c.hostClosed = true
	} else {
		c.guestEOF = true
	}
	if c.hostClosed && c.guestEOF {
		c.conn.Close()
		delete(s.channels, id)
	}
}

// forwards is what CreateProcess set up for a process's Forward list.
type forwards struct {
	listeners map[uint32]net.Listener
	channels  []string
	child     map[int]*os.File // fd number in the process -> its end
}

// halfCloser is implemented by *net.TCPConn and *net.UnixConn.
type halfCloser interface{ CloseWrite() error }

// setupForwards creates the socketpairs and listeners of req and rewrites
// env for the listeners' actual addresses. On error everything made is
// closed.
func (s *Service) setupForwards(req []*api.Forward, env []string) (*forwards, []*api.ForwardInfo, []string, error) {
	f := &forwards{listeners: map[uint32]net.Listener{}, child: map[int]*os.File{}}
	infos := make([]*api.ForwardInfo, len(req))
	fail := func(err error) (*forwards, []*api.ForwardInfo, []string, error) {
		s.closeForwards(f)
		return nil, nil, nil, err
	}
	for i, fw := range req {
		switch {
		case fw.Fd > 2 && fw.Listen == "":
			if fw.Fd > 1024 {
				return fail(status.Errorf(codes.InvalidArgument, "forward %d: fd %d above 1024", i, fw.Fd))
			}
			if _, dup := f.child[int(fw.Fd)]; dup {
				return fail(status.Errorf(codes.InvalidArgument, "forward %d: fd %d given twice", i, fw.Fd))
			}
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return fail(status.Errorf(codes.Internal, "forward %d: socketpair: %v", i, err))
			}
			ours := os.NewFile(uintptr(fds[0]), "channel")
			conn, err := net.FileConn(ours)
			ours.Close()
			if err != nil {
				unix.Close(fds[1])
				return fail(status.Errorf(codes.Internal, "forward %d: %v", i, err))
			}
			f.child[int(fw.Fd)] = os.NewFile(uintptr(fds[1]), "channel-child")
			id := s.addChannel(conn)
			f.channels = append(f.channels, id)
			infos[i] = &api.ForwardInfo{Channel: id}
		case fw.Listen != "" && fw.Fd == 0:
			host, _, err := net.SplitHostPort(fw.Listen)
			if err != nil || !net.ParseIP(host).IsLoopback() {
				return fail(status.Errorf(codes.InvalidArgument, "forward %d: listen address %q must be a loopback host:port", i, fw.Listen))
			}
			l, err := net.Listen("tcp", fw.Listen)
			if err != nil {
				return fail(status.Errorf(codes.Internal, "forward %d: listen on %s: %v", i, fw.Listen, err))
			}
			f.listeners[uint32(i)] = l
			addr := l.Addr().String()
			infos[i] = &api.ForwardInfo{Address: addr}
			if fw.Replace != "" {
				env = replaceInValues(env, fw.Replace, addr)
			}
		default:
			return fail(status.Errorf(codes.InvalidArgument, "forward %d: give either an fd above 2 or a listen address", i))
		}
	}
	return f, infos, env, nil
}

// replaceInValues replaces old by new in the values (not the names) of a
// KEY=VALUE list.
func replaceInValues(env []string, old, new string) []string {
	out := make([]string, len(env))
	for i, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			out[i] = kv
			continue
		}
		out[i] = k + "=" + strings.ReplaceAll(v, old, new)
	}
	return out
}

// childFiles extends the process's stdio with its forwarded fds (gaps are
// closed in the child).
func (f *forwards) childFiles(stdio []*os.File) []*os.File {
	files := append([]*os.File(nil), stdio...)
	for fd, file := range f.child {
		for len(files) <= fd {
			files = append(files, nil)
		}
		files[fd] = file
	}
	return files
}

func (f *forwards) closeChildEnds() {
	for _, file := range f.child {
		file.Close()
	}
}

func (s *Service) closeForwards(f *forwards) {
	if f == nil {
		return
	}
	f.closeChildEnds()
	for _, l := range f.listeners {
		l.Close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range f.channels {
		if c, ok := s.channels[id]; ok {
			c.conn.Close()
			delete(s.channels, id)
		}
	}
}

func (s *Service) addChannel(conn net.Conn) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextChan++
	id := "c" + strconv.Itoa(s.nextChan)
	s.channels[id] = &channel{conn: conn}
	return id
}

func (s *Service) channel(id string) (*channel, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.channels[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no channel %q", id)
	}
	return c, nil
}

func (s *Service) AcceptChannel(ctx context.Context, req *api.AcceptChannelRequest) (*api.Channel, error) {
	p, err := s.proc(req.Id)
	if err != nil {
		return nil, err
	}
	l, ok := p.fw.listeners[req.Forward]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "process %s has no listener forward %d", req.Id, req.Forward)
	}
	tl := l.(*net.TCPListener)
	for {
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		_ = tl.SetDeadline(time.Now().Add(pollInterval))
		conn, err := tl.Accept()
		if err == nil {
			id := s.addChannel(conn)
			s.mu.Lock()
			p.fw.channels = append(p.fw.channels, id)
			s.mu.Unlock()
			return &api.Channel{Id: id}, nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, status.Errorf(codes.Unavailable, "accept on %s: %v", l.Addr(), err)
		}
		select {
		case <-p.exited:
			return nil, status.Errorf(codes.Unavailable, "process %s has exited", req.Id)
		default:
		}
	}
}

func (s *Service) ChannelRead(ctx context.Context, req *api.ChannelReadRequest) (*api.ReadOutputResponse, error) {
	c, err := s.channel(req.Id)
	if err != nil {
		return nil, err
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	resp, err := readPolled(ctx, c.conn, req.Len, nil)
	if err == nil && resp.Eof {
		s.finish(req.Id, false)
	}
	return resp, err
}

func (s *Service) ChannelWrite(ctx context.Context, req *api.ChannelWriteRequest) (*api.WriteStdinResponse, error) {
	c, err := s.channel(req.Id)
	if err != nil {
		return nil, err
	}
	if len(req.Data) > maxRead {
		return nil, status.Errorf(codes.InvalidArgument, "channel chunk of %d bytes exceeds %d", len(req.Data), maxRead)
	}
	n, err := c.conn.Write(req.Data)
	if err != nil {
		return &api.WriteStdinResponse{Len: uint32(n)}, status.Errorf(codes.Unavailable, "write channel %s: %v", req.Id, err)
	}
	return &api.WriteStdinResponse{Len: uint32(n)}, nil
}

// ChannelClose ends the host's side of a channel: the process reads EOF.
func (s *Service) ChannelClose(ctx context.Context, req *api.ChannelCloseRequest) (*api.Empty, error) {
	c, err := s.channel(req.Id)
	if err != nil {
		return nil, err
	}
	if hc, ok := c.conn.(halfCloser); ok {
		_ = hc.CloseWrite()
	} else {
		_ = c.conn.Close()
	}
	s.finish(req.Id, true)
	return &api.Empty{}, nil
}

// String helps logs.
func (c *channel) String() string { return fmt.Sprintf("channel %s", c.conn.LocalAddr()) }
