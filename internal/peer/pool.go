package peer

import (
	"errors"
	"sync"
	"sync/atomic"
)

// Pool keeps one Client per remote cluster member, following membership
// through Update. Get is lock-free: it reads an immutable snapshot of the
// clients that Update replaces. A Pool is safe for concurrent use.
type Pool struct {
	cfg Config

	mu     sync.Mutex // serializes Update and Close; guards closed and retiring
	closed bool
	// retiring holds the clients Update dropped whose checks in flight
	// have not all landed; retired waits for their goroutines.
	retiring map[*Client]struct{}
	retired  sync.WaitGroup

	clients atomic.Pointer[map[string]*Client] // never modified once stored
}

// NewPool returns an empty pool whose clients use cfg.
func NewPool(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Pool{cfg: cfg.clone()}
	p.clients.Store(&map[string]*Client{})
	return p, nil
}

// Update makes the pool hold a client for exactly the members given, a map
// from node name to address that should leave out this node: it adds
// clients for new members, replaces the client of a member whose address
// changed, and closes the clients of members that are gone or replaced.
// Such a client takes no more checks (they fail with ErrClosed, unsent, as
// do those waiting to be sent), and closes once its checks in flight are
// answered or fail: a check the member may have decided gets the member's
// answer, rather than an error that would leave its caller to send it
// elsewhere, counting it twice. A member whose client cannot be made is
// left out and its error joined to the one returned. members is not kept.
// After Close, Update returns ErrClosed.
func (p *Pool) Update(members map[string]string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	old := *p.clients.Load()
	next := make(map[string]*Client, len(members))
	var errs []error
	for name, addr := range members {
		if c, ok := old[name]; ok && c.Addr() == addr {
			next[name] = c
			continue
		}
		c, err := NewClient(name, addr, p.cfg)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		next[name] = c
	}
	p.clients.Store(&next)
	for name, c := range old {
		if next[name] != c {
			p.retireLocked(c)
		}
	}
	return errors.Join(errs...)
}

// retireLocked stops c taking checks and closes it, in a goroutine that
// Close waits for, once nothing is in flight on it. p.mu must be held.
func (p *Pool) retireLocked(c *Client) {
	idle := c.stopTaking()
	if p.retiring == nil {
		p.retiring = map[*Client]struct{}{}
	}
	p.retiring[c] = struct{}{}
	p.retired.Add(1)
	go func() {
		defer p.retired.Done()
		select {
		case <-idle:
		case <-c.done: // Close ended them
		}
		c.Close()
		p.mu.Lock()
		delete(p.retiring, c)
		p.mu.Unlock()
	}()
}

// Get returns the client of the member name.
func (p *Pool) Get(name string) (*Client, bool) {
	c, ok := (*p.clients.Load())[name]
	return c, ok
}

// Len returns the number of clients.
func (p *Pool) Len() int { return len(*p.clients.Load()) }

// Stats returns the counters of every client, by member name.
func (p *Pool) Stats() map[string]Stats {
	m := *p.clients.Load()
	out := make(map[string]Stats, len(m))
	for name, c := range m {
		out[name] = c.Stats()
	}
	return out
}

// Close closes every client, those that Update dropped and whose checks
// are still in flight included, and empties the pool. Safe to call more
// than once.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	old := *p.clients.Swap(&map[string]*Client{})
	var errs []error
	for _, c := range old {
		errs = append(errs, c.Close())
	}
	retiring := make([]*Client, 0, len(p.retiring))
	for c := range p.retiring {
		retiring = append(retiring, c)
	}
	p.mu.Unlock()
	for _, c := range retiring {
		c.Close()
	}
	p.retired.Wait()
	return errors.Join(errs...)
}
