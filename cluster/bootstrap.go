package cluster

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/hashicorp/serf/serf"

	"github.com/sluicehq/sluice/internal/clocks"
	"github.com/sluicehq/sluice/ring"
)

// A node is ready (it decides the keys it owns) only inside a cluster that
// has formed, never as a cluster of its own by accident. It is ready once
//   - it has joined its seeds, when it has any (join), and
//   - it sees, among the members of its ring (alive, proved, speaking a
//     protocol version it speaks), either Config.BootstrapExpect members,
//     itself included, or a member that is ready already and says so in
//     its bootTag.
// The first starts a cluster: the nodes that start together each wait
// until they all see each other. The second joins one: a node that
// restarts, or is added later, is ready once it has joined a member of a
// cluster that formed. A node with BootstrapExpect 0 never starts a
// cluster. Once ready, a node stays ready until it leaves or closes,
// whoever fails.
//
// Nodes do not stay apart: every RetryJoinInterval a node joins the
// addresses of its seeds and of the members it remembers (Config.DataDir)
// that are not alive members, so that a node that left and came back, or
// two halves that formed apart, find each other; their rings merge, and
// the hand-off merges their states, the more consumed winning.

// nodeTags returns the serf tags a node advertises.
func nodeTags(c *Config, grpcAddr string, boot bool) map[string]string {
	p := c.protocolRange()
	t := map[string]string{
		grpcTag:     grpcAddr,
		protoMinTag: strconv.Itoa(int(p.min)),
		protoMaxTag: strconv.Itoa(int(p.max)),
	}
	if boot {
		t[bootTag] = "1"
	}
	return t
}

// bootstrapState says whether the ring lets the node be ready and, when
// not, why.
func (n *Node) bootstrapState() (ok bool, why string) {
	if len(n.cfg.Seeds) > 0 && !n.joinedOnce.Load() {
		return false, fmt.Sprintf("joining the seeds %v", n.cfg.Seeds)
	}
	members := n.ring.Members()
	if n.cfg.BootstrapExpect > 0 && len(members) >= n.cfg.BootstrapExpect {
		return true, ""
	}
	in := make(map[string]bool, len(members))
	for _, m := range members {
		in[m.Name] = true
	}
	for _, m := range n.serf.Members() {
		if m.Name != n.cfg.NodeName && in[m.Name] && m.Status == serf.StatusAlive && m.Tags[bootTag] == "1" {
			return true, ""
		}
	}
	if n.cfg.BootstrapExpect == 0 {
		return false, "waiting to join a cluster that is ready (BootstrapExpect 0 starts none)"
	}
	return false, fmt.Sprintf("waiting for %d members to start a cluster (BootstrapExpect), %d seen, and no member of a ready cluster",
		n.cfg.BootstrapExpect, len(members))
}

// NotReadyReason says why the node is not ready, or "" when it is.
func (n *Node) NotReadyReason() string {
	switch {
	case n.Ready():
		return ""
	case n.closed.Load():
		return "closed or leaving"
	case n.serf.State() != serf.SerfAlive:
		return "serf stopped (another node has this node's name?)"
	}
	if ok, why := n.bootstrapState(); !ok {
		return why
	}
	return "waiting for the members found to prove themselves"
}

// tryReady makes the node ready when bootstrapState allows it, after the
// members it found have answered their challenges, so that it does not
// decide keys as owner while its ring lacks members about to prove
// themselves. It reports whether the node is ready.
func (n *Node) tryReady() bool {
	n.readyMu.Lock()
	defer n.readyMu.Unlock()
	if n.Ready() {
		return true
	}
	if n.closed.Load() || n.serf.State() != serf.SerfAlive {
		return false
	}
	if ok, _ := n.bootstrapState(); !ok {
		return false
	}
	if n.awaitProofs() {
		n.rebuild(0)
		if ok, _ := n.bootstrapState(); !ok {
			return false
		}
	}
	if n.closed.Load() {
		return false
	}
	n.handover.setReady(true, n.now())
	n.transfers.wakeHandoff() // arms the hand-over's timeout
	// serf's SetTags waits until the update has gone round the gossip
	// (up to its BroadcastTimeout): not on the caller's time.
	n.goFunc(n.advertiseReady)
	n.logger.Info("cluster: ready", "members", n.ring.Len())
	n.rememberMembers()
	return true
}

// advertiseReady sets the node's bootTag, so that nodes that start later
// join its cluster.
func (n *Node) advertiseReady() {
	if n.closed.Load() {
		return
	}
	if err := n.serf.SetTags(nodeTags(&n.cfg, n.GRPCAddr(), true)); err != nil && !n.closed.Load() {
		n.logger.Warn("cluster: advertising that the node is ready is slow to reach every member", "err", err)
	}
}

// wakeReady tells readyLoop to look again; it never blocks.
func (n *Node) wakeReady() {
	select {
	case n.readyWake <- struct{}{}:
	default:
	}
}

// readyLoop makes the node ready when a membership change allows it.
func (n *Node) readyLoop() {
	for {
		select {
		case <-n.shutdown:
			return
		case <-n.readyWake:
			if n.tryReady() {
				return
			}
		}
	}
}

// rejoinLoop joins, every RetryJoinInterval (and at once when the node
// remembers members), the seeds until they answer, and then the addresses of seeds and remembered
// members that are not alive members.
func (n *Node) rejoinLoop() {
	t := clocks.NewTicker(n.clock, n.cfg.RetryJoinInterval)
	defer t.Stop()
	n.rememberMu.Lock()
	remembered := len(n.remembered) > 0
	n.rememberMu.Unlock()
	if remembered { // New joined the seeds; the remembered members wait for no tick
		n.rejoin()
	}
	for {
		select {
		case <-n.shutdown:
			return
		case <-t.C:
		}
		n.rejoin()
	}
}

// rejoin is one pass of rejoinLoop.
func (n *Node) rejoin() {
	if n.closed.Load() { // closed, or leaving: it joins nothing more
		return
	}
	seeds := n.cfg.Seeds
	if len(seeds) > 0 && !n.joinedOnce.Load() {
		// join resolves the seeds again: a headless service's pods
		// that started since are found.
		if _, err := n.join(seeds); err != nil {
			n.logger.Warn("cluster: join failed; not ready, retrying", "seeds", seeds, "err", err)
		}
		seeds = nil // tried
	}
	n.rememberMembers()
	targets := n.rejoinTargets(seeds)
	if len(targets) == 0 || n.closed.Load() {
		return
	}
	k, err := n.serf.Join(targets, true)
	if k > 0 {
		n.logger.Info("cluster: joined seeds or remembered members that were not members", "reached", k, "addresses", targets)
		if len(n.cfg.Seeds) > 0 && !n.joinedOnce.Load() && n.knowsAnotherMember() {
			n.joined()
		}
		return
	}
	n.logger.Debug("cluster: seeds and remembered members that are not members did not answer", "addresses", targets, "err", err)
}

// rejoinTargets returns the gossip addresses of seeds and of the
// remembered members that no alive or leaving member has, this node's
// left out. A remembered member is a target only once it has answered as
// itself (answering): a restarted node whose cluster is gone does not
// join, and glue its keys to, another cluster that now listens at a
// remembered address.
func (n *Node) rejoinTargets(seeds []string) []string {
	n.rememberMu.Lock()
	remembered := slices.Clone(n.remembered)
	n.rememberMu.Unlock()
	if len(seeds) == 0 && len(remembered) == 0 {
		return nil
	}
	ctx, cancel := clocks.WithTimeout(n.transfers.ctx, n.clock, resolveTimeout)
	defer cancel()
	addrs, _ := resolveSeeds(ctx, n.resolver, seeds, n.selfGossip())
	// A leaving member is going: joining it would only slow its leave.
	// A remembered member that is a member under its name, wherever it
	// listens now, is not challenged again.
	skip := map[string]bool{n.selfGossip().String(): true}
	members := map[string]bool{n.cfg.NodeName: true}
	for _, m := range n.serf.Members() {
		if m.Status == serf.StatusAlive || m.Status == serf.StatusLeaving {
			skip[net.JoinHostPort(m.Addr.String(), strconv.Itoa(int(m.Port)))] = true
			members[m.Name] = true
		}
	}
	addrs = slices.DeleteFunc(addrs, func(a string) bool {
		_, hostPort, named := strings.Cut(a, "/")
		if !named {
			hostPort = a
		}
		return skip[hostPort]
	})
	for _, a := range addrs { // a seed is joined as the operator named it
		skip[a] = true
	}
	remembered = slices.DeleteFunc(remembered, func(m rememberedMember) bool {
		return skip[m.Gossip] || members[m.Name]
	})
	return append(addrs, n.answering(remembered)...)
}

// answering returns the gossip addresses of the members in ms that
// answer, at the gRPC address remembered with them, a challenge (the
// proof a ring member gives, transport.Prove) under their remembered
// name, within ProofTimeout: under a cluster secret the answer proves
// it, under mutual TLS the certificate does, and with neither the name
// must match. The address joined is the one the member reports in its
// answer, where it listens now, and the remembered one only from a
// member that reports none (a release before the report). A member
// remembered without a gRPC address, from a members file of version 1,
// is joined by address alone.
func (n *Node) answering(ms []rememberedMember) []string {
	at := make([]string, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		if m.GRPC == "" {
			at[i] = m.Gossip
			continue
		}
		wg.Go(func() {
			ctx, cancel := clocks.WithTimeout(n.proofCtx, n.clock, n.cfg.ProofTimeout)
			defer cancel()
			gossip, err := n.challenge(ctx, ring.Member{Name: m.Name, Addr: m.GRPC})
			switch {
			case err != nil:
			case gossip == "":
				at[i] = m.Gossip
			case gossip != n.selfGossip().String():
				at[i] = gossip
			}
		})
	}
	wg.Wait()
	var out, silent []string
	for i, m := range ms {
		if at[i] != "" {
			out = append(out, at[i])
		} else {
			silent = append(silent, m.Name+"/"+m.GRPC)
		}
	}
	if len(silent) > 0 {
		n.logger.Debug("cluster: remembered members that did not answer as themselves at their gRPC addresses; not joined", "members", silent)
	}
	return out
}

// rememberMembers records the alive members of the ring, when there are
// others than this node and they changed, in memory and, with
// Config.DataDir, in its members file. A ring of this node alone is not
// recorded: the members seen last are the ones to find again. A member
// the ring dropped while others remain is dropped from the record too,
// so that a node retries only the members it lost all at once, and not,
// for ever, addresses that may serve something else by now.
func (n *Node) rememberMembers() {
	inRing := map[string]string{} // name: gRPC address
	for _, m := range n.ring.Members() {
		inRing[m.Name] = m.Addr
	}
	var now []rememberedMember
	for _, m := range n.serf.Members() {
		grpcAddr := inRing[m.Name]
		if m.Name == n.cfg.NodeName || grpcAddr == "" || m.Status != serf.StatusAlive {
			continue
		}
		now = append(now, rememberedMember{Name: m.Name, Gossip: net.JoinHostPort(m.Addr.String(), strconv.Itoa(int(m.Port))), GRPC: grpcAddr})
	}
	if len(now) == 0 {
		return
	}
	slices.SortFunc(now, func(a, b rememberedMember) int { return strings.Compare(a.Name, b.Name) })
	if len(now) > maxRememberedMembers {
		now = now[:maxRememberedMembers]
	}
	n.rememberMu.Lock()
	defer n.rememberMu.Unlock()
	if sameMembers(now, n.remembered) {
		return
	}
	n.remembered = now
	if n.cfg.DataDir == "" {
		return
	}
	if err := writeMembersFile(n.cfg.DataDir, now); err != nil {
		n.logger.Warn("cluster: could not record the members seen; a restart rejoins only the seeds and the members recorded before",
			"dir", n.cfg.DataDir, "err", err)
	}
}
