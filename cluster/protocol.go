package cluster

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/serf/serf"

	"github.com/sluicehq/sluice/ring"
)

// The protocol versions this build speaks: what travels between nodes
// (forwarded checks, hand-off and replicated states, leases, hand-over
// confirmations) in the form of version ProtocolVersionMax, and the forms
// of every version from ProtocolVersionMin up. Each node advertises its
// range in its membership tags; a member whose range does not overlap this
// node's is kept out of the ring, listed by Node.RefusedMembers, so that
// no state goes to a node that would misread it. A rolling upgrade from
// version N to N+1 goes through a build that speaks both: members of the
// old and the new build then overlap in N, and the next build may drop N
// once no member speaks only N.
const (
	ProtocolVersionMin = 1
	ProtocolVersionMax = 1
)

// Serf tags of the protocol range and of bootstrapping.
const (
	protoMinTag = "pmin"
	protoMaxTag = "pmax"
	// bootTag is set to "1" by a node once it is ready: a node that
	// starts and sees such a member knows a cluster exists and joins it,
	// whatever its BootstrapExpect (bootstrap.go).
	bootTag = "boot"
)

// protocolRange is an inclusive range of protocol versions.
type protocolRange struct{ min, max uint8 }

// thisProtocol is the range this build speaks.
var thisProtocol = protocolRange{ProtocolVersionMin, ProtocolVersionMax}

func (p protocolRange) String() string { return fmt.Sprintf("%d-%d", p.min, p.max) }

// overlaps reports whether p and q share a version.
func (p protocolRange) overlaps(q protocolRange) bool { return p.min <= q.max && q.min <= p.max }

// valid reports whether p is a non-empty range of versions from 1.
func (p protocolRange) valid() bool { return p.min >= 1 && p.min <= p.max }

// parseProtocolTags reads a member's range from its tags. Tags come from
// other nodes: a missing or malformed range is an error, never a guess.
func parseProtocolTags(tags map[string]string) (protocolRange, error) {
	lo, err1 := strconv.ParseUint(tags[protoMinTag], 10, 8)
	hi, err2 := strconv.ParseUint(tags[protoMaxTag], 10, 8)
	p := protocolRange{uint8(lo), uint8(hi)}
	if err1 != nil || err2 != nil || !p.valid() {
		return protocolRange{}, fmt.Errorf("advertises no valid protocol range (tags %s=%q %s=%q)",
			protoMinTag, tags[protoMinTag], protoMaxTag, tags[protoMaxTag])
	}
	return p, nil
}

// versions tracks the members whose protocol range this node cannot speak.
// Safe for concurrent use.
type versions struct {
	self protocolRange
	mu   sync.Mutex // guards refused
	// refused holds the members refused now, by name; a member leaves it
	// when it is no longer alive or speaks a range that overlaps.
	refused map[string]RefusedMember
}

func newVersions(self protocolRange) *versions {
	return &versions{self: self, refused: map[string]RefusedMember{}}
}

// filter returns the members of ms whose protocol range overlaps this
// node's (this node always), and records the others as refused. Each
// change is passed to report once: refused true when a member became
// refused or its reason changed, false when it stopped being refused.
func (v *versions) filter(ms []serf.Member, self string, now time.Time, report func(m RefusedMember, refused bool)) []serf.Member {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]serf.Member, 0, len(ms))
	seen := make(map[string]bool, len(ms))
	for _, m := range ms {
		if m.Status != serf.StatusAlive {
			continue
		}
		reason := ""
		if m.Name != self {
			p, err := parseProtocolTags(m.Tags)
			switch {
			case err != nil:
				reason = err.Error()
			case !p.overlaps(v.self):
				reason = fmt.Sprintf("speaks protocol versions %v, this node %v", p, v.self)
			}
		}
		if reason == "" {
			out = append(out, m)
			continue
		}
		seen[m.Name] = true
		prev, ok := v.refused[m.Name]
		if ok && prev.Reason == reason {
			continue
		}
		r := RefusedMember{Name: m.Name, GRPCAddr: m.Tags[grpcTag], Reason: reason, Since: now, Attempts: 1}
		v.refused[m.Name] = r
		report(r, true)
	}
	for name, r := range v.refused {
		if !seen[name] {
			delete(v.refused, name)
			report(r, false)
		}
	}
	return out
}

// list returns the refused members, sorted by name.
func (v *versions) list() []RefusedMember {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]RefusedMember, 0, len(v.refused))
	for _, r := range v.refused {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b RefusedMember) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// reportVersion logs a change of a member's protocol standing.
func (n *Node) reportVersion(m RefusedMember, refused bool) {
	if !refused {
		n.logger.Info("cluster: member no longer refused for its protocol version", "member", m.Name)
		return
	}
	n.logger.Error("cluster: member refused: it speaks no protocol version this node speaks, so it owns no key and is sent nothing; upgrade one side through a build that speaks both ranges",
		"member", m.Name, "grpc", m.GRPCAddr, "reason", m.Reason, "this_node", n.versions.self.String())
}

// compatibleRingMembers returns the ring members among serf's alive
// members whose protocol range overlaps this node's.
func (n *Node) compatibleRingMembers() []ring.Member {
	ms := n.versions.filter(n.serf.Members(), n.cfg.NodeName, n.now(), n.reportVersion)
	return ringMembers(ms, n.logger)
}
