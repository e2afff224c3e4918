package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/limiter"
)

func TestPoolFollowsMembership(t *testing.T) {
	b1, b2, c1 := newOwner("b"), newOwner("b"), newOwner("c")
	srvB1, srvB2, srvC := startServer(t, b1), startServer(t, b2), startServer(t, c1)
	p, err := NewPool(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	check := func(name string) error {
		t.Helper()
		c, ok := p.Get(name)
		if !ok {
			return fmt.Errorf("no client of %s", name)
		}
		_, err := c.Check(context.Background(), req("x"))
		return err
	}

	// Add.
	if err := p.Update(map[string]string{"b": srvB1.addr, "c": srvC.addr}); err != nil {
		t.Fatal(err)
	}
	if err := check("b"); err != nil {
		t.Fatal(err)
	}
	if err := check("c"); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Get("d"); ok || p.Len() != 2 {
		t.Fatalf("Get(d) found, or %d clients", p.Len())
	}
	oldB, _ := p.Get("b")
	oldC, _ := p.Get("c")

	// Replace b's address; c is unchanged and keeps its client.
	if err := p.Update(map[string]string{"b": srvB2.addr, "c": srvC.addr}); err != nil {
		t.Fatal(err)
	}
	if newC, _ := p.Get("c"); newC != oldC {
		t.Fatal("unchanged member got a new client")
	}
	newB, _ := p.Get("b")
	if newB == oldB || newB.Addr() != srvB2.addr {
		t.Fatalf("b not replaced: %s", newB.Addr())
	}
	if _, err := oldB.Check(context.Background(), req("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("replaced client: %v, want ErrClosed", err)
	}
	if err := check("b"); err != nil {
		t.Fatal(err)
	}
	if got := b2.batchSizes(); len(got) != 1 {
		t.Fatalf("new address got %v", got)
	}

	// Remove c.
	if err := p.Update(map[string]string{"b": srvB2.addr}); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Get("c"); ok {
		t.Fatal("removed member still has a client")
	}
	if _, err := oldC.Check(context.Background(), req("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("removed client: %v, want ErrClosed", err)
	}
	if st := p.Stats(); len(st) != 1 || st["b"].Calls != 1 {
		t.Fatalf("stats %+v", st)
	}

	// A member whose client cannot be made is left out, the others kept.
	err = p.Update(map[string]string{"b": srvB2.addr, "e": ""})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("bad member: %v", err)
	}
	if _, ok := p.Get("e"); ok || p.Len() != 1 {
		t.Fatal("bad member added")
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := newB.Check(context.Background(), req("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("client after pool Close: %v", err)
	}
	if _, ok := p.Get("b"); ok || p.Len() != 0 {
		t.Fatal("closed pool has clients")
	}
	if err := p.Update(map[string]string{"b": srvB2.addr}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Update after Close: %v", err)
	}
}

func TestPoolConcurrentUse(t *testing.T) {
	o := newOwner("b")
	srv := startServer(t, o)
	p, err := NewPool(testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	members := []map[string]string{
		{"b": srv.addr},
		{"b": srv.addr, "b2": srv.addr},
		{},
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 30 {
			if err := p.Update(members[i%len(members)]); err != nil {
				t.Error(err)
			}
		}
	}()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				c, ok := p.Get("b")
				if !ok {
					continue
				}
				r := req("x")
				r.Limit = limiter.MaxLimit
				if _, err := c.Check(context.Background(), r); err != nil && !errors.Is(err, ErrClosed) {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
}

func TestNewPoolRejectsInvalidConfig(t *testing.T) {
	if _, err := NewPool(Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("NewPool(Config{}): %v", err)
	}
}

// A member's client that Update drops takes no more checks, but a check in
// flight gets the member's answer: the member may have counted it, and a
// caller told it failed would send it elsewhere, counting it twice. The
// client closes once nothing is in flight.
func TestPoolDropKeepsChecksInFlight(t *testing.T) {
	o := newOwner("b")
	srv := startServer(t, o)
	cfg := testConfig()
	cfg.MaxInFlight = 1
	p, err := NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Update(map[string]string{"b": srv.addr}); err != nil {
		t.Fatal(err)
	}
	c, _ := p.Get("b")
	held := holdOneCall(t, c, o)
	waiting := goCheck(context.Background(), c, req("x"))
	testwait.For(t, "a check to queue", func() bool { return c.Stats().Pending == 1 })

	if err := p.Update(map[string]string{}); err != nil {
		t.Fatal(err)
	}
	if out := receive(t, "the waiting check", waiting); !errors.Is(out.err, ErrClosed) || errors.Is(out.err, ErrInFlight) {
		t.Fatalf("check waiting when its member was dropped: %v, want ErrClosed, unsent", out.err)
	}
	if _, err := c.Check(context.Background(), req("x")); !errors.Is(err, ErrClosed) || errors.Is(err, ErrInFlight) {
		t.Fatalf("check after its member was dropped: %v, want ErrClosed, unsent", err)
	}
	o.release()
	if out := receive(t, "the held check", held); out.err != nil || !out.d.Allowed {
		t.Fatalf("check in flight when its member was dropped: %+v, %v, want the member's admission", out.d, out.err)
	}
	testwait.For(t, "the dropped client to close", func() bool {
		select {
		case <-c.done:
			return true
		default:
			return false
		}
	})
}
