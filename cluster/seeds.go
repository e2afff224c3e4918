package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/serf/serf"

	"github.com/sluicehq/sluice/internal/clocks"
)

// Resolver looks up the addresses of a seed's host name; *net.Resolver is
// one. It must be safe for concurrent use and return once ctx ends.
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
}

var _ Resolver = (*net.Resolver)(nil)

// resolveTimeout bounds the lookups of one join attempt.
const resolveTimeout = 10 * time.Second

// errOnlySelf is why a join fails whose seeds resolve to this node alone.
var errOnlySelf = errors.New("the seeds resolve to no address but this node's")

// resolveSeeds turns seeds into the gossip addresses to join: a seed whose
// host is an IP address stands for itself, a host name for every address r
// returns for it now, each with the seed's port. The node's own address,
// self, is left out, as are repeats. The error joins the failures of the
// seeds that did not resolve; the addresses of the others are returned
// with it.
//
// A seed of the form name/host:port, memberlist's way of naming the node
// expected there, is passed on as it is and resolved by memberlist.
func resolveSeeds(ctx context.Context, r Resolver, seeds []string, self netip.AddrPort) ([]string, error) {
	var out []string
	var errs []error
	seen := make(map[string]bool)
	add := func(a string) {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, seed := range seeds {
		host, portText, err := net.SplitHostPort(seed)
		if strings.Contains(seed, "/") || err != nil {
			add(seed) // name/host:port, or for memberlist to refuse
			continue
		}
		port, err := strconv.ParseUint(portText, 10, 16)
		if err != nil {
			add(seed)
			continue
		}
		var ips []netip.Addr
		if ip, err := netip.ParseAddr(host); err == nil {
			ips = append(ips, ip)
		} else {
			found, err := r.LookupIPAddr(ctx, host)
			if err != nil {
				errs = append(errs, fmt.Errorf("resolve %s: %w", seed, err))
				continue
			}
			for _, a := range found {
				if ip, ok := netip.AddrFromSlice(a.IP); ok {
					ips = append(ips, ip.Unmap())
				}
			}
			if len(found) == 0 {
				errs = append(errs, fmt.Errorf("resolve %s: no addresses", seed))
			}
		}
		for _, ip := range ips {
			ap := netip.AddrPortFrom(ip.Unmap(), uint16(port))
			if ap == self {
				continue
			}
			add(ap.String())
		}
	}
	return out, errors.Join(errs...)
}

// join joins the cluster through seeds, resolved anew (resolveSeeds), and
// returns how many addresses it reached. Every join goes through it: the
// first in New, the retries, and Node.Join. It fails when the seeds name no
// address but this node's, so that a node whose seeds' DNS name answers
// with its own address alone, as a headless service does while the other
// pods start, keeps retrying rather than join itself.
//
// serf hands memberlist addresses only. memberlist (v0.7.0, resolveAddr)
// would resolve a name too, to all its addresses, but not through an
// injectable resolver (a TCP query of type ANY to the first server of
// /etc/resolv.conf for names with a dot, then net.LookupIP), and it joins
// every address it finds, its own included: a push-pull with itself
// succeeds, so a name answering with this node alone would count as a
// join, and the node would be ready alone and stop retrying.
func (n *Node) join(seeds []string) (int, error) {
	ctx, cancel := clocks.WithTimeout(n.transfers.ctx, n.clock, resolveTimeout)
	defer cancel()
	addrs, rerr := resolveSeeds(ctx, n.resolver, seeds, n.selfGossip())
	if len(addrs) == 0 {
		if rerr == nil {
			rerr = errOnlySelf
		}
		return 0, fmt.Errorf("%w: %w", ErrJoin, rerr)
	}
	k, err := n.serf.Join(addrs, true)
	if err != nil {
		return k, fmt.Errorf("%w: %w%s", ErrJoin, errors.Join(rerr, err), joinHint(err))
	}
	if n.serf.State() != serf.SerfAlive {
		return k, fmt.Errorf("%w: serf stopped (another node has the name %q?)", ErrJoin, n.cfg.NodeName)
	}
	if !n.knowsAnotherMember() {
		// Only this node answered, at an address other than the one it
		// advertises (bound to every interface, say).
		return k, fmt.Errorf("%w: %w", ErrJoin, errOnlySelf)
	}
	if rerr != nil {
		n.logger.Warn("cluster: joined, but some seeds did not resolve", "err", rerr)
	}
	n.joined()
	return k, nil
}

// knowsAnotherMember reports whether serf lists a member other than this
// node, in any state: a join that reached another node has merged its
// member list before Join returned. Members it saw fail before (a join
// that heals a partition) may be listed failed until they refute it.
func (n *Node) knowsAnotherMember() bool {
	for _, m := range n.serf.Members() {
		if m.Name != n.cfg.NodeName {
			return true
		}
	}
	return false
}

// selfGossip returns the gossip address this node advertises.
func (n *Node) selfGossip() netip.AddrPort { return n.self.gossip }

// joinHint names the likely mistake behind a failed join, or is "".
// memberlist reads the first byte a seed answers as a message type: an
// HTTP/2 server, such as a sluice node's gRPC port, answers with a
// SETTINGS frame whose first byte is 0, and memberlist reports "invalid
// msgType (0)".
func joinHint(err error) string {
	if strings.Contains(err.Error(), "invalid msgType (0)") {
		return "; a seed answered as a gRPC (HTTP/2) server: this looks like a sluice node's gRPC port (grpc_addr, default 7947); join its gossip port (gossip_addr, default 7946)"
	}
	return ""
}
