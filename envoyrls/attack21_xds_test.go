package envoyrls

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice/internal/testwait"
)

// emptyDescriptors is the wire form of a RateLimitConfig named name of
// domain name with n empty descriptors: two bytes each.
func emptyDescriptors(name string, n int) *anypb.Any {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = append(b, bytes.Repeat([]byte{0x1a, 0x00}, n)...) // field 3, descriptors, of length 0
	return &anypb.Any{TypeUrl: RateLimitConfigType, Value: b}
}

// oneDescriptor is the wire form of a RateLimitConfig named name of
// domain name with the one descriptor d (its wire form).
func oneDescriptor(name string, d []byte) *anypb.Any {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, name)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendBytes(b, d)
	return &anypb.Any{TypeUrl: RateLimitConfigType, Value: b}
}

// manyReplaces is a descriptor "k" whose limit replaces n limits with
// empty names: two bytes each.
func manyReplaces(n int) []byte {
	var rl []byte
	rl = protowire.AppendTag(rl, 1, protowire.VarintType)
	rl = protowire.AppendVarint(rl, 2)
	rl = protowire.AppendTag(rl, 2, protowire.VarintType)
	rl = protowire.AppendVarint(rl, 1)
	rl = append(rl, bytes.Repeat([]byte{0x2a, 0x00}, n)...) // field 5, replaces, of length 0
	var d []byte
	d = protowire.AppendTag(d, 1, protowire.BytesType)
	d = protowire.AppendString(d, "k")
	d = protowire.AppendTag(d, 3, protowire.BytesType)
	return protowire.AppendBytes(d, rl)
}

// manyMetadataValues is a descriptor "k" whose metadata (field 8) is
// {a: [n null values]}: two bytes each.
func manyMetadataValues(n int) []byte {
	list := bytes.Repeat([]byte{0x0a, 0x00}, n) // ListValue.values, an empty Value
	val := protowire.AppendBytes(protowire.AppendTag(nil, 6, protowire.BytesType), list)
	entry := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "a")
	entry = protowire.AppendBytes(protowire.AppendTag(entry, 2, protowire.BytesType), val)
	st := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), entry)
	d := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "k")
	return protowire.AppendBytes(protowire.AppendTag(d, 8, protowire.BytesType), st)
}

// A response past MaxXDSDescriptors is refused before its descriptors are
// decoded: two bytes on the wire each, they took 120 times their size in
// memory when decoded first (480 MB for 2,000,000 descriptors in 4 MB;
// MaxXDSMessageBytes lets a server send 64 MiB), in one resource or
// spread over several each under the bound; so are the replaces of a
// limit and the values of a descriptor's metadata, which count with
// them. The error names the bound.
func TestAttackXDSHugeResourceBoundedMemory(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  []*anypb.Any
		file string
	}{
		{"one resource", []*anypb.Any{emptyDescriptors("huge", 2*MaxXDSDescriptors)}, "xds:huge"},
		{"three resources", []*anypb.Any{
			emptyDescriptors("r1", MaxXDSDescriptors/2), emptyDescriptors("r2", MaxXDSDescriptors/2), emptyDescriptors("r3", MaxXDSDescriptors/2),
		}, "xds:r3"},
		// Replaces and metadata values are not descriptors, and took 92
		// and 52 times their size (the metadata was accepted, and
		// copied into every response with dynamic metadata).
		{"replaces", []*anypb.Any{oneDescriptor("rep", manyReplaces(2*MaxXDSDescriptors))}, "xds:rep"},
		{"metadata values", []*anypb.Any{oneDescriptor("md", manyMetadataValues(2*MaxXDSDescriptors))}, "xds:md"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wire := 0
			for _, r := range tc.res {
				wire += len(r.Value)
			}
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := RulesFromXDS(tc.res, LoadConfig{})
			runtime.ReadMemStats(&after)
			allocated := after.TotalAlloc - before.TotalAlloc
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.file+": more than 1000000 descriptors") {
				t.Errorf("error %v, want %s: more than 1000000 descriptors", err, tc.file)
			}
			if allocated > uint64(wire) {
				t.Errorf("refusing %d bytes of descriptors allocated %d MB", wire, allocated>>20)
			}
		})
	}
}

// scriptedADS is an aggregated discovery server whose responses the test
// writes one by one, and whose requests it reads in turn: a transcript of
// the watcher's side of the protocol.
type scriptedADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	addr string
	srv  *grpc.Server
	reqs chan *discoveryv3.DiscoveryRequest
	out  chan *discoveryv3.DiscoveryResponse
}

// startScriptedADS serves on addr ("127.0.0.1:0" for a new port) until
// stopped or the test ends.
func startScriptedADS(t *testing.T, addr string) *scriptedADS {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &scriptedADS{addr: lis.Addr().String(), srv: grpc.NewServer(),
		reqs: make(chan *discoveryv3.DiscoveryRequest, 100), out: make(chan *discoveryv3.DiscoveryResponse, 100)}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.srv, s)
	go s.srv.Serve(lis)
	t.Cleanup(s.srv.Stop)
	return s
}

func (s *scriptedADS) StreamAggregatedResources(st discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	go func() {
		for {
			select {
			case <-st.Context().Done():
				return
			case r := <-s.out:
				if st.Send(r) != nil {
					return
				}
			}
		}
	}()
	for {
		r, err := st.Recv()
		if err != nil {
			return err
		}
		s.reqs <- r
	}
}

// next returns the next request the watcher sent.
func (s *scriptedADS) next(t *testing.T) *discoveryv3.DiscoveryRequest {
	t.Helper()
	select {
	case r := <-s.reqs:
		return r
	case <-time.After(testwait.Timeout):
		t.Fatal("no request from the watcher")
		return nil
	}
}

// send sends a response of version and nonce holding configs.
func (s *scriptedADS) send(t *testing.T, version, nonce string, configs ...*rlconfv3.RateLimitConfig) {
	t.Helper()
	resp := &discoveryv3.DiscoveryResponse{VersionInfo: version, Nonce: nonce, TypeUrl: RateLimitConfigType}
	for _, c := range configs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		resp.Resources = append(resp.Resources, a)
	}
	s.out <- resp
}

// wantRequest fails the test unless r names version and nonce and has an
// error detail containing nack ("" for an ACK).
func wantRequest(t *testing.T, step string, r *discoveryv3.DiscoveryRequest, version, nonce, nack string) {
	t.Helper()
	got := r.GetErrorDetail().GetMessage()
	if r.VersionInfo != version || r.ResponseNonce != nonce || r.TypeUrl != RateLimitConfigType || r.Node.GetId() != "sluice" ||
		(nack == "") != (got == "") || !strings.Contains(got, nack) {
		t.Errorf("%s: request version %q nonce %q type %q node %q error %q; want version %q nonce %q error with %q",
			step, r.VersionInfo, r.ResponseNonce, r.TypeUrl, r.Node.GetId(), got, version, nonce, nack)
	}
}

// domainsOf lists the domains of rules.
func domainsOf(w *XDSWatcher) string {
	var names []string
	for _, n := range []string{"a", "b", "c"} {
		if _, ok := w.Current().Domain(n); ok {
			names = append(names, n)
		}
	}
	return strings.Join(names, ",")
}

// The watcher's side of the protocol, step by step against a server that
// does what a real one may: replays an old version, sends a removal then
// the resource again, an invalid version twice in a row, a response of
// another type, then goes away and a server with another identity
// answers at the same address, its versions counting from 1 again. Each
// ACK names the version taken and the response's nonce; each NACK the
// last version taken, the nonce and the error; a repeated invalid version
// waits, is NACKed and counted once.
func TestAttackXDSTranscript(t *testing.T) {
	srv := startScriptedADS(t, "127.0.0.1:0")
	cfg := DefaultXDSConfig()
	cfg.Addr, cfg.NodeID = srv.addr, "sluice"
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 8*time.Millisecond
	var mu sync.Mutex
	var waits []time.Duration
	var rejected []error
	cfg.After = func(d time.Duration) <-chan time.Time {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		c := make(chan time.Time, 1)
		c <- testStart
		return c
	}
	cfg.OnReject = func(err error) { mu.Lock(); rejected = append(rejected, err); mu.Unlock() }
	w, err := WatchXDS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	a, b := rlConfig("a", "a", "user", 1), rlConfig("b", "b", "ip", 1)
	bad := rlConfig("bad", "c", "user", 1)
	bad.Descriptors[0].RateLimit.Unit = rlconfv3.RateLimitUnit_UNKNOWN
	steps := []struct {
		name           string
		send           func()
		version, nonce string // of the request that follows
		nack           string
		domains        string
	}{
		{"v2", func() { srv.send(t, "2", "n1", a, b) }, "2", "n1", "", "a,b"},
		{"the old v1 replayed", func() { srv.send(t, "1", "n2", a) }, "1", "n2", "", "a"},
		{"every resource removed", func() { srv.send(t, "3", "n3") }, "3", "n3", "", ""},
		{"one added again", func() { srv.send(t, "4", "n4", b) }, "4", "n4", "", "b"},
		{"an invalid version", func() { srv.send(t, "5", "n5", b, bad) }, "4", "n5", "xds:bad", "b"},
		{"the invalid version again", func() { srv.send(t, "5", "n6", b, bad) }, "4", "n6", "xds:bad", "b"},
		{"another type", func() {
			srv.out <- &discoveryv3.DiscoveryResponse{VersionInfo: "6", Nonce: "n7", TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"}
		}, "4", "n7", "response of type", "b"},
		{"v7", func() { srv.send(t, "7", "n8", a, b) }, "7", "n8", "", "a,b"},
	}
	wantRequest(t, "the first request", srv.next(t), "", "", "")
	for _, s := range steps {
		s.send()
		wantRequest(t, s.name, srv.next(t), s.version, s.nonce, s.nack)
		if got := domainsOf(w); got != s.domains {
			t.Errorf("%s: domains %q, want %q", s.name, got, s.domains)
		}
	}
	if s := w.Stats(); s.Updates != 5 || s.Rejects != 2 || s.Version != "7" {
		t.Errorf("stats %+v, want 5 updates, 2 rejects, version 7", s)
	}
	mu.Lock()
	if len(rejected) != 2 || len(waits) != 1 || waits[0] != 2*time.Millisecond {
		t.Errorf("rejections %v, waits %v: want 2 and one wait of 2ms before NACKing the repeat", rejected, waits)
	}
	mu.Unlock()

	// Another server at the same address, counting its versions from 1:
	// the new stream's first request names no version and no nonce, and
	// its "2" is taken though the watcher took a "2" from the first.
	srv.srv.Stop()
	testwait.For(t, "the stream to end", func() bool { return w.Stats().Disconnects > 0 })
	srv2 := startScriptedADS(t, srv.addr)
	wantRequest(t, "the new stream's first request", srv2.next(t), "", "", "")
	srv2.send(t, "2", "m1", rlConfig("c", "c", "user", 1))
	wantRequest(t, "the new server's 2", srv2.next(t), "2", "m1", "")
	if got := domainsOf(w); got != "c" {
		t.Errorf("after the new server: domains %q, want c", got)
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close again: %v", err)
	}
}

// A response larger than MaxXDSMessageBytes cannot be read, so cannot be
// NACKed: the stream ends. The last rules stay, the watcher connects
// again with backoff, and the refusal is counted as a rejection and
// given to OnReject, naming the bound, once until a response is taken.
func TestAttackXDSResponseOverMessageBound(t *testing.T) {
	srv := startScriptedADS(t, "127.0.0.1:0")
	cfg := DefaultXDSConfig()
	cfg.Addr, cfg.NodeID = srv.addr, "sluice"
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, time.Millisecond
	var mu sync.Mutex
	var rejected []error
	cfg.OnReject = func(err error) { mu.Lock(); rejected = append(rejected, err); mu.Unlock() }
	w, err := WatchXDS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	srv.next(t)
	srv.send(t, "1", "n1", rlConfig("a", "a", "user", 1))
	wantRequest(t, "v1", srv.next(t), "1", "n1", "")

	huge := &discoveryv3.DiscoveryResponse{VersionInfo: "2", Nonce: "n2", TypeUrl: RateLimitConfigType,
		Resources: []*anypb.Any{{TypeUrl: RateLimitConfigType, Value: make([]byte, MaxXDSMessageBytes)}}}
	srv.out <- huge
	wantRequest(t, "the new stream after the huge response", srv.next(t), "", "", "")
	srv.out <- huge
	wantRequest(t, "the new stream after the huge response again", srv.next(t), "", "", "")
	if got := domainsOf(w); got != "a" {
		t.Errorf("domains %q after the huge response, want a", got)
	}
	s := w.Stats()
	mu.Lock()
	defer mu.Unlock()
	if s.Rejects != 1 || len(rejected) != 1 || !strings.Contains(rejected[0].Error(), "larger than max") {
		t.Errorf("stats %+v, rejections %v: want one, naming the bound", s, rejected)
	}
}

// Callers check while go-control-plane's server sends a new state of the
// world 30 times, the limit of domain "a" alternating between 5 and 7
// and domain "b" coming and going: each response is decided under one
// version, its two descriptors under the same limit, never one of each.
func TestAttackXDSUpdatesUnderTraffic(t *testing.T) {
	cache := cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	setSnapshot(t, cache, "v0", rlConfig("a", "a", "user", 5))
	srv := startXDSServer(t, cache, "127.0.0.1:0")
	cfg := DefaultXDSConfig()
	cfg.Addr, cfg.NodeID = srv.addr, "sluice"
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	w, err := WatchXDS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	testwait.For(t, "the first snapshot", func() bool { return w.Stats().Version == "v0" })
	e := newEnv(t, nil, func(c *Config) { c.Rules = w })

	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	var calls atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				calls.Add(1)
				resp, err := e.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "a", Descriptors: []*rlcommon.RateLimitDescriptor{
					desc(fmt.Sprintf("user=%d-%d-x", g, i)), desc(fmt.Sprintf("user=%d-%d-y", g, i))}})
				if err != nil {
					errs <- err.Error()
					return
				}
				l0, l1 := resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit(), resp.Statuses[1].GetCurrentLimit().GetRequestsPerUnit()
				if l0 != l1 || (l0 != 5 && l0 != 7) {
					errs <- fmt.Sprintf("caller %d call %d: limits %d and %d in one response", g, i, l0, l1)
					return
				}
			}
		})
	}
	for v := 1; v <= 30; v++ {
		configs := []*rlconfv3.RateLimitConfig{rlConfig("a", "a", "user", uint32(5+2*(v%2)))}
		if v%3 == 0 {
			configs = append(configs, rlConfig("b", "b", "ip", 1))
		}
		version := fmt.Sprintf("v%d", v)
		setSnapshot(t, cache, version, configs...)
		testwait.For(t, version, func() bool { return w.Stats().Version == version })
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d calls across 30 updates", calls.Load())
}

// A server sending the same invalid version again and again is NACKed
// after waits that double up to MaxBackoff and never go negative, even
// from a MinBackoff of hours doubled 20 times (past the range of a
// time.Duration), where a negative wait would let the two spin.
func TestAttackXDSRepeatedNACKWaitsStayPositive(t *testing.T) {
	srv := startScriptedADS(t, "127.0.0.1:0")
	cfg := DefaultXDSConfig()
	cfg.Addr, cfg.NodeID = srv.addr, "sluice"
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	cfg.MinBackoff, cfg.MaxBackoff = 3*time.Hour, 1000*time.Hour
	var mu sync.Mutex
	var waits []time.Duration
	cfg.After = func(d time.Duration) <-chan time.Time {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		c := make(chan time.Time, 1)
		c <- testStart
		return c
	}
	w, err := WatchXDS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	srv.next(t)
	bad := rlConfig("bad", "c", "user", 1)
	bad.Descriptors[0].RateLimit.Unit = rlconfv3.RateLimitUnit_UNKNOWN
	for i := range 25 {
		srv.send(t, "5", fmt.Sprint("n", i), bad)
		wantRequest(t, fmt.Sprint("NACK ", i), srv.next(t), "", fmt.Sprint("n", i), "xds:bad")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(waits) != 24 {
		t.Fatalf("%d waits, want 24", len(waits))
	}
	for i, d := range waits {
		want := cfg.MinBackoff
		for k := 0; k <= i && want < cfg.MaxBackoff; k++ {
			want *= 2
		}
		if want = min(want, cfg.MaxBackoff); d != want {
			t.Errorf("wait %d: %v, want %v", i, d, want)
		}
	}
}

// deepWithName is the wire form of a RateLimitConfig whose name is the
// bytes name, of domain "d", with one descriptor nested past MaxXDSDepth:
// refused while counted on the wire, before the name is decoded.
func deepWithName(name string) *anypb.Any {
	var d []byte
	for range MaxXDSDepth + 1 {
		inner := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "k")
		if d != nil {
			inner = protowire.AppendBytes(protowire.AppendTag(inner, 4, protowire.BytesType), d)
		}
		d = inner
	}
	var b []byte
	b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), name)
	b = protowire.AppendString(protowire.AppendTag(b, 2, protowire.BytesType), "d")
	b = protowire.AppendBytes(protowire.AppendTag(b, 3, protowire.BytesType), d)
	return &anypb.Any{TypeUrl: RateLimitConfigType, Value: b}
}

// A NACK carries the error of the response it refuses, which names what
// the server sent: a resource's name that is not UTF-8 (read from the
// wire before decoding), a name, a key or a type URL of a megabyte. Each
// response is NACKed on the same stream with a message that is valid
// UTF-8 (a DiscoveryRequest with any other cannot be marshalled, and the
// NACK would never leave: the stream would end and start again, the
// response rejected anew each time) and at most maxNACKMessage bytes (a
// server reads requests of a few MiB at most), naming the bound that was
// broken.
func TestAttackXDSNACKOfHostileNames(t *testing.T) {
	srv := startScriptedADS(t, "127.0.0.1:0")
	cfg := DefaultXDSConfig()
	cfg.Addr, cfg.NodeID = srv.addr, "sluice"
	cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	cfg.MinBackoff, cfg.MaxBackoff = time.Millisecond, 8*time.Millisecond
	w, err := WatchXDS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	wantRequest(t, "the first request", srv.next(t), "", "", "")
	srv.send(t, "1", "n1", rlConfig("a", "a", "user", 1))
	wantRequest(t, "v1", srv.next(t), "1", "n1", "")
	huge := strings.Repeat("x", 1<<20)
	noDomain := rlConfig(huge, "", "user", 1)
	badUnit := rlConfig("u", "u", huge, 1)
	badUnit.Descriptors[0].RateLimit.Unit = 9
	for i, s := range []struct {
		name string
		resp *discoveryv3.DiscoveryResponse
		nack string
	}{
		{"a name not UTF-8, nested too deep", &discoveryv3.DiscoveryResponse{Resources: []*anypb.Any{deepWithName("bad\xff\xfename")}}, "nest deeper than 100"},
		{"a name of a megabyte, no domain", &discoveryv3.DiscoveryResponse{Resources: []*anypb.Any{func() *anypb.Any { a, _ := anypb.New(noDomain); return a }()}}, "xds:xxx"},
		{"a key of a megabyte, a bad unit", &discoveryv3.DiscoveryResponse{Resources: []*anypb.Any{func() *anypb.Any { a, _ := anypb.New(badUnit); return a }()}}, "xds:u"},
		{"a type of a megabyte", &discoveryv3.DiscoveryResponse{TypeUrl: "type.googleapis.com/" + huge}, "response of type"},
	} {
		version, nonce := fmt.Sprint(i+2), fmt.Sprint("m", i)
		s.resp.VersionInfo, s.resp.Nonce = version, nonce
		if s.resp.TypeUrl == "" {
			s.resp.TypeUrl = RateLimitConfigType
		}
		srv.out <- s.resp
		r := srv.next(t)
		msg := r.GetErrorDetail().GetMessage()
		wantRequest(t, s.name, r, "1", nonce, s.nack)
		if !utf8.ValidString(msg) || len(msg) > maxNACKMessage {
			t.Errorf("%s: NACK message of %d bytes, valid UTF-8 %v; want at most %d", s.name, len(msg), utf8.ValidString(msg), maxNACKMessage)
		}
		if got := domainsOf(w); got != "a" {
			t.Errorf("%s: domains %q, want a", s.name, got)
		}
	}
	if s := w.Stats(); s.Connects != 1 || s.Rejects != 4 {
		t.Errorf("stats %+v: want one stream, 4 rejects", s)
	}
}

// The bounds of an xDS response hold at their values exactly: 1000
// resources, descriptors nested 100 levels, 1,000,000 descriptors in all
// are taken; one more of each is refused, naming the bound.
func TestAttackXDSAtTheBounds(t *testing.T) {
	anyOf := func(c *rlconfv3.RateLimitConfig) *anypb.Any {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	resources := func(n int) []*anypb.Any {
		out := make([]*anypb.Any, n)
		for i := range out {
			out[i] = anyOf(rlConfig(fmt.Sprint("r", i), fmt.Sprint("d", i), "k", 1))
		}
		return out
	}
	nested := func(levels int) []*anypb.Any {
		d := &rlconfv3.RateLimitDescriptor{Key: "k", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1}}
		for range levels - 1 {
			d = &rlconfv3.RateLimitDescriptor{Key: "k", Descriptors: []*rlconfv3.RateLimitDescriptor{d}}
		}
		return []*anypb.Any{anyOf(&rlconfv3.RateLimitConfig{Name: "n", Domain: "n", Descriptors: []*rlconfv3.RateLimitDescriptor{d}})}
	}
	// n descriptors: one with a limit, the rest empty keys' siblings of
	// distinct values.
	flat := func(n int) []*anypb.Any {
		var b []byte
		b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), "f")
		b = protowire.AppendString(protowire.AppendTag(b, 2, protowire.BytesType), "f")
		for i := range n {
			d := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "k")
			d = protowire.AppendString(protowire.AppendTag(d, 2, protowire.BytesType), strconv.Itoa(i))
			b = protowire.AppendBytes(protowire.AppendTag(b, 3, protowire.BytesType), d)
		}
		return []*anypb.Any{{TypeUrl: RateLimitConfigType, Value: b}}
	}
	for _, tc := range []struct {
		name string
		res  []*anypb.Any
		want string // "" to be taken
	}{
		{"1000 resources", resources(MaxXDSResources), ""},
		{"1001 resources", resources(MaxXDSResources + 1), "1001 resources, more than 1000"},
		{"100 levels", nested(MaxXDSDepth), ""},
		{"101 levels", nested(MaxXDSDepth + 1), "nest deeper than 100"},
		{"1,000,000 descriptors", flat(MaxXDSDescriptors), ""},
		{"1,000,001 descriptors", flat(MaxXDSDescriptors + 1), "more than 1000000"},
	} {
		r, err := RulesFromXDS(tc.res, LoadConfig{})
		switch {
		case tc.want == "" && (err != nil || r.Len() == 0):
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (!errors.Is(err, ErrXDSResource) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}
