package gpu_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/slurm-microvm/slurm-microvm/launcher/gpu"
)

func TestParseGresConf(t *testing.T) {
	type dev struct {
		index     int
		file, typ string
		line      int
	}
	for _, tc := range []struct {
		name    string
		conf    string
		node    string
		want    []dev
		auto    string
		notes   []string
		wantErr string
	}{
		{name: "nvidia range", node: "n1", conf: "Name=gpu Type=h200 File=/dev/nvidia[0-3]\n",
			want: []dev{{0, "/dev/nvidia0", "h200", 1}, {1, "/dev/nvidia1", "h200", 1}, {2, "/dev/nvidia2", "h200", 1}, {3, "/dev/nvidia3", "h200", 1}}},
		{name: "list with ranges", node: "n1", conf: "Name=gpu File=/dev/nvidia[0,2-3]\n",
			want: []dev{{0, "/dev/nvidia0", "", 1}, {1, "/dev/nvidia2", "", 1}, {2, "/dev/nvidia3", "", 1}}},
		{name: "file order is index order", node: "n1", conf: "Name=gpu File=/dev/nvidia3\nName=gpu File=/dev/nvidia[0-1]\n",
			want: []dev{{0, "/dev/nvidia3", "", 1}, {1, "/dev/nvidia0", "", 2}, {2, "/dev/nvidia1", "", 2}}},
		{name: "NodeName filters, comments, continuation, case", node: "gpu02", conf: `# GPU nodes
AutoDetect=off   # explicit files below
NodeName=gpu[01-04] Name=gpu Type=h200 \
    File=/dev/vfio/[30-31]  # two GPUs per node
NodeName=big1 Name=gpu File=/dev/nvidia[0-7]
nodename=gpu02 name=gpu type=l4 file=/dev/vfio/40 count=1
Name=mps Count=200
`,
			auto: "off",
			want: []dev{{0, "/dev/vfio/30", "h200", 3}, {1, "/dev/vfio/31", "h200", 3}, {2, "/dev/vfio/40", "l4", 6}}},
		{name: "other node", node: "big2", conf: "NodeName=big1 Name=gpu File=/dev/nvidia[0-7]\n", want: nil},
		{name: "AutoDetect is reported", node: "n1", conf: "AutoDetect=nvml\nName=gpu File=/dev/nvidia[0-1]\n",
			auto: "nvml", notes: []string{"AutoDetect=nvml is ignored here"},
			want: []dev{{0, "/dev/nvidia0", "", 2}, {1, "/dev/nvidia1", "", 2}}},
		{name: "node AutoDetect overrides global", node: "n1", conf: "AutoDetect=nvml\nNodeName=n1 AutoDetect=off\nName=gpu File=/dev/nvidia0\n",
			auto: "off", want: []dev{{0, "/dev/nvidia0", "", 3}}},
		{name: "MultipleFiles is one GPU", node: "n1", conf: "Name=gpu MultipleFiles=/dev/nvidia-caps/nvidia-cap[21-22],/dev/nvidia2\nName=gpu File=/dev/nvidia3\n",
			want: []dev{{0, "/dev/nvidia2", "", 1}, {1, "/dev/nvidia3", "", 2}}},
		{name: "escaped #", node: "n1", conf: "Name=gpu File=/dev/nvidia0 Flags=nvidia_gpu_env \\# not a comment\n",
			wantErr: `"#" is not Key=Value`},
		{name: "unknown key noted", node: "n1", conf: "Name=gpu File=/dev/nvidia0 Frobnicate=yes\n",
			notes: []string{"unknown key frobnicate ignored"}, want: []dev{{0, "/dev/nvidia0", "", 1}}},
		{name: "Count mismatch", node: "n1", conf: "Name=gpu Count=4 File=/dev/nvidia[0-1]\n", wantErr: ":1: Count=4 does not match the 2 file(s)"},
		{name: "gpu without File", node: "n1", conf: "Name=gpu Count=4\n", wantErr: ":1: Name=gpu without File="},
		{name: "duplicate file", node: "n1", conf: "Name=gpu File=/dev/nvidia0\nName=gpu File=/dev/nvidia[0-1]\n", wantErr: ":2: device file /dev/nvidia0 already listed at line 1"},
		{name: "bad range", node: "n1", conf: "\n\nName=gpu File=/dev/nvidia[2-0]\n", wantErr: ":3: File: hostlist"},
		{name: "not key=value", node: "n1", conf: "Name=gpu /dev/nvidia0\n", wantErr: `:1: "/dev/nvidia0" is not Key=Value`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := gpu.ParseGresConf("gres.conf", []byte(tc.conf), tc.node)
			if tc.wantErr != "" {
				if !errors.Is(err, gpu.ErrGresConf) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want ErrGresConf saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []dev
			for _, d := range c.Devices {
				got = append(got, dev{d.Index, d.File, d.Type, d.Line})
			}
			if len(got) != len(tc.want) {
				t.Fatalf("devices %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("device %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
			if c.AutoDetect != tc.auto {
				t.Errorf("AutoDetect %q, want %q", c.AutoDetect, tc.auto)
			}
			for _, n := range tc.notes {
				if !strings.Contains(strings.Join(c.Notes, "\n"), n) {
					t.Errorf("notes %q lack %q", c.Notes, n)
				}
			}
		})
	}
}

func TestLoadGresConfInclude(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "gpus.conf"), []byte("Name=gpu File=/dev/nvidia[2-3]\n"), 0o644)
	main := filepath.Join(dir, "gres.conf")
	os.WriteFile(main, []byte("Name=gpu File=/dev/nvidia[0-1]\nInclude gpus.conf\n"), 0o644)
	c, err := gpu.LoadGresConf(main, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Devices) != 4 || c.Devices[3].File != "/dev/nvidia3" || c.Devices[3].Source != filepath.Join(dir, "gpus.conf") {
		t.Errorf("devices %+v", c.Devices)
	}
	if got := c.Devices[2].Where(); got != filepath.Join(dir, "gpus.conf")+":1" {
		t.Errorf("Where() = %q", got)
	}
}

func TestExampleGresConf(t *testing.T) {
	path := filepath.Join("..", "..", "etc", "gres.conf")
	for _, node := range []string{"hgx01", "pcie01"} {
		c, err := gpu.LoadGresConf(path, node)
		if err != nil {
			t.Fatalf("etc/gres.conf for %s: %v", node, err)
		}
		if len(c.Devices) == 0 {
			t.Errorf("etc/gres.conf lists no GPUs for %s", node)
		}
		if c.AutoDetect != "off" {
			t.Errorf("etc/gres.conf: AutoDetect %q for %s, want off", c.AutoDetect, node)
		}
	}
}
