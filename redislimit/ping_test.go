package redislimit

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice/internal/testredis"
)

// TestPing: Ping answers nil while the server or every master answers, an
// error once one is killed, and ErrClosed after Close.
func TestPing(t *testing.T) {
	ctx := context.Background()
	srv := testredis.Start(t)
	one := newTestLimiter(t, nil, srv.Addr())
	rc := testredis.StartCluster(t, 3, 0)
	many := newTestLimiter(t, nil, rc.Addrs()...)
	for _, l := range []*Limiter{one, many} {
		if err := l.Ping(ctx); err != nil {
			t.Fatalf("Ping while every server answers: %v", err)
		}
	}
	srv.Kill()
	rc.Nodes[1].Kill()
	for _, l := range []*Limiter{one, many} {
		if err := l.Ping(ctx); err == nil {
			t.Fatal("Ping with a server killed: nil error")
		}
	}
	one.Close()
	if err := one.Ping(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ping after Close: %v, want ErrClosed", err)
	}
	if err := one.Ping(nil); err == nil { //nolint:staticcheck // a nil context is refused
		t.Fatal("Ping(nil): nil error")
	}
}
