package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

func Example() {
	set, err := rules.Parse("limits.yaml", []byte(`
rules:
  - name: health_checks
    match: {routes: ["/grpc.health.v1.Health/*"]}
    key: [ip]
    algorithm: fixed_window
    limit: 2
    period: 1h
`))
	if err != nil {
		panic(err)
	}
	node, err := cluster.New(cluster.TestConfig("example"))
	if err != nil {
		panic(err)
	}
	defer node.Close()
	ic, err := grpclimit.New(node, rules.NewSource(set))
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for range 3 {
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		fmt.Println(status.Code(err))
	}
	// Output:
	// OK
	// OK
	// ResourceExhausted
}

// A unary call costs one hit per byte of its request message, so that a
// client's budget is in bytes; a message larger than the rule could ever
// admit is refused without consuming anything. The limiter is a single
// process's (sluice.NewLocal), on a fixed clock so that the output does
// not depend on when the example runs.
func ExampleCost() {
	// The rule is built in code here; rules.Parse reads the same from YAML.
	src, err := rules.NewStatic(rules.Rule{
		Name: "bytes_per_ip", Key: []string{"ip"},
		Algorithm: limiter.TokenBucket, Limit: 40, Period: time.Hour,
	})
	if err != nil {
		panic(err)
	}
	store, err := limiter.NewStore(limiter.DefaultStoreConfig())
	if err != nil {
		panic(err)
	}
	now := func() time.Time { return time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC) }
	ic, err := grpclimit.New(sluice.NewLocal(store, now), src,
		grpclimit.Guard(rules.GuardConfig{Now: now}),
		grpclimit.Cost(func(_ context.Context, _ string, req any) int64 {
			m, ok := req.(proto.Message)
			if !ok { // a stream
				return 1
			}
			return max(1, int64(proto.Size(m)))
		}))
	if err != nil {
		panic(err)
	}
	hs := health.NewServer()
	services := []string{"db", "search-index", strings.Repeat("x", 100), "payments", "search-index"}
	for _, svc := range services {
		hs.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	healthpb.RegisterHealthServer(srv, hs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for _, svc := range services {
		req := &healthpb.HealthCheckRequest{Service: svc}
		var header, trailer metadata.MD // the rate-limit fields: header if admitted, trailer if not
		_, err := client.Check(context.Background(), req, grpc.Header(&header), grpc.Trailer(&trailer))
		remaining := append(header.Get("x-ratelimit-remaining"), trailer.Get("x-ratelimit-remaining")...)
		fmt.Printf("%d bytes: %v, remaining %s\n", proto.Size(req), status.Code(err), strings.Join(remaining, ","))
	}
	// Output:
	// 4 bytes: OK, remaining 36
	// 14 bytes: OK, remaining 22
	// 102 bytes: ResourceExhausted, remaining 22
	// 10 bytes: OK, remaining 12
	// 14 bytes: ResourceExhausted, remaining 12
}
