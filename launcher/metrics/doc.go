// Package metrics keeps the node's launcher metrics in a Prometheus
// textfile-collector file ([metrics] textfile in microvm.toml): every
// supervisor adds its step to the counters when it ends (Record), and
// `slurm-microvm metrics` prints the same metrics to stdout (Write).
//
// The metrics, all prefixed slurm_microvm_:
//
//	starts_total                 counter: supervisors that began a start
//	failures_total{stage}        counter: steps that failed, by the phase
//	                             that failed (gpus, shares, image, mpi,
//	                             assets, network, boot, ready) or "run"
//	                             (after the sandbox was ready); a step
//	                             stopped on purpose is no failure
//	phase_duration_seconds{phase} histogram, seconds: each phase that
//	                             succeeded (the launcher's msg=phase lines)
//	sandboxes_running            gauge: booting or running sandboxes on the
//	                             node when the file was written
//	cache_size_bytes{cache}      gauge: bytes allocated on disk under each
//	                             directory of cache_dir (images, assets, ...)
//	metrics_updated_timestamp_seconds  gauge: when the file was written
//
// Design decisions (the alternative, and why not):
//   - A textfile for node_exporter's textfile collector, not an HTTP
//     endpoint: every step is its own short-lived supervisor process and
//     there is no daemon on the node to serve one; a daemon only for
//     metrics would be one more root service to run and secure. Nodes
//     that are monitored already run node_exporter.
//   - The counters persist in a small JSON file next to the textfile
//     (<textfile>.state.json; node_exporter reads only *.prom) that each
//     supervisor reads, adds its step to and rewrites, all under an
//     exclusive flock on <textfile>.lock (package launcher/flock), not
//     parsed back from the textfile: the textfile holds cumulative bucket
//     counts rounded through text, and parsing it back would tie the
//     counters to the exposition format's details. Deleting both files
//     resets the counters, which Prometheus sees as a counter reset.
//   - Both files are written through a temporary and rename (the textfile
//     by prometheus.WriteToTextfile, 0644), so node_exporter never reads a
//     half-written file and a killed supervisor leaves the last whole one.
//   - The gauges are computed when the file is written (the state
//     directories, a walk of cache_dir), not counted up and down: a
//     supervisor that is killed would leave a count that is wrong for
//     ever. Between steps they are as old as the last step's end
//     (metrics_updated_timestamp_seconds says how old); `slurm-microvm
//     metrics` computes them now.
//   - Durations in seconds, the Prometheus base unit, with buckets from
//     50 ms to 5 min (image conversion and boot span that range).
package metrics
