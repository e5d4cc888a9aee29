package launcher

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"unicode/utf8"

	"github.com/slurm-microvm/slurm-microvm/launcher/config"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// Spec is one step as the SPANK plugin hands it over (spec.json).
type Spec struct {
	ID     state.StepID `json:"id"`
	UID    uint32       `json:"uid"`
	GID    uint32       `json:"gid"`
	Groups []uint32     `json:"groups"`
	User   string       `json:"user"`
	// Image is the --microvm value as the user typed it.
	Image string `json:"image"`
	// Cores is S_STEP_ALLOC_CORES, a list such as "0-1,4".
	Cores string `json:"cores"`
	// MemMiB is S_STEP_ALLOC_MEM (Slurm's MB are MiB); 0: no limit.
	MemMiB uint64 `json:"mem_mib"`
	// MemPerNodeMiB and MemPerCPUMiB are the job's own --mem and
	// --mem-per-cpu (SLURM_MEM_PER_NODE, SLURM_MEM_PER_CPU; 0: not given),
	// which size the guest where Slurm allocates no memory (GuestMemoryMiB).
	MemPerNodeMiB uint64 `json:"mem_per_node_mib,omitempty"`
	MemPerCPUMiB  uint64 `json:"mem_per_cpu_mib,omitempty"`
	// MemLimitMiB is the memory limit the kernel enforces on the step
	// (cgroup.MemoryLimit: memory.max on v2, memory.limit_in_bytes on v1;
	// 0: none), read by the supervisor once it sits in the step's cgroup
	// and by each task; never in the spec file: prepare runs elsewhere.
	MemLimitMiB uint64 `json:"-"`
	// GPUs is SLURM_STEP_GPUS: the node's global GPU indices.
	GPUs string `json:"gpus,omitempty"`
	// CPUs, when set, is the vCPU count (`run --cpus`); else the step's
	// cpuset decides, then Cores.
	CPUs int `json:"cpus,omitempty"`
	// LocalTasks is S_JOB_LOCAL_TASK_COUNT.
	LocalTasks int    `json:"local_tasks"`
	Hostname   string `json:"hostname"`
	Debug      bool   `json:"debug,omitempty"`
	// Mounts, Workdir and MPI carry --microvm-mounts, --microvm-workdir
	// and --microvm-mpi.
	Mounts string `json:"mounts,omitempty"`
	// MountsOrigin names where Mounts came from in errors: the option
	// (--microvm-mounts) or its environment fallback (SLURM_MICROVM_MOUNTS).
	MountsOrigin string `json:"mounts_origin,omitempty"`
	Workdir      string `json:"workdir,omitempty"`
	MPI          string `json:"mpi,omitempty"`
	// Nodes is SLURM_STEP_NODELIST, the step's nodes (a Slurm hostlist);
	// "" for a step with no Slurm node list (`slurm-microvm run`).
	Nodes string `json:"nodes,omitempty"`
	// NNodes and NodeIndex are slurmstepd's S_JOB_NNODES and S_JOB_NODEID
	// (NNodes 0: unknown): Nodes comes from the job's environment, which
	// a modified srun controls, so the network checks it against them.
	NNodes    int `json:"nnodes,omitempty"`
	NodeIndex int `json:"node_index,omitempty"`
	// Network is --microvm-network as the user gave it; "": the site's
	// default ([network] mode).
	Network string `json:"network,omitempty"`
	// SlurmConf is slurmstepd's SLURM_CONF ("" : Slurm's default), used
	// when the launcher asks slurmctld for the step's node addresses.
	SlurmConf string `json:"slurm_conf,omitempty"`
}

// Dir is the state directory of the spec's step under the configured root.
func (s *Spec) Dir(c *config.Config) state.Dir {
	return state.Dir{Root: c.RuntimeDir, ID: s.ID}
}

// MarshalJSON writes the spec as its fields say, and the user's paths
// (Image, Mounts, Workdir) that are not UTF-8 also byte-exact under "raw"
// (base64): encoding/json replaces such bytes by U+FFFD, and Linux paths
// may hold any byte but NUL.
func (s Spec) MarshalJSON() ([]byte, error) {
	type plain Spec
	out := struct {
		plain
		Raw map[string][]byte `json:"raw,omitempty"`
	}{plain: plain(s)}
	for name, f := range (&s).rawFields() {
		if !utf8.ValidString(*f) {
			if out.Raw == nil {
				out.Raw = map[string][]byte{}
			}
			out.Raw[name] = []byte(*f)
		}
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (s *Spec) UnmarshalJSON(b []byte) error {
	type plain Spec
	in := struct {
		*plain
		Raw map[string][]byte `json:"raw"`
	}{plain: (*plain)(s)}
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	fields := s.rawFields()
	for name, v := range in.Raw {
		if f, ok := fields[name]; ok {
			*f = string(v)
		}
	}
	return nil
}

// rawFields are the spec's fields that carry the user's bytes, by JSON name.
func (s *Spec) rawFields() map[string]*string {
	return map[string]*string{"image": &s.Image, "mounts": &s.Mounts, "workdir": &s.Workdir}
}

func writeSpec(d state.Dir, s *Spec) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return state.WriteFileAtomic(d.File(state.SpecFile), append(b, '\n'), 0o644)
}

// ReadSpec reads the spec.json of a step directory.
func ReadSpec(dir string) (*Spec, error) {
	b, err := os.ReadFile(filepath.Join(dir, state.SpecFile))
	if err != nil {
		return nil, fmt.Errorf("read step spec: %w", err)
	}
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(dir, state.SpecFile), err)
	}
	return &s, nil
}
