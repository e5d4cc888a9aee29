package pmi

import (
	"errors"
	"slices"
	"testing"
)

// slurmPMIxEnv is a task environment as Slurm 22.05's mpi/pmix (PMIx 4.2)
// sets it, trimmed to what matters plus unrelated variables.
func slurmPMIxEnv() []string {
	const uri = "pmix-server.4242;tcp4://127.0.0.1:41235"
	return []string{
		"PATH=/usr/bin:/bin",
		"SLURM_NTASKS=2",
		"PMIX_NAMESPACE=slurm.pmix.17.0",
		"PMIX_RANK=1",
		"PMIX_SERVER_URI2=" + uri,
		"PMIX_SERVER_URI21=" + uri,
		"PMIX_SERVER_URI3=" + uri,
		"PMIX_SERVER_URI4=" + uri,
		"PMIX_SERVER_URI41=" + uri,
		"PMIX_SERVER_TMPDIR=/var/spool/slurmd/pmix.17.0/",
		"PMIX_SYSTEM_TMPDIR=/tmp",
		"PMIX_DSTORE_21_BASE_PATH=/var/spool/slurmd/pmix.17.0//pmix_dstor_ds21_4242",
		"PMIX_DSTORE_ESH_BASE_PATH=/var/spool/slurmd/pmix.17.0//pmix_dstor_ds12_4242",
		"PMIX_GDS_MODULE=ds21,ds12,hash",
		"PMIX_SECURITY_MODE=native",
		"PMIX_VERSION=4.2.2",
		"HOME=/home/u",
	}
}

func TestRewritePMIx(t *testing.T) {
	const guest = "tcp4://127.0.0.1:38001"
	gURI := "pmix-server.4242;" + guest
	tests := []struct {
		name    string
		env     []string
		g       PMIxGuest
		want    []string
		wantErr error
	}{
		{
			name: "slurm env, tmpdir rewritten",
			env:  slurmPMIxEnv(),
			g:    PMIxGuest{URI: guest, TmpDir: "/tmp/pmix"},
			want: []string{
				"PATH=/usr/bin:/bin", "SLURM_NTASKS=2",
				"PMIX_NAMESPACE=slurm.pmix.17.0", "PMIX_RANK=1",
				"PMIX_SERVER_URI2=" + gURI, "PMIX_SERVER_URI21=" + gURI, "PMIX_SERVER_URI3=" + gURI,
				"PMIX_SERVER_URI4=" + gURI, "PMIX_SERVER_URI41=" + gURI,
				"PMIX_SERVER_TMPDIR=/tmp/pmix", "PMIX_SYSTEM_TMPDIR=/tmp/pmix",
				"PMIX_GDS_MODULE=ds21,ds12,hash", "PMIX_SECURITY_MODE=native", "PMIX_VERSION=4.2.2",
				"HOME=/home/u", "PMIX_MCA_gds=hash",
			},
		},
		{
			name: "tmpdirs dropped without a guest dir; user gds overridden in place",
			env:  []string{"PMIX_MCA_gds=ds21", "PMIX_NAMESPACE=n", "PMIX_RANK=0", "PMIX_SERVER_URI41=srv.1;tcp4://127.0.0.1:1", "PMIX_SERVER_TMPDIR=/x", "PMIX_DSTORE_ESH_BASE_PATH=/y"},
			g:    PMIxGuest{URI: guest},
			want: []string{"PMIX_MCA_gds=hash", "PMIX_NAMESPACE=n", "PMIX_RANK=0", "PMIX_SERVER_URI41=srv.1;" + guest},
		},
		{
			name:    "URI without name prefix",
			env:     []string{"PMIX_SERVER_URI41=tcp4://127.0.0.1:1"},
			g:       PMIxGuest{URI: guest},
			wantErr: ErrBadEnv,
		},
		{
			name:    "guest URI not tcp",
			env:     slurmPMIxEnv(),
			g:       PMIxGuest{URI: "/tmp/sock"},
			wantErr: ErrBadEnv,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.env)
			got, err := RewritePMIx(tt.env, tt.g)
			if !slices.Equal(in, tt.env) {
				t.Fatalf("input modified")
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

func TestRewritePMI2(t *testing.T) {
	tests := []struct {
		name    string
		env     []string
		fd      int
		want    []string
		wantErr error
	}{
		{
			name: "fd renumbered, rest kept",
			env:  []string{"PMI_FD=13", "PMI_RANK=1", "PMI_SIZE=2", "PMI_JOBID=17.0", "X=y"},
			fd:   3,
			want: []string{"PMI_FD=3", "PMI_RANK=1", "PMI_SIZE=2", "PMI_JOBID=17.0", "X=y"},
		},
		{name: "no rank", env: []string{"PMI_FD=13", "PMI_SIZE=2"}, fd: 3, wantErr: ErrBadEnv},
		{name: "no size", env: []string{"PMI_FD=13", "PMI_RANK=0"}, fd: 3, wantErr: ErrBadEnv},
		{name: "size not a number", env: []string{"PMI_FD=13", "PMI_RANK=0", "PMI_SIZE=two"}, fd: 3, wantErr: ErrBadEnv},
		{name: "no PMI_FD", env: []string{"PMI_RANK=0", "PMI_SIZE=2"}, fd: 3, wantErr: ErrBadEnv},
		{name: "negative guest fd", env: []string{"PMI_FD=13", "PMI_RANK=0", "PMI_SIZE=2"}, fd: -1, wantErr: ErrBadEnv},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := RewritePMI2(tt.env, tt.fd)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDetectAndRequire(t *testing.T) {
	tests := []struct {
		name    string
		ntasks  int
		env     []string
		kind    Kind
		wantErr error
		check   func(t *testing.T, i Info)
	}{
		{name: "pmix", ntasks: 2, env: slurmPMIxEnv(), kind: KindPMIx, check: func(t *testing.T, i Info) {
			if i.ServerName != "pmix-server.4242" || i.Network != "tcp4" || i.Address != "127.0.0.1:41235" {
				t.Errorf("info = %+v", i)
			}
		}},
		{name: "pmix tcp6", ntasks: 2, env: []string{"PMIX_NAMESPACE=n", "PMIX_RANK=0", "PMIX_SERVER_URI41=s.1;tcp6://[::1]:555"}, kind: KindPMIx, check: func(t *testing.T, i Info) {
			if i.Network != "tcp6" || i.Address != "[::1]:555" {
				t.Errorf("info = %+v", i)
			}
		}},
		{name: "pmix only old URI var", ntasks: 2, env: []string{"PMIX_NAMESPACE=n", "PMIX_RANK=0", "PMIX_SERVER_URI2=s.1;tcp4://127.0.0.1:9"}, kind: KindPMIx},
		{name: "pmix usock cannot be relayed", ntasks: 2, env: []string{"PMIX_NAMESPACE=n", "PMIX_RANK=0", "PMIX_SERVER_URI41=s.1;usock:/tmp/x"}, kind: KindPMIx, wantErr: ErrBadEnv},
		{name: "pmix without namespace", ntasks: 2, env: []string{"PMIX_RANK=0", "PMIX_SERVER_URI41=s.1;tcp4://127.0.0.1:9"}, kind: KindPMIx, wantErr: ErrBadEnv},
		{name: "pmi2", ntasks: 4, env: []string{"PMI_FD=7", "PMI_RANK=3", "PMI_SIZE=4"}, kind: KindPMI2, check: func(t *testing.T, i Info) {
			if i.FD != 7 || i.Rank != 3 || i.Size != 4 {
				t.Errorf("info = %+v", i)
			}
		}},
		{name: "pmi2 without size", ntasks: 4, env: []string{"PMI_FD=7", "PMI_RANK=3"}, kind: KindPMI2, wantErr: ErrBadEnv},
		{name: "pmi2 bad fd", ntasks: 4, env: []string{"PMI_FD=x", "PMI_RANK=3", "PMI_SIZE=4"}, kind: KindPMI2, wantErr: ErrBadEnv},
		{name: "none, one task", ntasks: 1, env: []string{"PATH=/bin"}, kind: KindNone},
		{name: "none, two tasks", ntasks: 2, env: []string{"PATH=/bin"}, kind: KindNone, wantErr: ErrNoPMI},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info, err := Require(tt.ntasks, tt.env)
			if info.Kind != tt.kind {
				t.Errorf("kind = %s, want %s", info.Kind, tt.kind)
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, info)
			}
		})
	}
}

func TestStepTasks(t *testing.T) {
	for _, tt := range []struct {
		env  []string
		want int
	}{
		{[]string{"SLURM_NTASKS=4"}, 4},
		{[]string{"SLURM_NTASKS=4", "SLURM_STEP_NUM_TASKS=2"}, 2},
		{[]string{"SLURM_NTASKS=x"}, 0},
		{nil, 0},
	} {
		if got := StepTasks(tt.env); got != tt.want {
			t.Errorf("StepTasks(%q) = %d, want %d", tt.env, got, tt.want)
		}
	}
}
