// Package shim is the daemonless path to a Kata sandbox: it starts a
// containerd shim v2 binary (containerd-shim-kata-v2) for one step and
// speaks the shim's task API to it over ttrpc, as containerd and CRI-O do,
// behind the interface launcher/kata/taskapi.Service. Tests run it against
// containerd's runc shim over the identical API: Debian's 1.6 build (task
// API v2) and one built from containerd v2.4 (task API v3).
//
// Use: BecomeSubreaper once in the process; write the bundle's
// config.json; Start; persist Shim.Record in the step's state; drive
// Shim.Service (Create, Start, Exec, Wait, ..., Delete, Shutdown). A
// `stop` or `gc` in another process, after a launcher crash, calls
// Cleanup with the persisted Record.
//
// # Design decisions
//
// Daemonless by default. The launcher starts the shim itself instead of
// asking a containerd daemon to. On an HPC node there is then no node
// daemon to install, configure, upgrade and monitor, and the shim and the
// VMM it starts are the launcher's descendants: they live in the step's
// cgroup, where scancel, --mem and the step's accounting reach them. The
// alternative, containerd with the runtime handler io.containerd.kata.v2
// (launcher/kata/ctrd), is kept for sites that already run containerd: there
// the shim is containerd's child, in containerd's cgroup unless Kata's
// sandbox_cgroup_only moves it.
//
// One -address per step. A shim names its socket
// /run/containerd/s/<sha256(address/namespace/id)>, and a start that finds
// that socket served prints the live shim's address and exits (that is
// containerd's sandbox grouping): a reused address, namespace and id
// silently attaches to the first shim's sandbox, which for two jobs would
// be one job inside another's sandbox. So the address is a path in the
// step's private state directory (<StateDir>/containerd.sock; it is never
// served, only hashed), and Start checks, before handing out the shim,
// that it is the one it started: the serving shim's parent is this
// process, its working directory is the bundle, it started after Start
// began, and it has no container of the id yet. A state directory whose
// events socket still answers is refused before anything runs. The
// alternative, one fixed address (containerd's own socket path) and
// unique ids, leaves the isolation to the id alone; and the shim's
// -socket flag is not honoured by every shim's start.
//
// The ids must still be unique on the node: the runtime keeps its state by
// namespace and id (runc under /run/containerd/runc/<namespace>/<id>, Kata
// under /run/vc/sbs/<id>), whatever the address.
//
// Task API v2 or v3, from what the shim prints. Shims built on
// containerd 1.x print a bare address and serve containerd.task.v2.Task;
// shims built on 2.0 to 2.3 print JSON {"version":3,"address":...,
// "protocol":"ttrpc"}; shims built on 2.4+ want containerd's bootstrap
// parameters (protobuf) on stdin and print a protobuf BootstrapResult. Start
// runs `start` with an empty stdin first (Debian's 1.6 shim fails on
// bootstrap parameters it takes for runtime options) and again with the
// parameters when the shim says it needs them, then parses the three forms
// (as containerd's parseStartResponse does) and talks to the version the
// shim announced. The v2 and v3 messages are the same on the wire
// (shim.proto differs only in its package line, TestTaskAPIVersionsAgree),
// so one client sends the v3 Go messages to the service name of the
// announced version; the alternative, the two generated clients behind an
// adapter each, doubles the code for no difference on the wire. A shim
// that announces grpc or another version is refused with the address.
//
// The shim's log FIFO. A shim writes its log to <bundle>/log, a FIFO it
// expects its starter to read; with no reader it dies of SIGPIPE soon
// after start (measured with the runc shim 1.6). Start creates it and
// holds it open read-write (opening never blocks; the shim's writes never
// find it without a reader) and passes each line to the logger.
//
// An events server. A shim publishes task events to TTRPC_ADDRESS; with
// nothing there, the 1.6 runc shim retries and its teardown stalls about
// 10 s. Start serves containerd.services.events.ttrpc.v1.Events/Forward on
// <StateDir>/containerd.sock.ttrpc and logs the events at debug: the
// driver learns exits through Wait.
//
// A child subreaper. A shim daemonizes (its start helper forks the
// serving shim and exits), so without a subreaper the shim would be
// PID 1's child: nobody in the step would notice its exit. The launcher
// is a subreaper (BecomeSubreaper, process-wide) and the Shim reaps its
// shim through a pidfd. When a shim dies before its container, the
// container's processes come to the launcher too (the shim was their
// subreaper): Cleanup reaps those zombies while the shim's delete runs
// (runc delete --force waits for them).
//
// Stdin. The runc shim holds a write end of a process's stdin FIFO (so
// that EOF comes only from CloseIO) and opens its read end in the
// background. A caller that writes, closes its end and calls CloseIO
// before that open has happened loses the data and the process never sees
// EOF (seen under load with the 2.4 runc shim). So a caller closes its
// write end, then calls CloseIO, only once the process has consumed input
// (its output shows it); a process with no input gets no Stdin FIFO.
//
// A clean environment. The shim gets PATH (a fixed system PATH unless
// Options.Env sets one), TTRPC_ADDRESS, GRPC_ADDRESS, NAMESPACE and
// Options.Env, not the launcher's environment, which a job may influence.
//
// Cleanup from a Record. The Record (binary, id, namespace, bundle,
// address, socket, shim pid and start time) is all another process needs:
// it asks a live shim (Kill all, Delete, Shutdown), runs the shim's own
// `delete` (which for the runc shim is runc delete --force in runc's root
// /run/containerd/runc/<namespace>, and for Kata removes the sandbox),
// SIGKILLs the recorded pid only while it is the same process (start
// time, through a pidfd) and removes the sockets. The alternative, killing
// by pid alone, could hit an unrelated process after pid reuse.
package shim
