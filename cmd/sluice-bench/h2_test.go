package main

import (
	"context"
	"maps"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/envoyrls"
	"github.com/sluicehq/sluice/limiter"
)

// serveRLS serves svc (registered by register) on a gRPC server on
// 127.0.0.1 with opts until the test ends, and returns its address.
func serveRLS(t *testing.T, register func(grpc.ServiceRegistrar), opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	register(srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String()
}

// envoyService is an envoyrls service of one domain file over a local
// limiter whose clock stands still.
func envoyService(t *testing.T, file string) *envoyrls.Service {
	t.Helper()
	d, err := envoyrls.ParseDomain("bench.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := envoyrls.NewRules(d)
	if err != nil {
		t.Fatal(err)
	}
	store, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { return time.Unix(1_700_000_000, 0) }
	cfg := envoyrls.DefaultConfig()
	cfg.Limiter = sluice.NewLocal(store, now)
	cfg.Rules = envoyrls.Static{Rules: rules}
	cfg.Now = now
	svc, err := envoyrls.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

const threePerHour = `
domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 3
`

// answers makes every request of values, each value times times, from
// callers goroutines with call, and counts the answers of each code
// (codes.OK's entry counting OK, codes.ResourceExhausted's OVER_LIMIT) or
// gRPC status of the error.
func answers(t *testing.T, values []string, times, callers int, call func(value int) (rlsv3.RateLimitResponse_Code, error)) map[string]int {
	t.Helper()
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for n := c; n < len(values)*times; n += callers {
				code, err := call(n % len(values))
				k := code.String()
				if err != nil {
					k = "error " + status.Code(err).String()
				}
				mu.Lock()
				counts[k]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return counts
}

// The h2 client's answers are the grpc-go client's: the same requests to
// two services of three per hour give each value three OKs and then
// OVER_LIMIT, on a server that lets two streams at a time (which the h2
// client must honour: the server refuses a third).
func TestH2AnswersAsGRPC(t *testing.T) {
	values := make([]string, 20)
	for i := range values {
		values[i] = "u" + strconv.Itoa(i)
	}
	want := map[string]int{"OK": 60, "OVER_LIMIT": 40}

	h2Addr := serveRLS(t, envoyService(t, threePerHour).Register, grpc.MaxConcurrentStreams(2))
	bodies, err := rlsBodies("bench", "user", values)
	if err != nil {
		t.Fatal(err)
	}
	c, err := dialH2(h2Addr, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := answers(t, values, 5, 8, func(i int) (rlsv3.RateLimitResponse_Code, error) { return c.call(i, bodies[i]) })

	grpcAddr := serveRLS(t, envoyService(t, threePerHour).Register, grpc.MaxConcurrentStreams(2))
	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rc := rlsv3.NewRateLimitServiceClient(cc)
	gotGRPC := answers(t, values, 5, 8, func(i int) (rlsv3.RateLimitResponse_Code, error) {
		resp, err := rc.ShouldRateLimit(context.Background(), rlsRequestOf("bench", "user", values[i]))
		return resp.GetOverallCode(), err
	})
	if !maps.Equal(got, want) || !maps.Equal(gotGRPC, want) {
		t.Fatalf("h2 client %v, grpc-go client %v; want %v from both", got, gotGRPC, want)
	}
	// The calls of the bench (callers 64, on 2 connections) all pass.
	call, closeAll, err := newAPICaller("envoy", "h2", h2Addr, "bench", "user", []string{"fresh"}, 2, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	rng := rand.New(rand.NewPCG(1, 2))
	if err := call(context.Background(), rng, 0); err != nil {
		t.Fatal(err)
	}
}

// errorRLS answers every call with err, or with resp if err is nil.
type errorRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	resp *rlsv3.RateLimitResponse
	err  error
}

func (e *errorRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return e.resp, e.err
}

// A server's error status reaches the h2 client's caller as the gRPC
// status it is, as it does grpc-go's; an answer neither OK nor
// OVER_LIMIT is an error; a path the server does not serve is its
// Unimplemented.
func TestH2ErrorStatus(t *testing.T) {
	for _, c := range []struct {
		name     string
		srv      *errorRLS
		wantCode codes.Code
		wantMsg  string
	}{
		{"resource exhausted", &errorRLS{err: status.Error(codes.ResourceExhausted, "no room: 100% — full")}, codes.ResourceExhausted, "no room: 100% — full"},
		{"unavailable", &errorRLS{err: status.Error(codes.Unavailable, "going away")}, codes.Unavailable, "going away"},
		{"unknown overall code", &errorRLS{resp: &rlsv3.RateLimitResponse{}}, codes.Internal, "h2: overall code UNKNOWN"},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := serveRLS(t, func(s grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(s, c.srv) })
			bodies, err := rlsBodies("bench", "user", []string{"a"})
			if err != nil {
				t.Fatal(err)
			}
			h, err := dialH2(addr, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			for range 3 { // the connection serves again after an error
				_, err := h.call(0, bodies[0])
				if st, _ := status.FromError(err); st.Code() != c.wantCode || st.Message() != c.wantMsg {
					t.Fatalf("h2 client: %v, want %v %q", err, c.wantCode, c.wantMsg)
				}
			}
			if c.srv.err == nil {
				return
			}
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			_, gerr := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(context.Background(), rlsRequestOf("bench", "user", "a"))
			if status.Code(gerr) != c.wantCode || status.Convert(gerr).Message() != c.wantMsg {
				t.Fatalf("grpc-go client: %v, want %v %q", gerr, c.wantCode, c.wantMsg)
			}
		})
	}
	t.Run("unimplemented", func(t *testing.T) {
		addr := serveRLS(t, func(grpc.ServiceRegistrar) {})
		bodies, err := rlsBodies("bench", "user", []string{"a"})
		if err != nil {
			t.Fatal(err)
		}
		h, err := dialH2(addr, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if _, err := h.call(0, bodies[0]); status.Code(err) != codes.Unimplemented {
			t.Fatalf("got %v, want Unimplemented", err)
		}
	})
	t.Run("server gone", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		rlsv3.RegisterRateLimitServiceServer(srv, &errorRLS{resp: &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}})
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.Serve(lis)
		}()
		bodies, err := rlsBodies("bench", "user", []string{"a"})
		if err != nil {
			t.Fatal(err)
		}
		h, err := dialH2(lis.Addr().String(), 1)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if code, err := h.call(0, bodies[0]); err != nil || code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("got %v, %v; want OK", code, err)
		}
		srv.Stop()
		<-done
		// The connection fails once the server is gone, and every call
		// after it with it.
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := h.call(0, bodies[0])
			if status.Code(err) == codes.Unavailable {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the server stopped: %v, want Unavailable", err)
			}
		}
	})
}

// overallCode reads what proto.Unmarshal reads, from every response the
// services give and from fields it must skip.
func TestOverallCode(t *testing.T) {
	for _, r := range []*rlsv3.RateLimitResponse{
		{},
		{OverallCode: rlsv3.RateLimitResponse_OK},
		{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT, LimitRemaining: 7}}, RawBody: []byte("x")},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		// A field after the code, and the code given twice (the last wins).
		b = append(b, 0x2a, 1, 'y', 0x08, byte(r.OverallCode))
		if got, err := overallCode(b); err != nil || got != r.OverallCode {
			t.Errorf("overallCode(%x) = %v, %v; want %v", b, got, err, r.OverallCode)
		}
	}
	if _, err := overallCode([]byte{0x08}); err == nil {
		t.Error("a truncated varint: no error")
	}
}

// The two ways to read the overall code of an answer of one descriptor.
func BenchmarkOverallCode(b *testing.B) {
	body, err := proto.Marshal(&rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code:           rlsv3.RateLimitResponse_OK,
			CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1_000_000, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
			LimitRemaining: 999_999,
		}},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("protowire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if c, err := overallCode(body); err != nil || c != rlsv3.RateLimitResponse_OK {
				b.Fatal(c, err)
			}
		}
	})
	b.Run("unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		var r rlsv3.RateLimitResponse
		for b.Loop() {
			if err := proto.Unmarshal(body, &r); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
				b.Fatal(r.OverallCode, err)
			}
		}
	})
}
