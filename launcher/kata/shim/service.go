package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/slurm-microvm/slurm-microvm/launcher/kata/taskapi"
)

// processSpecType is the type URL containerd registers for an OCI
// runtime-spec Process (JSON-encoded in the Any); shims decode the
// ExecProcessRequest's spec with it (containerd typeurl, pkg/oci).
const processSpecType = "types.containerd.io/opencontainers/runtime-spec/1/Process"

// client speaks the shim's task API over one ttrpc connection. The
// messages of containerd.task.v2.Task and containerd.task.v3.Task are the
// same on the wire (shim.proto differs only in its package line;
// TestTaskAPIVersionsAgree checks it), so one client sends the v3 Go
// messages to the service name of the version the shim announced.
type client struct {
	c       *ttrpc.Client
	service string // "containerd.task.v2.Task" or "containerd.task.v3.Task"
	id      string
}

func newClient(c *ttrpc.Client, version int, id string) *client {
	return &client{c: c, service: fmt.Sprintf("containerd.task.v%d.Task", version), id: id}
}

func (c *client) call(ctx context.Context, method string, req, resp proto.Message) error {
	return c.c.Call(ctx, c.service, method, req, resp)
}

func (c *client) connect(ctx context.Context) (*task.ConnectResponse, error) {
	var r task.ConnectResponse
	if err := c.call(ctx, "Connect", &task.ConnectRequest{ID: c.id}, &r); err != nil {
		return nil, fmt.Errorf("connect to the shim of %s: %w", c.id, err)
	}
	return &r, nil
}

func (c *client) state(ctx context.Context, execID string) (*task.StateResponse, error) {
	var r task.StateResponse
	if err := c.call(ctx, "State", &task.StateRequest{ID: c.id, ExecID: execID}, &r); err != nil {
		return nil, fmt.Errorf("state of %s: %w", name(c.id, execID), err)
	}
	return &r, nil
}

// service is the taskapi.Service of one Shim.
type service struct {
	s *Shim
	c *client
}

var _ taskapi.Service = (*service)(nil)

func name(id, execID string) string {
	if execID == "" {
		return "container " + id
	}
	return "exec " + execID + " of container " + id
}

func (s *service) Create(ctx context.Context, o taskapi.CreateOptions) (uint32, error) {
	var r task.CreateTaskResponse
	err := s.c.call(ctx, "Create", &task.CreateTaskRequest{
		ID:       s.c.id,
		Bundle:   o.Bundle,
		Terminal: o.IO.Terminal,
		Stdin:    o.IO.Stdin,
		Stdout:   o.IO.Stdout,
		Stderr:   o.IO.Stderr,
	}, &r)
	if err != nil {
		return 0, fmt.Errorf("create container %s from bundle %s: %w", s.c.id, o.Bundle, err)
	}
	return r.GetPid(), nil
}

func (s *service) Start(ctx context.Context, execID string) (uint32, error) {
	var r task.StartResponse
	if err := s.c.call(ctx, "Start", &task.StartRequest{ID: s.c.id, ExecID: execID}, &r); err != nil {
		return 0, fmt.Errorf("start %s: %w", name(s.c.id, execID), err)
	}
	return r.GetPid(), nil
}

func (s *service) Exec(ctx context.Context, execID string, p *specs.Process, io taskapi.IO) error {
	if execID == "" {
		return fmt.Errorf("exec into container %s: the exec id is empty (it names the process in Start, Wait, Kill and Delete)", s.c.id)
	}
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode the process of %s: %w", name(s.c.id, execID), err)
	}
	err = s.c.call(ctx, "Exec", &task.ExecProcessRequest{
		ID:       s.c.id,
		ExecID:   execID,
		Terminal: io.Terminal,
		Stdin:    io.Stdin,
		Stdout:   io.Stdout,
		Stderr:   io.Stderr,
		Spec:     &anypb.Any{TypeUrl: processSpecType, Value: b},
	}, &emptypb.Empty{})
	if err != nil {
		return fmt.Errorf("exec %s: %w", name(s.c.id, execID), err)
	}
	return nil
}

func exitOf(status uint32, at *timestamppb.Timestamp) taskapi.Exit {
	e := taskapi.Exit{Status: status}
	if at != nil {
		e.At = at.AsTime()
	}
	return e
}

func (s *service) Wait(ctx context.Context, execID string) (taskapi.Exit, error) {
	var r task.WaitResponse
	if err := s.c.call(ctx, "Wait", &task.WaitRequest{ID: s.c.id, ExecID: execID}, &r); err != nil {
		return taskapi.Exit{}, fmt.Errorf("wait for %s: %w", name(s.c.id, execID), err)
	}
	return exitOf(r.GetExitStatus(), r.GetExitedAt()), nil
}

func (s *service) Kill(ctx context.Context, execID string, sig syscall.Signal, all bool) error {
	err := s.c.call(ctx, "Kill", &task.KillRequest{ID: s.c.id, ExecID: execID, Signal: uint32(sig), All: all}, &emptypb.Empty{})
	if err != nil {
		return fmt.Errorf("send %v to %s: %w", sig, name(s.c.id, execID), err)
	}
	return nil
}

func (s *service) ResizePty(ctx context.Context, execID string, width, height uint32) error {
	err := s.c.call(ctx, "ResizePty", &task.ResizePtyRequest{ID: s.c.id, ExecID: execID, Width: width, Height: height}, &emptypb.Empty{})
	if err != nil {
		return fmt.Errorf("resize the terminal of %s to %dx%d: %w", name(s.c.id, execID), width, height, err)
	}
	return nil
}

func (s *service) CloseIO(ctx context.Context, execID string) error {
	err := s.c.call(ctx, "CloseIO", &task.CloseIORequest{ID: s.c.id, ExecID: execID, Stdin: true}, &emptypb.Empty{})
	if err != nil {
		return fmt.Errorf("close the stdin of %s: %w", name(s.c.id, execID), err)
	}
	return nil
}

func (s *service) Delete(ctx context.Context, execID string) (taskapi.Exit, error) {
	var r task.DeleteResponse
	if err := s.c.call(ctx, "Delete", &task.DeleteRequest{ID: s.c.id, ExecID: execID}, &r); err != nil {
		return taskapi.Exit{}, fmt.Errorf("delete %s: %w", name(s.c.id, execID), err)
	}
	return exitOf(r.GetExitStatus(), r.GetExitedAt()), nil
}

func (s *service) Ping(ctx context.Context) error {
	_, err := s.c.connect(ctx)
	return err
}

// Shutdown asks the shim to exit (the task API's Shutdown: it exits once
// its container is deleted), waits until ctx is done or shutdownWait has
// passed for it to exit and be reaped, then stops the events server and the
// log drain and removes the sockets. It returns an error when the shim is
// still running then (its container not deleted: use Cleanup).
func (s *service) Shutdown(ctx context.Context) error {
	return s.s.shutdown(ctx)
}

// shutdownWait bounds how long Shutdown waits for the shim to exit.
const shutdownWait = 10 * time.Second

// closedErr reports whether err says the connection ended, as it does when
// the shim exits while answering (Shutdown).
func closedErr(err error) bool {
	return errors.Is(err, ttrpc.ErrClosed) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || status.Code(err) == codes.Unavailable
}

// notFound reports whether the shim answered that the container or
// process does not exist.
func notFound(err error) bool {
	return status.Code(err) == codes.NotFound
}
