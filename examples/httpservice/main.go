// Command httpservice runs a small HTTP API behind sluice's rate-limiting
// middleware on one embedded node: rules from a YAML file that is watched
// for changes, several rules per request (all must admit), per-user and
// per-IP keys. It sends a few requests to itself, prints each status with
// its rate-limit headers, raises a limit by rewriting the file, and exits;
// it fails if any status differs from what the rules imply.
//
//	go run ./examples/httpservice
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/rules"
)

const limits = `rules:
  - name: api_per_user
    match: {routes: ["/api/*"]}
    key: [user]
    algorithm: token_bucket
    limit: %d
    period: 1m
  - name: api_writes_per_user
    match: {routes: ["/api/*"], methods: [POST]}
    key: [user]
    algorithm: sliding_window_log
    limit: 1
    period: 1m
  - name: login_per_ip
    match: {routes: [/login], methods: [POST]}
    key: [ip]
    algorithm: gcra
    limit: 2
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
	cfg.NodeName = "httpservice"
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

	dir, err := os.MkdirTemp("", "httpservice")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, limits, 3), 0o644); err != nil {
		return err
	}
	watcher, err := rules.Watch(path, rules.DefaultWatchConfig())
	if err != nil {
		return err
	}
	defer watcher.Close()

	mw, err := httplimit.New(node, watcher,
		httplimit.UserFunc(func(r *http.Request) (string, bool) {
			u := r.Header.Get("X-User") // a real service would authenticate
			return u, u != ""
		}),
		httplimit.TrustedProxies("10.0.0.0/8"),
	)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/api/items", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "items\n") })
	mux.HandleFunc("POST /login", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "welcome\n") })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mw.Handler(mux), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(lis)
	defer func() { // before node.Leave: requests in flight finish first
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	base := "http://" + lis.Addr().String()

	var failed []string
	send := func(user, method, path string, want int) {
		req, _ := http.NewRequestWithContext(ctx, method, base+path, nil)
		if user != "" {
			req.Header.Set("X-User", user)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			failed = append(failed, err.Error())
			return
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		h := res.Header
		line := fmt.Sprintf("%-6s %-5s %-11s -> %d  remaining=%s reset=%ss  RateLimit: %s",
			or(user, "-"), method, path, res.StatusCode, h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset"), h.Get("RateLimit"))
		if ra := h.Get("Retry-After"); ra != "" {
			line += "  Retry-After: " + ra
		}
		fmt.Println(line)
		if res.StatusCode != want {
			failed = append(failed, fmt.Sprintf("%s %s %s: %d, want %d", user, method, path, res.StatusCode, want))
		}
	}

	fmt.Println("api_per_user: 3/min per user; api_writes_per_user: 1 POST/min per user; login_per_ip: 2/min")
	send("alice", "POST", "/api/items", 200)
	fmt.Println("alice's second POST exceeds api_writes_per_user; rejected, it takes nothing from api_per_user:")
	send("alice", "POST", "/api/items", 429)
	send("alice", "GET", "/api/items", 200)
	send("alice", "GET", "/api/items", 200)
	send("alice", "GET", "/api/items", 429)
	send("bob", "GET", "/api/items", 200)
	send("", "POST", "/login", 200)
	send("", "POST", "/login", 200)
	send("", "POST", "/login", 429)

	fmt.Println("raising api_per_user to 10/min in", filepath.Base(path))
	tmp := path + ".new"
	if err := os.WriteFile(tmp, fmt.Appendf(nil, limits, 10), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if err := watcher.Reload(); err != nil { // the watcher would see it by itself; do not wait for it
		return err
	}
	send("alice", "GET", "/api/items", 200)

	st := mw.Stats()
	fmt.Printf("allowed %d, rejected %d\n", st.Allowed, st.Rejected)
	if len(failed) > 0 {
		return errors.New("unexpected results:\n  " + strings.Join(failed, "\n  "))
	}
	return nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
