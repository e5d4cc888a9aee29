package hostlist

import (
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // space-separated; "!" = error
	}{
		{"/dev/nvidia0", "/dev/nvidia0"},
		{"/dev/nvidia[0-3]", "/dev/nvidia0 /dev/nvidia1 /dev/nvidia2 /dev/nvidia3"},
		{"/dev/nvidia[0,2-3]", "/dev/nvidia0 /dev/nvidia2 /dev/nvidia3"},
		{"/dev/nvidia0,/dev/nvidia2", "/dev/nvidia0 /dev/nvidia2"},
		{"/dev/vfio/[30-31],/dev/vfio/40", "/dev/vfio/30 /dev/vfio/31 /dev/vfio/40"},
		{"gpu[08-10]", "gpu08 gpu09 gpu10"},
		{"r[1-2]n[1-2]", "r1n1 r1n2 r2n1 r2n2"},
		{"/dev/nvidia[3-1]", "!"}, {"/dev/nvidia[0-", "!"}, {"/dev/nvidia]", "!"}, {"a[x]", "!"}, {"a,,b", "!"},
		{"n[0-99999999]", "!"}, {"a[[1]]", "!"},
	} {
		got, err := Expand(tc.in)
		if tc.want == "!" {
			if err == nil {
				t.Errorf("Expand(%q) = %q, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || strings.Join(got, " ") != tc.want {
			t.Errorf("Expand(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
