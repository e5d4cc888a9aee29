package assets

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slurm-microvm/slurm-microvm/test/prereq"
)

func TestKernelCmdline(t *testing.T) {
	tcg := KernelCmdline("tcg")
	kvm := KernelCmdline("kvm")
	for _, want := range []string{"console=ttyS0", "panic=-1", "cryptomgr.notests", "initcall_blacklist=crypto_kdf108_init"} {
		if !slices.Contains(tcg, want) || !slices.Contains(kvm, want) {
			t.Errorf("%q missing: tcg %q kvm %q", want, tcg, kvm)
		}
	}
	hasTSC := func(c []string) (int64, bool) {
		for _, p := range c {
			if v, ok := strings.CutPrefix(p, "tsc_early_khz="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				return n, err == nil
			}
		}
		return 0, false
	}
	if _, ok := hasTSC(kvm); ok {
		t.Errorf("kvm command line has tsc_early_khz: %q", kvm)
	}
	if _, _, err := HostTSCkHz(); err == nil {
		if khz, ok := hasTSC(tcg); !ok || khz < 100_000 {
			t.Errorf("tcg command line lacks a plausible tsc_early_khz: %q", tcg)
		}
	}
	for _, p := range tcg {
		if strings.ContainsAny(p, " \t\n") {
			t.Errorf("piece %q contains white space", p)
		}
	}
}

// TestHostTSCkHz checks the calibration against the kernel's own figure in
// /proc/cpuinfo where that figure is the TSC rate (no cpufreq driver).
func TestHostTSCkHz(t *testing.T) {
	khz, src, err := HostTSCkHz()
	if err != nil {
		prereq.Hardware(t, "no TSC rate on this host: %v", err)
	}
	t.Logf("host TSC %d kHz from %s", khz, src)
	mhz, flags, err := readCPUInfo("/proc/cpuinfo")
	if err != nil || !haveRDTSC || !flags["constant_tsc"] {
		return
	}
	if _, err := os.Stat("/sys/devices/system/cpu/cpu0/cpufreq"); err == nil {
		t.Logf("cpufreq driver present: cpuinfo's %.3f MHz is the core clock, not compared", mhz)
		return
	}
	cal, err := calibrateTSC(20 * time.Millisecond)
	if err != nil {
		prereq.Hardware(t, "TSC calibration: %v", err)
	}
	if diff := float64(cal)/(mhz*1000) - 1; diff > 0.002 || diff < -0.002 {
		t.Errorf("calibrated %d kHz vs /proc/cpuinfo %.3f MHz: off by %.3f%%", cal, mhz, diff*100)
	}
}
