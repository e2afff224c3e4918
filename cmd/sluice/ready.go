package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// ready asks a daemon's HTTP API whether the node is ready (GET /readyz)
// and exits 0 when it is, 1 when it is not or does not answer: a health
// check for images with nothing but the sluice binary in them.
func (a *app) ready(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sluice ready", flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	addr := fs.String("http-addr", "127.0.0.1:8080", "HTTP address of the node, host:port")
	timeout := fs.Duration("timeout", 2*time.Second, "deadline of the request")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: sluice ready [flags]\n\nExits 0 when the node's GET /readyz answers 200, 1 otherwise: a container health check.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if stop, err := parseFlags(fs, args); stop {
		return err
	}
	if *timeout <= 0 {
		return usageError(fmt.Errorf("ready: --timeout %v must be positive", *timeout))
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+*addr+"/readyz", nil)
	if err != nil {
		return usageError(fmt.Errorf("ready: --http-addr %q: %w", *addr, err))
	}
	resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil}}).Do(req)
	if err != nil {
		err = fmt.Errorf("ready: %w", err)
		if speaksGRPC(ctx, *addr) {
			err = fmt.Errorf("%w\n%s is a gRPC port (a node's grpc_addr); sluice ready asks the node's HTTP port, http_addr (default port 8080): sluice ready --http-addr <host>:8080", err, *addr)
		}
		return &exitError{code: 1, err: err}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Fprintf(a.stdout, "%s", body)
	if resp.StatusCode != http.StatusOK {
		return &exitError{code: 1}
	}
	return nil
}

// speaksGRPC reports whether addr answers grpc.health.v1 in clear, as a
// node's gRPC port does: the likely mistake behind an HTTP request there
// that failed.
func speaksGRPC(ctx context.Context, addr string) bool {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	switch status.Code(err) {
	case codes.OK, codes.NotFound, codes.Unimplemented:
		return true
	}
	return false
}
