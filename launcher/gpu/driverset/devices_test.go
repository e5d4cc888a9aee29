package driverset

import (
	"reflect"
	"testing"
)

func TestDeviceNodes(t *testing.T) {
	paths := func(ns []DeviceNode) []string {
		var out []string
		for _, n := range ns {
			out = append(out, n.Path)
		}
		return out
	}
	for _, tc := range []struct {
		gpus    int
		modules []string
		want    []string
	}{
		{2, DefaultModules, []string{"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}},
		{1, []string{"nvidia", "nvidia_modeset", "nvidia_drm"}, []string{"nvidia0", "nvidiactl", "nvidia-modeset"}},
		{1, []string{"drm"}, nil},
	} {
		if got := paths(DeviceNodes(tc.gpus, tc.modules)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("DeviceNodes(%d, %v) = %v, want %v", tc.gpus, tc.modules, got, tc.want)
		}
	}
	ns := DeviceNodes(1, DefaultModules)
	if ns[1].Minor != 255 || ns[1].FallbackMajor != 195 || ns[2].FallbackMajor != 0 || ns[3].Minor != 1 {
		t.Errorf("numbering: %+v", ns)
	}
}
