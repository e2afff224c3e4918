package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cmd/sluice/internal/daemon"
	"github.com/sluicehq/sluice/limiter"
)

// errLimited is check's result when the request was not admitted.
var errLimited = &exitError{code: 1}

// check asks a daemon over gRPC and prints the decision. It returns nil
// when the request was allowed, errLimited when it was limited, and an
// error with exit status 2 otherwise.
func (a *app) check(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sluice check", flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	conn := addConnFlags(fs)
	name := fs.String("name", "", "limit name (required)")
	key := fs.String("key", "", "key the limit applies to (required)")
	limit := fs.Int64("limit", 0, "hits admitted per period (required)")
	period := fs.Duration("period", 0, "period of the limit, such as 1m (required unless --calendar)")
	burst := fs.Int64("burst", 0, "bucket capacity or GCRA tolerance; 0 means --limit")
	algorithm := fs.String("algorithm", "token_bucket", "token_bucket, leaky_bucket, fixed_window, sliding_window_log, sliding_window_counter or gcra")
	calendar := fs.String("calendar", "", "align fixed windows to minute, hour, day, week, month or year")
	zone := fs.String("time-zone", "", "IANA time zone of --calendar (default UTC)")
	hits := fs.Int64("hits", 1, "cost of this request; 0 peeks")
	reset := fs.Bool("reset", false, "forget the key's state first")
	drain := fs.Bool("drain-over-limit", false, "consume what remains when limited")
	unreachable := fs.String("unreachable", "default", "when the key's owner is unreachable: default, local, allow or deny")
	asJSON := fs.Bool("json", false, "print the decision as JSON, as the HTTP API does")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice check --name N --key K --limit L --period P [flags]\n\nAsks a sluice node for a decision and prints it. Exit status: 0 allowed, 1 limited, 2 error.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if stop, err := parseFlags(fs, args, "name", "key", "limit"); stop {
		return err
	}

	alg, err := limiter.ParseAlgorithm(*algorithm)
	if err != nil {
		return usageError(fmt.Errorf("check: --algorithm: %w", err))
	}
	cal, err := limiter.ParseCalendar(*calendar)
	if err != nil {
		return usageError(fmt.Errorf("check: --calendar: %w", err))
	}
	policy, err := sluice.ParsePolicy(*unreachable)
	if err != nil {
		return usageError(fmt.Errorf("check: --unreachable: %w", err))
	}
	req := limiter.Request{
		Name: *name, Key: *key, Hits: *hits, Limit: *limit, Period: *period, Burst: *burst,
		Algorithm: alg, Calendar: cal,
	}
	if *reset {
		req.Behavior |= limiter.Reset
	}
	if *drain {
		req.Behavior |= limiter.DrainOverLimit
	}
	if *zone != "" {
		loc, err := time.LoadLocation(*zone)
		if err != nil {
			return usageError(fmt.Errorf("check: --time-zone: %w", err))
		}
		req.Location = loc
	}

	c, err := conn.dial(a, "check")
	if err != nil {
		return err
	}
	defer c.Close()
	d, err := c.Check(ctx, req, sluice.OnUnreachable(policy))
	if err != nil {
		return conn.callError(ctx, "check", err)
	}
	out := daemon.EncodeDecision(d.Decision, d.Owner, d.WithoutOwner, time.Now())
	if *asJSON {
		b, _ := json.Marshal(out)
		fmt.Fprintf(a.stdout, "%s\n", b)
	} else {
		fmt.Fprintln(a.stdout, formatDecision(out))
	}
	if !d.Allowed {
		return errLimited
	}
	return nil
}

// formatDecision returns one line: "allowed" or "limited", then the
// decision's fields.
func formatDecision(d daemon.Decision) string {
	var b strings.Builder
	if d.Allowed {
		b.WriteString("allowed")
	} else {
		b.WriteString("limited")
	}
	fmt.Fprintf(&b, " limit=%d remaining=%d", d.Limit, d.Remaining)
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
	if d.ResetAt != "" {
		fmt.Fprintf(&b, " reset_after=%v", ms(d.ResetAfterMs))
	}
	if d.RetryAfterMs > 0 {
		fmt.Fprintf(&b, " retry_after=%v", ms(d.RetryAfterMs))
	}
	if d.DelayMs > 0 {
		fmt.Fprintf(&b, " delay=%v", ms(d.DelayMs))
	}
	fmt.Fprintf(&b, " owner=%s", d.Owner)
	if d.WithoutOwner {
		b.WriteString(" without_owner=true")
	}
	return b.String()
}

// connFlags are the flags of the commands that call a node over gRPC.
type connFlags struct {
	fs                     *flag.FlagSet
	addr                   *string
	dialed                 string // the address dial used
	timeout                *time.Duration
	tlsCert, tlsKey, tlsCA *string
}

// addConnFlags defines the connection flags on fs.
func addConnFlags(fs *flag.FlagSet) *connFlags {
	return &connFlags{
		fs:      fs,
		addr:    fs.String("addr", "127.0.0.1:7947", "gRPC address of a sluice node, host:port (env SLUICE_ADDR)"),
		timeout: fs.Duration("timeout", client.DefaultTimeout, "deadline of the call"),
		tlsCert: fs.String("tls-cert", "", "PEM client certificate, for a node with mutual TLS (with --tls-key)"),
		tlsKey:  fs.String("tls-key", "", "PEM private key of --tls-cert"),
		tlsCA:   fs.String("tls-ca", "", "PEM CA bundle verifying the node; setting any --tls flag turns TLS on"),
	}
}

// parseFlags parses args into fs, refusing arguments after the flags and
// a missing required flag. stop says the command ends now, with err: nil
// after -h, which printed the usage, or an error of exit status 2.
func parseFlags(fs *flag.FlagSet, args []string, required ...string) (stop bool, err error) {
	cmd := strings.TrimPrefix(fs.Name(), "sluice ")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return true, nil
		}
		return true, usageError(nil) // the flag package printed the error
	}
	if fs.NArg() > 0 {
		return true, usageError(fmt.Errorf("%s: unexpected argument %q", cmd, fs.Arg(0)))
	}
	set := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, f := range required {
		if !set[f] {
			return true, usageError(fmt.Errorf("%s: --%s is required", cmd, f))
		}
	}
	return false, nil
}

// dial connects to the node of the flags: --addr, or SLUICE_ADDR when
// --addr is not set. Errors exit with status 2.
func (c *connFlags) dial(a *app, cmd string) (*client.Client, error) {
	addr := *c.addr
	set := false
	c.fs.Visit(func(f *flag.Flag) { set = set || f.Name == "addr" })
	if v := a.env("SLUICE_ADDR"); !set && v != "" {
		addr = v
	}
	if *c.timeout <= 0 {
		return nil, usageError(fmt.Errorf("%s: --timeout %v must be positive", cmd, *c.timeout))
	}
	c.dialed = addr
	opts := []client.Option{client.WithTimeout(*c.timeout)}
	if *c.tlsCert != "" || *c.tlsKey != "" || *c.tlsCA != "" {
		tc, err := clientTLS(*c.tlsCert, *c.tlsKey, *c.tlsCA)
		if err != nil {
			return nil, usageError(fmt.Errorf("%s: %w", cmd, err))
		}
		opts = append(opts, client.WithTLS(tc))
	}
	cl, err := client.New(addr, opts...)
	if err != nil {
		return nil, usageError(fmt.Errorf("%s: %w", cmd, err))
	}
	return cl, nil
}

// clientTLS builds the TLS config of the connection flags.
func clientTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca: %s holds no PEM certificate", caFile)
		}
	}
	return tc, nil
}

// callError returns the error of a failed call of cmd. An address that
// answered in HTTP/1 is most likely a daemon's HTTP port: its /healthz
// says where the gRPC port is, and the error says so too.
func (c *connFlags) callError(ctx context.Context, cmd string, err error) error {
	if !errors.Is(err, client.ErrNotGRPC) {
		return usageError(fmt.Errorf("%s: %w", cmd, err))
	}
	if grpcAddr := grpcAddrFromHealthz(ctx, c.dialed); grpcAddr != "" {
		return usageError(fmt.Errorf("%s: %w\n%s is sluice's HTTP port; the gRPC port is %s: sluice %s --addr %s ...", cmd, err, c.dialed, grpcAddr, cmd, grpcAddr))
	}
	return usageError(fmt.Errorf("%s: %w", cmd, err))
}

// grpcAddrFromHealthz asks the daemon whose HTTP API is at addr for its
// gRPC address, with addr's host, or returns "".
func grpcAddrFromHealthz(ctx context.Context, addr string) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/healthz", nil)
	if err != nil {
		return ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var body struct {
		GRPCAddr string `json:"grpc_addr"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&body) != nil {
		return ""
	}
	_, port, err := net.SplitHostPort(body.GRPCAddr)
	host, _, herr := net.SplitHostPort(addr)
	if err != nil || herr != nil {
		return ""
	}
	return net.JoinHostPort(host, port)
}
