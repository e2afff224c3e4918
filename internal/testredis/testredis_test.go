package testredis

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A server whose port another server holds is not mistaken for that
// other: startOn tries another port, and the server it returns keeps
// its own keys.
func TestStartOnTakenPort(t *testing.T) {
	NeedBinaries(t, "redis-server")
	other := Start(t)
	taken := true
	ports := func(t testing.TB) int {
		if taken {
			taken = false
			return other.port
		}
		return FreePort(t)
	}
	s := startOn(t, ports, redis.Options{})
	if s.Addr() == other.Addr() {
		t.Fatalf("the server started on %s, which another server held", s.Addr())
	}
	ctx := context.Background()
	mine := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer mine.Close()
	theirs := redis.NewClient(&redis.Options{Addr: other.Addr(), MaxRetries: -1})
	defer theirs.Close()
	if err := mine.Set(ctx, "mine", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := theirs.Exists(ctx, "mine").Result(); err != nil || n != 0 {
		t.Fatalf("the other server holds the key written to the one started: %d, %v", n, err)
	}
}

// Restart starts a killed server again on its port, empty.
func TestRestart(t *testing.T) {
	NeedBinaries(t, "redis-server")
	s := Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	s.Kill() // twice is fine
	s.Restart()
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after the restart: %d keys, %v; want an empty server", n, err)
	}
}
