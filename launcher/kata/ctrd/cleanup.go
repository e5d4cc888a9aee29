package ctrd

import (
	"context"
	"fmt"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
)

// Cleanup deletes what is left of container o.ID in the daemon after the
// process that drove it ended without deleting it (a launcher crash):
// its task (SIGKILL to every process, wait for the init to end, delete;
// containerd then shuts the shim, and for Kata the VM, down) and then
// the container. `stop` and `gc` call it from another process than the
// one that created the container. Idempotent: a container or task that
// is not there is no error. Errors: the daemon not answering, or a
// delete it refused (containerd's text kept).
func Cleanup(ctx context.Context, o Options) error {
	s, err := Connect(ctx, o)
	if err != nil {
		return fmt.Errorf("clean up container %s: %w", o.ID, err)
	}
	defer s.Shutdown(context.WithoutCancel(ctx))
	c, err := s.client.LoadContainer(ctx, o.ID)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("clean up container %s: load it: %w", o.ID, err)
	}
	t, err := c.Task(ctx, nil)
	switch {
	case errdefs.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("clean up container %s: load its task: %w", o.ID, err)
	default:
		// WithProcessKill: wait, SIGKILL all, until the init ended.
		st, err := t.Delete(ctx, containerd.WithProcessKill)
		if err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("clean up container %s: kill and delete its task: %w", o.ID, err)
		}
		if st != nil {
			code, _, _ := st.Result()
			s.log.Info("cleanup: deleted the task", "status", code)
		}
	}
	if err := c.Delete(ctx); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("clean up container %s: delete it: %w", o.ID, err)
	}
	s.log.Info("cleanup: deleted the container")
	return nil
}
