// Package control is the step's control socket, the same for every runtime
// driver: the supervisor listens on <state>/control.sock (Listen, usable
// only by the job's uid), and each task process attaches to it (Attach) and
// speaks the guest agent's ttrpc API (launcher/agent/api) over it. The
// QEMU driver relays the connection's bytes to a stream of the guest agent
// in the VM; the Kata driver serves the same API itself and carries it out
// through the shim's task API. How a sandbox ended (its host process's
// exit, recorded by the supervisor in VMMExitFile) is read here too, so a
// task names the end of its sandbox rather than the closed connection.
//
// Design decision: one control protocol for every driver, served by the
// supervisor, rather than each driver's own client in the task process. The
// tasks run as the job's user; a Kata shim's task API would let its caller
// create containers with any spec (root on the host through runc, any
// device through Kata): it must never face the tenant. The supervisor is
// the narrow broker: it turns the agent API's "run this argv as the job's
// user" into the shim's calls with a spec it builds itself. The exec path
// (launcher.Exec) therefore names no driver.
package control
