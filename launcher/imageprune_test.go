package launcher

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/image"
)

// TestRunningStepImageSurvivesPrune: while a real microVM runs a step,
// its image is in use: a prune of every user's images with the smallest
// limits keeps it (and the guest still reads its root filesystem); once
// the step ended, the same prune removes it. Before the launcher held its
// disk (image.Hold), a prune removed the image of a running step.
func TestRunningStepImageSurvivesPrune(t *testing.T) {
	r := startRealStep(t, 448, nil)
	root := filepath.Join(r.l.Config.CacheDir, "images")
	tiny := image.PruneOptions{All: true, Limits: image.Limits{CacheBytes: 1, UserCacheBytes: 1}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := image.Prune(ctx, root, tiny)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 0 || len(res.InUse) != 1 {
		t.Fatalf("prune during the step: removed %+v, in use %+v; want the step's image kept as in use", res.Removed, res.InUse)
	}
	ch, out, errOut := r.exec(ctx, "cat", "/etc/os-release")
	if res := <-ch; res.err != nil || res.st.Code != 0 {
		t.Fatalf("read the root filesystem after the prune: %+v, %v; stderr %q", res.st, res.err, errOut.String())
	}
	waitOutput(t, out, "Launcher Test OS", 10*time.Second)

	r.stop()
	select {
	case <-r.ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the supervisor did not return within 30 s of its stop")
	}
	res, err = image.Prune(ctx, root, tiny)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 1 || len(res.InUse) != 0 {
		t.Errorf("prune after the step: removed %+v, in use %+v; want the image removed", res.Removed, res.InUse)
	}
}
