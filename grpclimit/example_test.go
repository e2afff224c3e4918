package grpclimit_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/rules"
)

func Example() {
	node, err := cluster.New(cluster.TestConfig("example"))
	if err != nil {
		panic(err)
	}
	defer node.Close()
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
