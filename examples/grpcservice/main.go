// Command grpcservice runs a gRPC server (the standard health service)
// behind sluice's rate-limiting interceptors on one embedded node, calls it
// a few times, prints each result with its rate-limit metadata, and exits;
// it fails if any result differs from what the rules imply.
//
//	go run ./examples/grpcservice
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/rules"
)

const limits = `rules:
  - name: checks_per_user
    match: {routes: [/grpc.health.v1.Health/Check]}
    key: [user]
    algorithm: gcra
    limit: 2
    period: 1m
  - name: watches_per_ip
    match: {routes: [/grpc.health.v1.Health/Watch]}
    key: [ip]
    algorithm: sliding_window_log
    limit: 1
    period: 1m
`

func main() {
	// Ctrl-C and SIGTERM end ctx: run returns and its deferred calls stop
	// the server and leave the cluster gracefully.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	cfg := cluster.DefaultConfig()
	cfg.NodeName = "grpcservice"
	cfg.BootstrapExpect = 1 // a node of its own
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.GRPCAddr = "127.0.0.1:0"
	node, err := cluster.New(cfg)
	if err != nil {
		return err
	}
	defer node.Leave() // hands the counters to their next owners, then leaves
	if err := node.WaitReady(ctx); err != nil {
		return err
	}

	set, err := rules.Parse("limits.yaml", []byte(limits))
	if err != nil {
		return err
	}
	ic, err := grpclimit.New(node, rules.NewSource(set),
		grpclimit.UserFunc(func(ctx context.Context, _ string) (string, bool) {
			md, _ := metadata.FromIncomingContext(ctx) // a real service would authenticate
			if u := md.Get("x-user"); len(u) > 0 && u[0] != "" {
				return u[0], true
			}
			return "", false
		}))
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go srv.Serve(lis)
	defer func() { // before node.Leave: calls in flight finish first
		hs.Shutdown()
		srv.GracefulStop()
	}()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)

	var failed []string
	expect := func(what string, err error, want codes.Code) {
		if got := status.Code(err); got != want {
			failed = append(failed, fmt.Sprintf("%s: %v, want %v", what, got, want))
		}
	}
	check := func(user string, want codes.Code) {
		ctx := metadata.AppendToOutgoingContext(ctx, "x-user", user)
		var hdr, trl metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr), grpc.Trailer(&trl))
		md := metadata.Join(hdr, trl)
		fmt.Printf("Check  user=%-5s -> %-17v remaining=%s ratelimit=%s%s\n",
			user, status.Code(err), first(md, "x-ratelimit-remaining"), first(md, "ratelimit"), retryInfo(err))
		expect("Check "+user, err, want)
	}
	watch := func(want codes.Code) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			var resp *healthpb.HealthCheckResponse
			if resp, err = stream.Recv(); err == nil {
				hdr, _ := stream.Header()
				fmt.Printf("Watch            -> %-17v remaining=%s status=%v\n", codes.OK, first(hdr, "x-ratelimit-remaining"), resp.Status)
			} else {
				trl := stream.Trailer()
				fmt.Printf("Watch            -> %-17v remaining=%s retry-after=%ss%s\n",
					status.Code(err), first(trl, "x-ratelimit-remaining"), first(trl, "retry-after"), retryInfo(err))
			}
		}
		expect("Watch", err, want)
	}

	fmt.Println("checks_per_user: 2/min per user (GCRA); watches_per_ip: 1 stream/min per IP")
	check("alice", codes.OK)
	check("alice", codes.OK)
	check("alice", codes.ResourceExhausted)
	check("bob", codes.OK)
	watch(codes.OK)
	watch(codes.ResourceExhausted)

	st := ic.Stats()
	fmt.Printf("allowed %d, rejected %d\n", st.Allowed, st.Rejected)
	if len(failed) > 0 {
		return errors.New("unexpected results:\n  " + strings.Join(failed, "\n  "))
	}
	return nil
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return "-"
}

// retryInfo describes the RetryInfo detail of a rejected call.
func retryInfo(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return fmt.Sprintf("  RetryInfo: %v", ri.RetryDelay.AsDuration())
		}
	}
	return ""
}
