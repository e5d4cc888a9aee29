package assets

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// KernelCmdline returns the kernel command line pieces recommended for the
// guest boot pair on QEMU -M microvm with the given accelerator ("tcg",
// "kvm"; anything else is treated like kvm). The caller adds its own pieces
// (init arguments, root device, quiet or not) after these. Each piece and the
// measurement behind it is listed in doc.go.
//
// For "tcg" it adds tsc_early_khz=<host TSC kHz>: under TCG the guest's TSC
// ticks at the host's rate (QEMU reads the host TSC), but the guest cannot
// calibrate it against the emulated PIT reliably, and 10-30% of boots hang
// without it. If the host rate cannot be found the piece is left out. The
// TSC calibration makes a call take about 20 ms.
func KernelCmdline(accel string) []string {
	c := []string{
		"console=ttyS0",     // microvm's isa-serial (on by default)
		"panic=-1",          // reboot at once on panic: with -no-reboot QEMU exits instead of spinning
		"cryptomgr.notests", // skip the crypto self-tests: about 0.4 s under TCG
		// The CTR-KDF self-test is not the crypto manager's: its initcall
		// is nothing but that test (crypto/kdf_sp800108.c), about 0.2 s
		// under TCG; the KDF itself stays usable.
		"initcall_blacklist=crypto_kdf108_init",
		"i8042.noaux", // microvm has no i8042: do not probe it
		"i8042.nokbd",
		"8250.nr_uarts=1", // one UART: do not probe ttyS1-3
	}
	if accel == "tcg" {
		if khz, _, err := HostTSCkHz(); err == nil {
			c = append(c, "tsc_early_khz="+strconv.FormatInt(khz, 10))
		}
		// Emulation stalls must not get the TSC declared unstable by the
		// clocksource watchdog (the fallbacks are far slower under TCG).
		c = append(c, "tsc=reliable", "no_timer_check")
	}
	return c
}

// HostTSCkHz returns the host's TSC frequency in kHz and where it came from:
//
//  1. /sys/devices/system/cpu/cpu0/tsc_freq_khz, where the kernel exports it
//     (not in mainline; some distribution and cloud kernels);
//  2. a calibration of RDTSC against CLOCK_MONOTONIC_RAW over 20 ms, on
//     amd64 hosts whose TSC is invariant (cpuinfo flags constant_tsc and
//     nonstop_tsc), accurate to about 0.01%;
//  3. /proc/cpuinfo "cpu MHz" × 1000. On a host without a cpufreq driver
//     (virtual machines, like the project's machines) it is the kernel's
//     tsc_khz; on bare metal with a cpufreq driver or APERF/MPERF it is the
//     current core clock, which is why it comes last.
func HostTSCkHz() (int64, string, error) {
	const sysfs = "/sys/devices/system/cpu/cpu0/tsc_freq_khz"
	if b, err := os.ReadFile(sysfs); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 {
			return v, sysfs, nil
		}
	}
	mhz, flags, cpuErr := readCPUInfo("/proc/cpuinfo")
	if haveRDTSC && flags["constant_tsc"] && flags["nonstop_tsc"] {
		if v, err := calibrateTSC(20 * time.Millisecond); err == nil {
			return v, "rdtsc calibration", nil
		}
	}
	if cpuErr == nil && mhz > 0 {
		return int64(mhz*1000 + 0.5), "/proc/cpuinfo cpu MHz", nil
	}
	return 0, "", fmt.Errorf("host TSC frequency: no %s, no invariant TSC, no \"cpu MHz\" in /proc/cpuinfo (%v)", sysfs, cpuErr)
}

// readCPUInfo returns the first "cpu MHz" and the first "flags" set.
func readCPUInfo(p string) (float64, map[string]bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	var mhz float64
	var flags map[string]bool
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() && (mhz == 0 || flags == nil) {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "cpu MHz":
			if mhz == 0 {
				mhz, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
			}
		case "flags":
			if flags == nil {
				flags = map[string]bool{}
				for _, w := range strings.Fields(v) {
					flags[w] = true
				}
			}
		}
	}
	if mhz == 0 {
		return 0, flags, errors.New("no \"cpu MHz\" line")
	}
	return mhz, flags, sc.Err()
}

// calibrateTSC counts TSC ticks over about d of CLOCK_MONOTONIC_RAW. Each end
// is the tightest of several (clock, tsc, clock) brackets, so a preemption
// between the reads does not skew the result.
func calibrateTSC(d time.Duration) (int64, error) {
	sample := func() (tsc uint64, ns int64, ok bool) {
		best := int64(-1)
		for range 7 {
			var a, b unix.Timespec
			if unix.ClockGettime(unix.CLOCK_MONOTONIC_RAW, &a) != nil {
				return 0, 0, false
			}
			t := rdtsc()
			if unix.ClockGettime(unix.CLOCK_MONOTONIC_RAW, &b) != nil {
				return 0, 0, false
			}
			w := b.Nano() - a.Nano()
			if best < 0 || w < best {
				best, tsc, ns = w, t, (a.Nano()+b.Nano())/2
			}
		}
		return tsc, ns, best < int64(50*time.Microsecond)
	}
	t0, n0, ok0 := sample()
	time.Sleep(d)
	t1, n1, ok1 := sample()
	if !ok0 || !ok1 || n1 <= n0 || t1 <= t0 {
		return 0, errors.New("calibrate TSC: clock reads too noisy")
	}
	return int64(float64(t1-t0) / float64(n1-n0) * 1e6), nil
}
