package launcher

import (
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// The behaviours of a deliberately broken build (package fault; only an
// smv_faults build switches them on), each a leak one poc check must see.

// readWrite is fault.ShareRW: every share of shares read-write, :ro or not.
func readWrite(shares []driver.Share) []driver.Share {
	out := make([]driver.Share, len(shares))
	for i, sh := range shares {
		sh.ReadOnly = false
		out[i] = sh
	}
	return out
}

// envLeakFile is where fault.LogEnv writes a step's task environment.
func envLeakFile(id state.StepID) string {
	return fmt.Sprintf("/tmp/slurm-microvm-env-%d.%d", id.Job, id.Step)
}

// logEnv is fault.LogEnv: each variable of env, as
// "slurm-microvm: env KEY=VALUE", on w (the task's stderr) and appended
// to envLeakFile (mode 0644, readable by every user of the node).
func logEnv(id state.StepID, env []string, w io.Writer) {
	var b strings.Builder
	for _, kv := range env {
		fmt.Fprintf(&b, "slurm-microvm: env %s\n", kv)
	}
	if w != nil {
		_, _ = io.WriteString(w, b.String())
	}
	f, err := os.OpenFile(envLeakFile(id), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_ = f.Chmod(0o644) // past the umask
	_, _ = f.WriteString(b.String())
}
