package launcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/slurm-microvm/slurm-microvm/launcher/driver"
	"github.com/slurm-microvm/slurm-microvm/launcher/hostlist"
	"github.com/slurm-microvm/slurm-microvm/launcher/network"
	"github.com/slurm-microvm/slurm-microvm/launcher/state"
)

// networkFile records, in the step's state, the host-side names of its
// network before any of it exists, so that stop and gc remove it after any
// fault (a crashed supervisor, a killed VMM).
const networkFile = "network.json"

// scontrolTimeout bounds the one scontrol call of a step's start.
const scontrolTimeout = 20 * time.Second

type networkRecord struct {
	Mode  network.Mode  `json:"mode"`
	Names network.Names `json:"names"`
}

// planNetwork sets up the step's network on this node, as the config and
// --microvm-network say, and returns the driver's attachment (nil: the
// guest has loopback only) and a func that closes the launcher's copies of
// its files once the VMM holds its own.
//
// A one-node step in mode step has no peers: it gets no network device
// unless the site lists services (its guest has loopback only, as with
// mode none), so single-node steps boot as fast as before. Mode user is
// for one-node steps.
func (l *Launcher) planNetwork(ctx context.Context, s *Spec, d state.Dir, log *slog.Logger) (*driver.Network, func(), error) {
	nc := &l.Config.Network
	mode, err := nc.NetworkMode(s.Network)
	if err != nil {
		return nil, nil, err
	}
	nothing := func() {}
	names := []string{s.ID.Node}
	if s.Nodes != "" {
		if names, err = hostlist.Expand(s.Nodes); err != nil {
			return nil, nil, fmt.Errorf("step network: SLURM_STEP_NODELIST: %w", err)
		}
	}
	if s.NNodes > 0 {
		if len(names) != s.NNodes || s.NodeIndex < 0 || s.NodeIndex >= len(names) || names[s.NodeIndex] != s.ID.Node {
			return nil, nil, fmt.Errorf("step network: SLURM_STEP_NODELIST %q (%d nodes) does not match slurmstepd's step (%d nodes, this node %s at index %d): the job's environment was altered", s.Nodes, len(names), s.NNodes, s.ID.Node, s.NodeIndex)
		}
	}
	var services []network.Service
	for _, sv := range nc.ParsedServices() {
		services = append(services, network.Service{Prefix: sv.Prefix, Proto: sv.Proto, Port: sv.Port})
	}
	req := network.Request{
		Mode: network.Mode(mode), Node: s.ID.Node,
		Job: s.ID.Job, Step: s.ID.Step, Restart: s.ID.Restart,
		Subnet: nc.ParsedSubnet(), VXLANPort: uint16(nc.VXLANPort), MTU: nc.MTU,
	}
	switch network.Mode(mode) {
	case network.None:
		return nil, nothing, nil
	case network.User:
		req.UserSubnet, req.UserAllow = nc.ParsedUserSubnet(), nc.ParsedUserAllow()
		if len(names) > 1 {
			return nil, nil, fmt.Errorf("network mode user (%s): user mode is outbound NAT for one-node steps, and this step has %d nodes (%s): use --microvm-network=step for a network between them", modeOrigin(s), len(names), s.Nodes)
		}
	case network.Step:
		if len(names) <= 1 && len(services) == 0 {
			log.Info("step network: one node and no services: loopback only")
			return nil, nothing, nil
		}
		req.Services = services
	}
	if s.ID.Node == "" {
		return nil, nil, fmt.Errorf("step network (mode %s): the step has no Slurm node name (SLURMD_NODENAME): the SPANK plugin passes it", mode)
	}
	req.Nodes, err = nodeAddrs(ctx, nc.Scontrol, s.SlurmConf, s.Nodes, names, s.ID.Node)
	if err != nil {
		return nil, nil, fmt.Errorf("step network: %w", err)
	}
	plan, err := network.NewPlan(req)
	if err != nil {
		return nil, nil, fmt.Errorf("step network: %w", err)
	}
	rec, err := json.Marshal(networkRecord{Mode: plan.Mode, Names: plan.Names})
	if err != nil {
		return nil, nil, err
	}
	if err := state.WriteFileAtomic(d.File(networkFile), append(rec, '\n'), 0o644); err != nil {
		return nil, nil, fmt.Errorf("step network: record: %w", err)
	}
	t0 := time.Now()
	att, err := network.Setup(ctx, plan, log)
	if err != nil {
		_ = network.Teardown(context.WithoutCancel(ctx), plan.Names)
		return nil, nil, fmt.Errorf("step network: %w", err)
	}
	log.Info("step network ready", "mode", plan.Mode, "vni", plan.VNI, "guest", plan.Guest.Addr,
		"peers", len(plan.Peers), "bridge", plan.Names.Bridge, "ms", time.Since(t0).Milliseconds())
	return att.Network, func() { _ = att.Close() }, nil
}

// teardownNetwork removes the step's host-side network as recorded in its
// state; a step without one is no error.
func teardownNetwork(ctx context.Context, d state.Dir) error {
	b, err := os.ReadFile(d.File(networkFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read network record: %w", err)
	}
	var rec networkRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return fmt.Errorf("parse %s: %w", d.File(networkFile), err)
	}
	if err := network.Teardown(ctx, rec.Names); err != nil {
		return fmt.Errorf("remove step network %s: %w", rec.Names.Alias, err)
	}
	return nil
}

// nodeAddrs asks slurmctld (scontrol show node, one call) for the address
// of each of the step's nodes (NodeAddr, slurm.conf(5)), resolving names
// that are not addresses, in the order of names.
func nodeAddrs(ctx context.Context, scontrol, slurmConf, hostlist string, names []string, self string) ([]network.Node, error) {
	if hostlist == "" {
		hostlist = self
	}
	ctx, cancel := context.WithTimeout(ctx, scontrolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, scontrol, "--oneliner", "show", "node", hostlist)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if slurmConf != "" {
		cmd.Env = append(cmd.Env, "SLURM_CONF="+slurmConf)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("node addresses: %s --oneliner show node %s: %v: %s", scontrol, hostlist, err, strings.TrimSpace(stderr.String()))
	}
	addrOf, err := parseNodeAddrs(out)
	if err != nil {
		return nil, err
	}
	var nodes []network.Node
	for _, n := range names {
		a, ok := addrOf[n]
		if !ok {
			return nil, fmt.Errorf("node addresses: scontrol shows no NodeAddr for node %s of the step (%s)", n, hostlist)
		}
		ip, err := netip.ParseAddr(a)
		if err != nil {
			ips, lerr := net.DefaultResolver.LookupNetIP(ctx, "ip4", a)
			if lerr != nil || len(ips) == 0 {
				return nil, fmt.Errorf("node addresses: NodeAddr %q of node %s is no IPv4 address and does not resolve: %v", a, n, lerr)
			}
			ip = ips[0]
		}
		if !ip.Is4() {
			return nil, fmt.Errorf("node addresses: NodeAddr %s of node %s: the step network's underlay is IPv4", ip, n)
		}
		nodes = append(nodes, network.Node{Name: n, Addr: ip.Unmap()})
	}
	return nodes, nil
}

// parseNodeAddrs reads `scontrol --oneliner show node` output: one line
// per node with NodeName=... and NodeAddr=... among its fields.
func parseNodeAddrs(out []byte) (map[string]string, error) {
	m := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		var name, addr string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "NodeName="); ok {
				name = v
			} else if v, ok := strings.CutPrefix(f, "NodeAddr="); ok {
				addr = v
			}
		}
		if name != "" && addr != "" {
			m[name] = addr
		}
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("node addresses: scontrol printed no NodeName=/NodeAddr= line: %q", strings.TrimSpace(string(out)))
	}
	return m, nil
}

// modeOrigin names where a step's network mode came from, for errors.
func modeOrigin(s *Spec) string {
	if s.Network != "" {
		return "--microvm-network=" + s.Network
	}
	return "the site's [network] mode"
}
