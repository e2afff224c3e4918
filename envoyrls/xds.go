package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// RateLimitConfigType is the type URL of the xDS resources XDSWatcher
// reads: go-control-plane's ratelimit.config.ratelimit.v3.RateLimitConfig,
// one domain each, as Envoy Gateway serves them.
const RateLimitConfigType = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Bounds of an xDS response: its RateLimitConfig resources, and the
// descriptors of all of them together and their nesting, as a file's
// YAML reader bounds a file.
const (
	MaxXDSResources   = MaxDirFiles
	MaxXDSDescriptors = 1_000_000
	MaxXDSDepth       = 100
	// MaxXDSMessageBytes bounds one response from the server.
	MaxXDSMessageBytes = 64 << 20
	// maxNACKMessage bounds the error a NACK carries back to the server.
	maxNACKMessage = 4 << 10
)

// XDSConfig configures an XDSWatcher. Start from DefaultXDSConfig.
type XDSConfig struct {
	// Addr is the management server, host:port; DialOptions add to the
	// connection's (its transport credentials: TLS, or insecure).
	Addr        string
	DialOptions []grpc.DialOption
	// NodeID is the node id given to the server: a snapshot cache serves
	// the snapshot set for it. NodeCluster is the node's cluster, when
	// the server needs one.
	NodeID, NodeCluster string
	// Load says how resources become rules: MergeDomains as for files
	// (Strict and Warn do not apply: resources have no misplaced keys).
	Load LoadConfig
	// MinBackoff and MaxBackoff bound the wait before connecting again
	// after the stream ends or fails: doubling from MinBackoff up to
	// MaxBackoff, each wait between half and all of it, and back to
	// MinBackoff once a response arrives.
	MinBackoff, MaxBackoff time.Duration
	// After, when set, replaces time.After for the backoff waits, so
	// that a test can run them on its own clock.
	After func(time.Duration) <-chan time.Time
	// Logger receives updates, rejections and reconnections; nil discards
	// them.
	Logger *slog.Logger
	// OnUpdate is called with the rules of each accepted response, and
	// OnReject with the error of each rejected one (the previous rules
	// stay), from the watcher's goroutine; they must not block for long.
	OnUpdate func(*Rules)
	OnReject func(error)
}

// DefaultXDSConfig is node id "default" and a backoff from 500ms to 30s.
func DefaultXDSConfig() XDSConfig {
	return XDSConfig{NodeID: "default", MinBackoff: 500 * time.Millisecond, MaxBackoff: 30 * time.Second}
}

// Validate reports the first invalid field.
func (c *XDSConfig) Validate() error {
	switch {
	case c.Addr == "":
		return fmt.Errorf("%w: Addr is empty", ErrInvalidWatchConfig)
	case c.NodeID == "":
		return fmt.Errorf("%w: NodeID is empty", ErrInvalidWatchConfig)
	case c.MinBackoff <= 0 || c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("%w: MinBackoff %v must be positive and at most MaxBackoff %v", ErrInvalidWatchConfig, c.MinBackoff, c.MaxBackoff)
	}
	return nil
}

// XDSStats counts what an XDSWatcher has done.
type XDSStats struct {
	// Updates are the responses accepted, Rejects those refused (NACKed),
	// Connects the streams opened, Disconnects those that ended.
	Updates, Rejects, Connects, Disconnects int64
	// Version is the version_info of the rules in force; "" before the
	// first.
	Version string
}

// XDSWatcher keeps the Rules a management server sends current, over the
// aggregated discovery service, state of the world: each response holds
// every RateLimitConfig resource in force (a resource left out is
// removed), and is accepted (ACK) when all are valid, or rejected (NACK,
// with the error) keeping the previous rules. When the stream fails or
// the server goes away, the last rules stay in force while the watcher
// connects again with backoff. It is a RulesSource; its methods are safe
// for concurrent use.
type XDSWatcher struct {
	cfg  XDSConfig
	conn *grpc.ClientConn

	rules  atomic.Pointer[Rules]
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned
	ready  chan struct{} // closed at the first accepted response
	once   sync.Once     // closes ready

	mu    sync.Mutex // guards stats
	stats XDSStats

	// unreadRejected: a response that could not be read was reported
	// since the last one taken. Used by run's goroutine only.
	unreadRejected bool

	closeOnce sync.Once // closes conn
	closeErr  error
}

var _ RulesSource = (*XDSWatcher)(nil)

// WatchXDS starts watching cfg.Addr and returns at once: until the first
// response is accepted, Current has no domains (Ready tells when it
// has). Close stops it.
func WatchXDS(cfg XDSConfig) (*XDSWatcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	cfg.DialOptions = append(append([]grpc.DialOption(nil), cfg.DialOptions...),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxXDSMessageBytes)))
	conn, err := grpc.NewClient(cfg.Addr, cfg.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: xds: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &XDSWatcher{cfg: cfg, conn: conn, cancel: cancel, done: make(chan struct{}), ready: make(chan struct{})}
	empty, _ := NewRules()
	w.rules.Store(empty)
	go w.run(ctx)
	return w, nil
}

// Current returns the rules in force; never nil.
func (w *XDSWatcher) Current() *Rules { return w.rules.Load() }

// Ready is closed once a response has been accepted.
func (w *XDSWatcher) Ready() <-chan struct{} { return w.ready }

// Stats returns the watcher's counters.
func (w *XDSWatcher) Stats() XDSStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// Close stops watching and waits for the watcher's goroutine; Current
// keeps returning the last rules. Safe to call more than once.
func (w *XDSWatcher) Close() error {
	w.cancel()
	<-w.done
	w.closeOnce.Do(func() { w.closeErr = w.conn.Close() })
	return w.closeErr
}

// run keeps a stream open until ctx ends, with backoff between streams.
func (w *XDSWatcher) run(ctx context.Context) {
	defer close(w.done)
	backoff := w.cfg.MinBackoff
	for {
		got, err := w.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		w.count(func(s *XDSStats) { s.Disconnects++ })
		if got {
			backoff = w.cfg.MinBackoff
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		w.cfg.Logger.Warn("envoyrls: xds stream ended; the last configuration stays in force", "addr", w.cfg.Addr, "err", err, "retry_in", wait.String())
		select {
		case <-ctx.Done():
			return
		case <-w.cfg.After(wait):
		}
		backoff = min(backoff*2, w.cfg.MaxBackoff)
	}
}

// stream runs one stream: it asks for every RateLimitConfig, then
// answers each response with an ACK or a NACK. got reports whether a
// response arrived.
func (w *XDSWatcher) stream(ctx context.Context) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(w.conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	w.count(func(s *XDSStats) { s.Connects++ })
	node := &corev3.Node{Id: w.cfg.NodeID, Cluster: w.cfg.NodeCluster}
	// A new stream's first request names no version, so that the server
	// sends its state of the world whatever its version: a server that
	// restarted counts versions afresh (Envoy Gateway's from 1), and
	// go-control-plane's snapshot cache answers a request naming its
	// current version only with resources the stream has not been sent,
	// never with the news that there are none.
	req := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: RateLimitConfigType}
	// A server may send a version it was told is invalid again at once
	// (go-control-plane's snapshot cache does, for every NACK): a repeat
	// is NACKed after a wait that doubles up to MaxBackoff, and reported
	// once.
	var rejected string
	var repeats int
	for {
		if err := s.Send(req); err != nil {
			return got, err
		}
		resp, err := s.Recv()
		if err != nil {
			if status.Code(err) == codes.ResourceExhausted && ctx.Err() == nil {
				w.rejectUnread(err)
			}
			return got, err
		}
		got = true
		req = &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: RateLimitConfigType, ResponseNonce: resp.Nonce}
		rules, err := w.apply(resp)
		if err != nil {
			req.VersionInfo = w.Stats().Version
			msg := boundedText(err.Error())
			req.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: msg}
			if resp.VersionInfo == rejected && rejected != "" {
				repeats++
				select {
				case <-ctx.Done():
					return got, ctx.Err()
				case <-w.cfg.After(w.nackWait(repeats)):
				}
				continue
			}
			rejected, repeats = resp.VersionInfo, 0
			w.count(func(s *XDSStats) { s.Rejects++ })
			w.cfg.Logger.Error("envoyrls: xds configuration rejected; the previous one stays in force", "version", boundedText(resp.VersionInfo), "err", msg)
			if w.cfg.OnReject != nil {
				w.cfg.OnReject(err)
			}
			continue
		}
		rejected, w.unreadRejected = "", false
		w.rules.Store(rules)
		w.count(func(s *XDSStats) { s.Updates++; s.Version = resp.VersionInfo })
		req.VersionInfo = resp.VersionInfo
		w.once.Do(func() { close(w.ready) })
		w.cfg.Logger.Info("envoyrls: xds configuration applied", "version", resp.VersionInfo, "domains", rules.Len())
		if w.cfg.OnUpdate != nil {
			w.cfg.OnUpdate(rules)
		}
	}
}

// boundedText is a text the server sent, or an error naming what it
// sent (a resource's name read from the wire, a key, a type URL), of any
// size and bytes, as a NACK carries it and as it is logged: valid UTF-8
// (a DiscoveryRequest holding anything else cannot be marshalled, so the
// NACK would never be sent) of at most maxNACKMessage bytes.
func boundedText(m string) string {
	const cut = "... (cut)"
	long := len(m) > maxNACKMessage
	if long {
		m = m[:maxNACKMessage] // ToValidUTF8 reads no more than this
	}
	m = strings.ToValidUTF8(m, "\uFFFD")
	if long || len(m) > maxNACKMessage {
		n := maxNACKMessage - len(cut)
		for n > 0 && !utf8.RuneStart(m[n]) {
			n--
		}
		m = m[:n] + cut
	}
	return m
}

// nackWait is the wait before NACKing the repeats-th repeat of a
// version: MinBackoff doubled repeats times, at most MaxBackoff.
func (w *XDSWatcher) nackWait(repeats int) time.Duration {
	wait := w.cfg.MinBackoff
	for range repeats {
		if wait >= w.cfg.MaxBackoff/2 {
			return w.cfg.MaxBackoff
		}
		wait *= 2
	}
	return wait
}

// rejectUnread reports a response the stream could not read, larger
// than MaxXDSMessageBytes (or the server's refusal with the same code):
// it cannot be NACKed, and the stream ends. It is counted and reported
// once until a response is taken, however often the server sends it
// again.
func (w *XDSWatcher) rejectUnread(err error) {
	if w.unreadRejected {
		return
	}
	w.unreadRejected = true
	err = fmt.Errorf("%w: a response could not be read (over %d bytes?): %v", ErrXDSResource, MaxXDSMessageBytes, err)
	w.count(func(s *XDSStats) { s.Rejects++ })
	w.cfg.Logger.Error("envoyrls: xds configuration rejected; the previous one stays in force", "err", err)
	if w.cfg.OnReject != nil {
		w.cfg.OnReject(err)
	}
}

func (w *XDSWatcher) count(f func(*XDSStats)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f(&w.stats)
}

// apply returns the rules of a response, or why it is refused.
func (w *XDSWatcher) apply(resp *discoveryv3.DiscoveryResponse) (*Rules, error) {
	if resp.TypeUrl != RateLimitConfigType {
		return nil, fmt.Errorf("envoyrls: xds: response of type %q, want %q", resp.TypeUrl, RateLimitConfigType)
	}
	return RulesFromXDS(resp.Resources, w.cfg.Load)
}

// ErrXDSResource is wrapped by the error of an invalid xDS resource,
// beside ErrInvalidConfig.
var ErrXDSResource error = &childError{"envoyrls: invalid xds resource", ErrInvalidConfig}

// RulesFromXDS returns the rules of RateLimitConfig resources, each a
// domain, with lc.MergeDomains as for files. Each resource's domain is
// checked as a file's (NewDomain): errors are *ConfigError values whose
// File is "xds:" and the resource's name. A resource of another type,
// more than MaxXDSResources, or descriptors beyond MaxXDSDescriptors or
// MaxXDSDepth are refused.
func RulesFromXDS(resources []*anypb.Any, lc LoadConfig) (*Rules, error) {
	if len(resources) > MaxXDSResources {
		return nil, fmt.Errorf("%w: %d resources, more than %d", ErrXDSResource, len(resources), MaxXDSResources)
	}
	// Counted on the wire first: decoded, a descriptor of two bytes takes
	// a few hundred, and a response may be MaxXDSMessageBytes.
	wire := MaxXDSDescriptors
	for _, res := range resources {
		if res.MessageIs((*rlconfv3.RateLimitConfig)(nil)) {
			if name, err := xdsWireCount(res.Value, &wire); err != nil {
				return nil, &ConfigError{File: "xds:" + name, Err: ErrXDSResource, Message: err.Error()}
			}
		}
	}
	domains := make([]*Domain, 0, len(resources))
	budget := MaxXDSDescriptors
	for i, res := range resources {
		var conf rlconfv3.RateLimitConfig
		if err := res.UnmarshalTo(&conf); err != nil {
			return nil, fmt.Errorf("%w: resource %d: %v", ErrXDSResource, i, err)
		}
		file := "xds:" + conf.Name
		ds, err := xdsDescriptors(conf.Descriptors, 1, &budget)
		if err != nil {
			return nil, &ConfigError{File: file, Err: ErrXDSResource, Message: err.Error()}
		}
		d, err := NewDomain(file, conf.Domain, ds)
		if err != nil {
			return nil, err
		}
		domains = append(domains, d)
	}
	if lc.MergeDomains {
		return MergeRules(domains...)
	}
	return NewRules(domains...)
}

// The fields xdsWireCount reads: of RateLimitConfig, RateLimitDescriptor
// (and xdsMetadataField), RateLimitPolicy, and google.protobuf's Struct,
// its map entries, Value and ListValue.
const (
	xdsConfigNameField        = 1
	xdsConfigDescriptorsField = 3
	xdsRateLimitField         = 3
	xdsDescriptorsField       = 4
	xdsReplacesField          = 5
	xdsStructFieldsField      = 1
	xdsMapValueField          = 2
	xdsStructValueField       = 5
	xdsListValueField         = 6
	xdsListValuesField        = 1
)

// errXDSWireBudget is the error of resources past the budget of
// xdsWireCount.
var errXDSWireBudget = fmt.Errorf("more than %d descriptors, replaces and metadata values", MaxXDSDescriptors)

// xdsWireCount takes the descriptors of b, a RateLimitConfig's wire form,
// their limits' replaces and their metadata's values from budget before b
// is decoded (decoded, each of two bytes on the wire takes a hundred or
// more), and returns the resource's name and an error past the budget or
// MaxXDSDepth. A malformed b is left for the decoder to refuse.
func xdsWireCount(b []byte, budget *int) (name string, err error) {
	err = xdsWireFields(b, func(num protowire.Number, v []byte) error {
		switch num {
		case xdsConfigNameField:
			name = string(v)
		case xdsConfigDescriptorsField:
			return xdsWireDescriptor(v, 1, budget)
		}
		return nil
	})
	return name, err
}

// xdsWireDescriptor takes the descriptor b, at depth, those nested in it,
// its limit's replaces and its metadata's values from budget.
func xdsWireDescriptor(b []byte, depth int, budget *int) error {
	if depth > MaxXDSDepth {
		return fmt.Errorf("descriptors nest deeper than %d levels", MaxXDSDepth)
	}
	if err := take(budget); err != nil {
		return err
	}
	return xdsWireFields(b, func(num protowire.Number, v []byte) error {
		switch num {
		case xdsDescriptorsField:
			return xdsWireDescriptor(v, depth+1, budget)
		case xdsRateLimitField:
			return xdsWireFields(v, func(num protowire.Number, _ []byte) error {
				if num == xdsReplacesField {
					return take(budget)
				}
				return nil
			})
		case xdsMetadataField:
			return xdsWireMetadata(v, false, 1, budget)
		}
		return nil
	})
}

// xdsWireMetadata takes the values of the google.protobuf.Struct b (a
// ListValue with list), at depth, from budget.
func xdsWireMetadata(b []byte, list bool, depth int, budget *int) error {
	if depth > MaxXDSDepth {
		return fmt.Errorf("metadata nests deeper than %d levels", MaxXDSDepth)
	}
	value := func(v []byte) error {
		if err := take(budget); err != nil {
			return err
		}
		return xdsWireFields(v, func(num protowire.Number, v []byte) error {
			switch num {
			case xdsStructValueField:
				return xdsWireMetadata(v, false, depth+1, budget)
			case xdsListValueField:
				return xdsWireMetadata(v, true, depth+1, budget)
			}
			return nil
		})
	}
	return xdsWireFields(b, func(num protowire.Number, v []byte) error {
		switch {
		case list && num == xdsListValuesField:
			return value(v)
		case !list && num == xdsStructFieldsField:
			return xdsWireFields(v, func(num protowire.Number, v []byte) error {
				if num == xdsMapValueField {
					return value(v)
				}
				return nil
			})
		}
		return nil
	})
}

// xdsWireFields calls f with each length-delimited field of the message
// b until f fails; a malformed b ends the walk without error, for the
// decoder to refuse.
func xdsWireFields(b []byte, f func(num protowire.Number, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return nil
		}
		if typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			if err := f(num, v); err != nil {
				return err
			}
		}
		b = b[n:]
	}
	return nil
}

// take takes one element from budget.
func take(budget *int) error {
	if *budget--; *budget < 0 {
		return errXDSWireBudget
	}
	return nil
}

// xdsDescriptors converts descriptors at depth, taking each from budget.
func xdsDescriptors(in []*rlconfv3.RateLimitDescriptor, depth int, budget *int) ([]*Descriptor, error) {
	if len(in) > 0 && depth > MaxXDSDepth { // the children of a leaf at the bound are none
		return nil, fmt.Errorf("descriptors nest deeper than %d levels", MaxXDSDepth)
	}
	out := make([]*Descriptor, 0, len(in))
	for _, x := range in {
		if *budget--; *budget < 0 {
			return nil, fmt.Errorf("more than %d descriptors", MaxXDSDescriptors)
		}
		if x == nil {
			return nil, errors.New("a descriptor is null")
		}
		ds := &Descriptor{Key: x.Key, Value: x.Value, ShadowMode: x.ShadowMode, DetailedMetric: x.DetailedMetric}
		if err := xdsNewerFields(x, ds); err != nil {
			return nil, err
		}
		if p := x.RateLimit; p != nil {
			rl := &RateLimit{Name: p.Name, Unit: Unit(p.Unit), RequestsPerUnit: p.RequestsPerUnit, Unlimited: p.Unlimited}
			// MONTH, YEAR and WEEK are 5, 6 and 7 in the newer
			// definition, as Unit numbers them.
			if u := Unit(p.Unit); u != UnitUnknown && !u.Valid() {
				return nil, fmt.Errorf("descriptor %q: unknown rate limit unit %d", x.Key, p.Unit)
			}
			for _, r := range p.Replaces {
				rl.Replaces = append(rl.Replaces, r.GetName())
			}
			ds.RateLimit = rl
		}
		var err error
		if ds.Descriptors, err = xdsDescriptors(x.Descriptors, depth+1, budget); err != nil {
			return nil, err
		}
		out = append(out, ds)
	}
	return out, nil
}

// The fields of a RateLimitDescriptor that the go-control-plane/ratelimit
// release this module builds with (v0.1.0) does not define, and that
// envoyproxy/ratelimit and newer xDS servers send.
const (
	xdsQuotaModeField = 7 // bool quota_mode
	xdsMetadataField  = 8 // google.protobuf.Struct metadata
)

// xdsNewerFields sets ds's QuotaMode and Metadata from x's fields that
// the generated code keeps as unknown: a server built on a newer
// definition sends them, and dropping quota_mode would enforce a limit
// the server configured as a quota.
func xdsNewerFields(x *rlconfv3.RateLimitDescriptor, ds *Descriptor) error {
	b := x.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("descriptor %q: %v", x.Key, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == xdsQuotaModeField && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return fmt.Errorf("descriptor %q: quota_mode: %v", x.Key, protowire.ParseError(m))
			}
			ds.QuotaMode, n = v != 0, m
		case num == xdsMetadataField && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return fmt.Errorf("descriptor %q: metadata: %v", x.Key, protowire.ParseError(m))
			}
			md := ds.Metadata
			if md == nil {
				md = new(structpb.Struct)
			}
			// A message given in parts merges, as proto.Unmarshal merges.
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, md); err != nil {
				return fmt.Errorf("descriptor %q: metadata: %v", x.Key, err)
			}
			ds.Metadata, n = md, m
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("descriptor %q: field %d: %v", x.Key, num, protowire.ParseError(n))
			}
		}
		b = b[n:]
	}
	return nil
}
