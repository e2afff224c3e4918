package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// echoChecker decides each request from its own fields, so that a test can
// check every field of both conversions, and records what it was given.
type echoChecker struct {
	owner string
	short bool // break the contract: return one result too few

	mu   sync.Mutex
	got  []limiter.Request
	from []string
}

var _ Checker = (*echoChecker)(nil)

func (e *echoChecker) CheckMany(ctx context.Context, reqs []limiter.Request) []Result {
	from, _ := PeerFromContext(ctx)
	e.mu.Lock()
	e.got = append(e.got, reqs...)
	e.from = append(e.from, from)
	e.mu.Unlock()
	out := make([]Result, len(reqs))
	for i, r := range reqs {
		out[i] = echo(r, e.owner)
	}
	if e.short {
		out = out[:len(out)-1]
	}
	return out
}

func (e *echoChecker) requests() []limiter.Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]limiter.Request(nil), e.got...)
}

// echo is the decision echoChecker makes for r; keys "fail:burst" and
// "fail:down" give errors instead.
func echo(r limiter.Request, owner string) Result {
	switch r.Key {
	case "fail:burst":
		return Result{Decision: sluice.Decision{Owner: owner}, Err: fmt.Errorf("%w: Burst 3 is too small for the store", limiter.ErrInvalidBurst)}
	case "fail:down":
		return Result{Decision: sluice.Decision{Owner: owner}, Err: fmt.Errorf("%w: node-z did not answer", ErrUnavailable)}
	}
	return Result{Decision: sluice.Decision{Owner: owner, WithoutOwner: r.Behavior&limiter.Reset != 0, Decision: limiter.Decision{
		Allowed:    r.Hits%2 == 1,
		Limit:      r.Limit,
		Remaining:  r.Limit - r.Hits,
		ResetAt:    time.Unix(1_700_000_000, int64(r.Period)).UTC(),
		RetryAfter: r.Period,
		Delay:      time.Duration(r.Burst),
	}}}
}

// startServer serves what register registers on 127.0.0.1:0, with the
// default limits, and returns a connection to it. Both are closed at the
// end of the test.
func startServer(t *testing.T, register func(s *grpc.Server)) *grpc.ClientConn {
	t.Helper()
	return dial(t, serve(t, DefaultServerLimits(), register), grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// serve serves what register registers on 127.0.0.1:0, with limits l and
// the extra options, and returns its address. The server stops at the end
// of the test.
func serve(t *testing.T, l ServerLimits, register func(s *grpc.Server), extra ...grpc.ServerOption) string {
	t.Helper()
	b, err := NewMessageBudget(l)
	if err != nil {
		t.Fatal(err)
	}
	return serveBudget(t, b, register, extra...)
}

// serveBudget is serve with the limits of the message budget b, which
// the server uses.
func serveBudget(t *testing.T, b *MessageBudget, register func(s *grpc.Server), extra ...grpc.ServerOption) string {
	t.Helper()
	lis, err := b.limits.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, lis, b, register, extra...)
}

// serveOn serves on lis with b's options and extra, until the test ends,
// and returns lis's address.
func serveOn(t *testing.T, lis net.Listener, b *MessageBudget, register func(s *grpc.Server), extra ...grpc.ServerOption) string {
	t.Helper()
	s := grpc.NewServer(append(b.ServerOptions(), extra...)...)
	register(s)
	served := make(chan error, 1)
	go func() { served <- s.Serve(lis) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr().String()
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// checkResult fails unless got is the echo of want.
func checkResult(t *testing.T, i int, got Result, want limiter.Request, owner string) {
	t.Helper()
	exp := echo(want, owner)
	if got.Err != nil {
		t.Fatalf("item %d: %v", i, got.Err)
	}
	if got.Owner != exp.Owner || got.WithoutOwner != exp.WithoutOwner || !got.Decision.ResetAt.Equal(exp.Decision.ResetAt) {
		t.Fatalf("item %d: got %+v, want %+v", i, got, exp)
	}
	got.Decision.ResetAt, exp.Decision.ResetAt = time.Time{}, time.Time{}
	if got.Decision != exp.Decision {
		t.Fatalf("item %d: decision %+v, want %+v", i, got.Decision, exp.Decision)
	}
}

func TestPeerRoundTripsEveryField(t *testing.T) {
	chk := &echoChecker{owner: "node-b"}
	conn := startServer(t, func(s *grpc.Server) { RegisterPeer(s, chk) })
	reqs := validRequests(t)
	in := &pb.PeerCheckRequest{From: "node-a"}
	for _, r := range reqs {
		in.Items = append(in.Items, RequestToProto(r))
	}
	resp, err := pb.NewPeerClient(conn).CheckBatch(ctxT(t), in)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Items) != len(reqs) {
		t.Fatalf("%d responses for %d items", len(resp.Items), len(reqs))
	}
	got := chk.requests()
	for i, r := range reqs {
		sameRequest(t, r, got[i])
		checkResult(t, i, ResultFromProto(resp.Items[i]), r, "node-b")
	}
	if chk.from[0] != "node-a" {
		t.Fatalf("PeerFromContext = %q, want node-a", chk.from[0])
	}
}

func TestPeerPerItemErrorsKeepIdentity(t *testing.T) {
	chk := &echoChecker{owner: "node-b"}
	conn := startServer(t, func(s *grpc.Server) { RegisterPeer(s, chk) })
	ok := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.TokenBucket}
	badLimit := ok
	badLimit.Limit = 0
	badAlg := RequestToProto(ok)
	badAlg.Algorithm = 42
	badZone := RequestToProto(ok)
	badZone.TimeZone = "No/Such_Zone"
	failBurst := ok
	failBurst.Key = "fail:burst"
	failDown := ok
	failDown.Key = "fail:down"
	ok2 := ok
	ok2.Hits = 2

	items := []*pb.RateLimitRequest{RequestToProto(ok), RequestToProto(badLimit), badAlg, RequestToProto(ok2), badZone, RequestToProto(failBurst), RequestToProto(failDown)}
	want := []error{nil, limiter.ErrInvalidLimit, limiter.ErrUnknownAlgorithm, nil, limiter.ErrInvalidCalendar, limiter.ErrInvalidBurst, ErrUnavailable}
	inText := []string{"", "Limit 0", "algorithm 42", "", "time_zone", "Burst 3", "node-z"}

	resp, err := pb.NewPeerClient(conn).CheckBatch(ctxT(t), &pb.PeerCheckRequest{Items: items})
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range resp.Items {
		r := ResultFromProto(m)
		if !errors.Is(r.Err, want[i]) || (want[i] == nil) != (r.Err == nil) {
			t.Fatalf("item %d: err %v, want %v", i, r.Err, want[i])
		}
		if r.Err != nil && !strings.Contains(r.Err.Error(), inText[i]) {
			t.Fatalf("item %d: %q does not say %q", i, r.Err, inText[i])
		}
	}
	checkResult(t, 0, ResultFromProto(resp.Items[0]), ok, "node-b")
	checkResult(t, 3, ResultFromProto(resp.Items[3]), ok2, "node-b")
	// Only the items that converted reached the checker, in order.
	if got := chk.requests(); len(got) != 4 || got[0] != ok || got[1] != ok2 || got[2] != failBurst || got[3] != failDown {
		t.Fatalf("checker got %+v", got)
	}
}

func TestPeerShortCheckerFailsMissingItems(t *testing.T) {
	chk := &echoChecker{owner: "b", short: true}
	conn := startServer(t, func(s *grpc.Server) { RegisterPeer(s, chk) })
	r := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.GCRA}
	resp, err := pb.NewPeerClient(conn).CheckBatch(ctxT(t), &pb.PeerCheckRequest{Items: []*pb.RateLimitRequest{RequestToProto(r), RequestToProto(r)}})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, 0, ResultFromProto(resp.Items[0]), r, "b")
	if err := ResultFromProto(resp.Items[1]).Err; !errors.Is(err, ErrInternal) {
		t.Fatalf("missing result: %v, want ErrInternal", err)
	}
}

func TestBatchLimits(t *testing.T) {
	chk := &echoChecker{owner: "b"}
	conn := startServer(t, func(s *grpc.Server) {
		RegisterPeer(s, chk)
		RegisterPublic(s, LocalRouter(chk), nil, WithMaxBatchItems(2))
	})
	item := RequestToProto(limiter.Request{Name: "n", Key: strings.Repeat("k", limiter.MaxKeyLen), Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.GCRA})
	batch := func(n int) []*pb.RateLimitRequest {
		items := make([]*pb.RateLimitRequest, n)
		for i := range items {
			items[i] = item
		}
		return items
	}
	peer := pb.NewPeerClient(conn)
	if resp, err := peer.CheckBatch(ctxT(t), &pb.PeerCheckRequest{Items: batch(MaxBatchItems)}); err != nil || len(resp.Items) != MaxBatchItems {
		t.Fatalf("full batch of the largest keys: %v", err)
	}
	_, err := peer.CheckBatch(ctxT(t), &pb.PeerCheckRequest{Items: batch(MaxBatchItems + 1)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "1001") {
		t.Fatalf("oversized batch: %v", err)
	}
	public := pb.NewSluiceClient(conn)
	if _, err := public.CheckBatch(ctxT(t), &pb.BatchCheckRequest{Requests: batch(2)}); err != nil {
		t.Fatal(err)
	}
	_, err = public.CheckBatch(ctxT(t), &pb.BatchCheckRequest{Requests: batch(3)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "batch of 3 items") {
		t.Fatalf("batch over WithMaxBatchItems: %v", err)
	}
	// An empty batch is fine and reaches no checker.
	n := len(chk.requests())
	if resp, err := peer.CheckBatch(ctxT(t), &pb.PeerCheckRequest{}); err != nil || len(resp.Items) != 0 {
		t.Fatalf("empty batch: %v, %v", resp, err)
	}
	if len(chk.requests()) != n {
		t.Fatal("empty batch reached the checker")
	}
}

// rawCodec sends and receives *[]byte as they are, under the proto codec's
// name, to put arbitrary bytes on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

func TestGarbageOnTheWire(t *testing.T) {
	chk := &echoChecker{owner: "b"}
	conn := startServer(t, func(s *grpc.Server) {
		RegisterPeer(s, chk)
		RegisterPublic(s, LocalRouter(chk), nil)
	})
	invalidUTF8, err := proto.Marshal(&pb.PeerCheckRequest{From: "a"})
	if err != nil {
		t.Fatal(err)
	}
	invalidUTF8 = append(invalidUTF8, 0x12, 0x04, 0x0a, 0x02, 0xc3, 0x28) // items[0].name = "\xc3\x28"
	for _, tt := range []struct {
		name string
		data []byte
		want codes.Code
	}{
		{"truncated varint", []byte{0x12, 0xff}, codes.InvalidArgument},
		{"length past end", []byte{0x12, 0x7f, 0x01}, codes.InvalidArgument},
		{"invalid UTF-8", invalidUTF8, codes.InvalidArgument},
		{"too large", make([]byte, MaxMessageSize+1), codes.ResourceExhausted},
	} {
		for _, method := range []string{"/sluice.v1.Peer/CheckBatch", "/sluice.v1.Sluice/CheckBatch", "/sluice.v1.Sluice/Check"} {
			var reply []byte
			err := conn.Invoke(ctxT(t), method, &tt.data, &reply, grpc.ForceCodec(rawCodec{}))
			if status.Code(err) != tt.want {
				t.Errorf("%s to %s: %v, want %v", tt.name, method, err, tt.want)
			}
		}
		// On the stream, garbage ends the stream with the same code.
		stream, err := conn.NewStream(ctxT(t), &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/sluice.v1.Peer/CheckStream", grpc.ForceCodec(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.SendMsg(&tt.data); err != nil && err != io.EOF {
			t.Fatal(err)
		}
		var reply []byte
		if err := stream.RecvMsg(&reply); status.Code(err) != tt.want {
			t.Errorf("%s on CheckStream: %v, want %v", tt.name, err, tt.want)
		}
	}
	if len(chk.requests()) != 0 {
		t.Fatal("garbage reached the checker")
	}
	// Unknown fields are skipped; an empty item is invalid on its own.
	data := []byte{0xfa, 0x3f, 0x01, 0x00, 0x12, 0x00} // field 1023 varint 0, then an empty items[0]
	var reply []byte
	if err := conn.Invoke(ctxT(t), "/sluice.v1.Peer/CheckBatch", &data, &reply, grpc.ForceCodec(rawCodec{})); err != nil {
		t.Fatal(err)
	}
	resp := new(pb.PeerCheckResponse)
	if err := proto.Unmarshal(reply, resp); err != nil || len(resp.Items) != 1 {
		t.Fatalf("reply %v, %v", resp, err)
	}
	if err := ResultFromProto(resp.Items[0]).Err; !errors.Is(err, limiter.ErrUnknownAlgorithm) {
		t.Fatalf("empty item: %v", err)
	}
}

func TestNilMessages(t *testing.T) {
	chk := &echoChecker{owner: "b"}
	ps := &peerServer{cfg: newServerConfig(nil), local: chk}
	if _, err := ps.CheckBatch(context.Background(), nil); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("nil PeerCheckRequest: %v", err)
	}
	ok := RequestToProto(limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 1, Period: time.Second, Algorithm: limiter.TokenBucket})
	resp, err := ps.CheckBatch(context.Background(), &pb.PeerCheckRequest{Items: []*pb.RateLimitRequest{nil, ok}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ResultFromProto(resp.Items[0]).Err; !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("nil item: %v", err)
	}
	if err := ResultFromProto(resp.Items[1]).Err; err != nil {
		t.Fatalf("item after a nil one: %v", err)
	}
	pub := &publicServer{cfg: newServerConfig(nil), routed: LocalRouter(chk)}
	if _, err := pub.Check(context.Background(), nil); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("nil CheckRequest: %v", err)
	}
	if _, err := pub.CheckBatch(context.Background(), nil); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("nil BatchCheckRequest: %v", err)
	}
	if _, err := pub.Health(context.Background(), nil); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Health without a Health: %v", err)
	}
}

// policyRouter records the policies it is given and echoes the requests.
type policyRouter struct {
	mu       sync.Mutex
	policies []sluice.Policy
}

func (p *policyRouter) Route(ctx context.Context, reqs []RoutedRequest) []Result {
	out := make([]Result, len(reqs))
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, r := range reqs {
		p.policies = append(p.policies, r.Policy)
		out[i] = echo(r.Request, "node-c")
	}
	return out
}

type fixedHealth HealthReport

func (h fixedHealth) Health(context.Context) HealthReport { return HealthReport(h) }

func TestPublicService(t *testing.T) {
	router := &policyRouter{}
	conn := startServer(t, func(s *grpc.Server) {
		RegisterPublic(s, router, fixedHealth{Status: "serving", Members: 3, Node: "node-c"})
	})
	client := pb.NewSluiceClient(conn)
	r := limiter.Request{Name: "n", Key: "k", Hits: 3, Limit: 10, Period: time.Minute, Burst: 4, Algorithm: limiter.LeakyBucket}

	m := RequestToProto(r)
	m.UnreachablePolicy = pb.UnreachablePolicy_UNREACHABLE_POLICY_DENY
	resp, err := client.Check(ctxT(t), &pb.CheckRequest{Request: m})
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, 0, ResultFromProto(resp.Response), r, "node-c")

	// A missing request is an error in the response, not a failed call.
	resp, err = client.Check(ctxT(t), &pb.CheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ResultFromProto(resp.Response).Err; !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("missing request: %v", err)
	}

	var items []*pb.RateLimitRequest
	for _, p := range []pb.UnreachablePolicy{0, 1, 2, 3, 9} {
		m := RequestToProto(r)
		m.UnreachablePolicy = p
		items = append(items, m)
	}
	bad := RequestToProto(r)
	bad.Hits = nil
	bad.Burst = -5
	items = append(items, bad)
	batch, err := client.CheckBatch(ctxT(t), &pb.BatchCheckRequest{Requests: items})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		checkResult(t, i, ResultFromProto(batch.Responses[i]), r, "node-c")
	}
	if err := ResultFromProto(batch.Responses[4]).Err; !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "unreachable_policy 9") {
		t.Fatalf("unknown policy: %v", err)
	}
	if err := ResultFromProto(batch.Responses[5]).Err; !errors.Is(err, limiter.ErrInvalidBurst) {
		t.Fatalf("invalid burst: %v", err)
	}
	router.mu.Lock()
	got := fmt.Sprint(router.policies)
	router.mu.Unlock()
	if want := "[deny default local allow deny]"; got != want {
		t.Fatalf("policies %s, want %s", got, want)
	}

	h, err := client.Health(ctxT(t), &pb.HealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != "serving" || h.Members != 3 || h.Node != "node-c" {
		t.Fatalf("health %v", h)
	}
}

// echoInto is an echoChecker that is also a CheckerInto, and counts the
// calls of CheckInto.
type echoInto struct {
	*echoChecker
	calls atomic.Int32
}

var _ CheckerInto = (*echoInto)(nil)

func (e *echoInto) CheckInto(ctx context.Context, reqs []limiter.Request, out []Result) {
	e.calls.Add(1)
	copy(out, e.CheckMany(ctx, reqs))
}

func TestPeerStream(t *testing.T) {
	t.Run("Checker", func(t *testing.T) {
		testPeerStream(t, &echoChecker{owner: "node-b"}, nil)
	})
	t.Run("CheckerInto", func(t *testing.T) {
		chk := &echoChecker{owner: "node-b"}
		into := &echoInto{echoChecker: chk}
		testPeerStream(t, chk, into)
		// Every batch with a valid request, and those only.
		if n := into.calls.Load(); n != 3 {
			t.Fatalf("CheckInto called %d times, want 3", n)
		}
	})
}

// testPeerStream runs batches through a stream whose handler decides with
// chk, or with into (which wraps chk) when it is not nil.
func testPeerStream(t *testing.T, chk *echoChecker, into *echoInto) {
	var local Checker = chk
	if into != nil {
		local = into
	}
	conn := startServer(t, func(s *grpc.Server) { RegisterPeer(s, local, WithMaxBatchItems(3)) })
	stream, err := pb.NewPeerClient(conn).CheckStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	ok := limiter.Request{Name: "n", Key: "k", Hits: 1, Limit: 10, Period: time.Second, Algorithm: limiter.TokenBucket}
	bad := ok
	bad.Limit = 0
	failDown := ok
	failDown.Key = "fail:down"
	ok2 := ok
	ok2.Hits = 3
	batches := []struct {
		seq  uint64
		from string
		reqs []limiter.Request
		want []error
	}{
		{seq: 10, from: "node-a", reqs: []limiter.Request{ok, bad, failDown}, want: []error{nil, limiter.ErrInvalidLimit, ErrUnavailable}},
		{seq: 11, reqs: []limiter.Request{ok2}, want: []error{nil}}, // keeps the stream's sender
		{seq: 3, from: "node-c", reqs: []limiter.Request{ok}, want: []error{nil}},
		{seq: 0}, // empty: answered, reaches no checker
	}
	for _, b := range batches {
		in := &pb.PeerCheckRequest{Seq: b.seq, From: b.from}
		for _, r := range b.reqs {
			in.Items = append(in.Items, RequestToProto(r))
		}
		if err := stream.Send(in); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for _, b := range batches {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Seq != b.seq || len(resp.Items) != len(b.reqs) {
			t.Fatalf("answer seq %d with %d items, want seq %d with %d", resp.Seq, len(resp.Items), b.seq, len(b.reqs))
		}
		for i, m := range resp.Items {
			// The owner is said once per batch.
			if m.Owner != "" || (len(resp.Items) > 0 && resp.Owner != "node-b") {
				t.Fatalf("batch %d item %d: owner %q, batch owner %q", b.seq, i, m.Owner, resp.Owner)
			}
			r := ResultFromProto(m)
			if !errors.Is(r.Err, b.want[i]) || (b.want[i] == nil) != (r.Err == nil) {
				t.Fatalf("batch %d item %d: %v, want %v", b.seq, i, r.Err, b.want[i])
			}
			if r.Err == nil {
				r.Owner = resp.Owner
				checkResult(t, i, r, b.reqs[i], "node-b")
			}
		}
	}
	// The stream ends with OK once the sender has closed its side and
	// every batch is answered.
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("after the last answer: %v, want io.EOF", err)
	}
	chk.mu.Lock()
	defer chk.mu.Unlock()
	if got := fmt.Sprint(chk.from); got != "[node-a node-a node-c]" {
		t.Fatalf("senders %s", got)
	}

	// A batch over the limit ends the stream.
	stream, err = pb.NewPeerClient(conn).CheckStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	big := &pb.PeerCheckRequest{Seq: 1}
	for range 4 {
		big.Items = append(big.Items, RequestToProto(ok))
	}
	if err := stream.Send(big); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "batch of 4 items") {
		t.Fatalf("oversized batch: %v", err)
	}
}

func TestHoistOwner(t *testing.T) {
	out := &pb.PeerCheckResponse{Items: []*pb.RateLimitResponse{{Owner: "a"}, {Owner: "b"}, {Owner: "a"}, {}}}
	hoistOwner(out)
	var got []string
	for _, m := range out.Items {
		got = append(got, m.Owner)
	}
	if out.Owner != "a" || fmt.Sprint(got) != "[ b  ]" {
		t.Fatalf("owner %q, items %q", out.Owner, got)
	}
	empty := &pb.PeerCheckResponse{}
	hoistOwner(empty)
	if empty.Owner != "" {
		t.Fatal("owner of an empty batch")
	}
}

// A settlement's charge (limiter.Charge) travels with drain_over_limit,
// which an owner without the charge field applies instead; the peer
// service reads it as a Charge of a bucket or GCRA and as DrainOverLimit
// of a window, refuses it beside another behavior, and the public service
// refuses it.
func TestChargeOnTheWire(t *testing.T) {
	var c Codec
	bucket := limiter.Request{Name: "n", Key: "k", Hits: 100, Limit: 100, Period: time.Hour, Algorithm: limiter.TokenBucket, Behavior: limiter.Charge}
	m := RequestToProto(bucket)
	if !m.Charge || !m.DrainOverLimit {
		t.Fatalf("charge sent as %v", m)
	}
	if r, err := c.RequestFromProto(m); err != nil || r.Behavior != limiter.Charge {
		t.Fatalf("charge read as %+v, %v; want Charge alone", r, err)
	}
	m.Charge = false // an owner without the field
	if r, err := c.RequestFromProto(m); err != nil || r.Behavior != limiter.DrainOverLimit {
		t.Fatalf("charge without its field read as %+v, %v; want DrainOverLimit", r, err)
	}
	window := RequestToProto(limiter.Request{Name: "n", Key: "k", Hits: 100, Limit: 100, Period: time.Hour, Algorithm: limiter.FixedWindow, Behavior: limiter.DrainOverLimit})
	window.Charge = true
	if r, err := c.RequestFromProto(window); err != nil || r.Behavior != limiter.DrainOverLimit {
		t.Fatalf("a window's charge read as %+v, %v; want DrainOverLimit", r, err)
	}
	m.Charge, m.Reset_ = true, true
	if _, err := c.RequestFromProto(m); !errors.Is(err, limiter.ErrInvalidBehavior) {
		t.Fatalf("charge with reset: %v", err)
	}

	pub := &publicServer{cfg: newServerConfig(nil), routed: LocalRouter(&echoChecker{owner: "b"})}
	out, err := pub.route(context.Background(), []*pb.RateLimitRequest{RequestToProto(bucket)})
	if err != nil {
		t.Fatal(err)
	}
	if err := ResultFromProto(out[0]).Err; !errors.Is(err, limiter.ErrInvalidBehavior) {
		t.Fatalf("a public charge: %v", err)
	}
}
