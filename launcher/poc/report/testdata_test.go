package report

import "time"

// sampleReport is a report with every field set, a check of each
// verdict, hostile strings in the places a runner copies text from, and
// nStart start-time samples spread over about 400-700 ms.
func sampleReport(nStart int) *Report {
	started := time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC)
	l := &Load{
		Concurrent: 6, ConcurrentWanted: 8, VMMPSSMiB: []float64{41.5, 44.25, 40},
		ArrayTasks: 100, StepsPerMinute: 312.46, BackToBack: 20, ImageConversions: 1,
	}
	for i := range nStart {
		// A deterministic skewed spread: most near 450 ms, a tail to 700.
		l.StartMS = append(l.StartMS, 400+int64((i*37)%100)+int64(i%7)*int64(i%5)*7)
	}
	l.Summarize()
	return &Report{
		Version: "v0.3.0-12-gabcdef", Started: started, Finished: started.Add(7*time.Minute + 30*time.Second),
		Cluster: "smvtest", Partition: "debug", Node: "node1", Users: []string{"smv-alice", "smv-bob"},
		Image: "docker.io/library/debian:12", Driver: "qemu", Accel: "kvm", UnkillableStepTimeoutS: 60,
		Notes: []string{"GPU checks ran on fake GRES (the node has no GPUs)", "note with <i>markup</i>"},
		Checks: []Check{
			{ID: "isolation.files", Group: "isolation", Title: "each tenant reaches only its own paths", Verdict: Pass,
				Reason: "18 paths refused", Jobs: []int{101, 102}, DurationMS: 12_345,
				Evidence: []string{`job 101: open /home/smv-bob/poc/secret: EACCES`, `<script>alert("pwned")</script>`, `a & b < c > d "e" 'f'`}},
			{ID: "fault.vmm-killed", Group: "fault", Title: "VMM SIGKILL mid-step is reported <quickly>", Verdict: Fail,
				Reason: "srun reported it after 31 s & named no VMM", TeardownMS: 850, DurationMS: 33_000, Jobs: []int{103},
				Evidence: []string{"srun: error: task 0 exited: killed"}},
			{ID: "gpu.all", Group: "isolation", Title: "all GPUs", Verdict: Skip, Reason: "no GRES gpu on node1"},
		},
		Load: l,
	}
}

// nonEmptyBins counts the non-empty bins of samples, as the picture draws them.
func nonEmptyBins(samples []int64) int {
	if len(samples) == 0 {
		return 0
	}
	lo, width, _ := binning(samples)
	seen := map[int64]bool{}
	for _, v := range samples {
		seen[(v-lo)/width] = true
	}
	return len(seen)
}
