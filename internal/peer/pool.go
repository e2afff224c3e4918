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

	mu     sync.Mutex // serializes Update and Close; guards closed
	closed bool

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
// changed, and closes the clients of members that are gone (their waiting
// checks fail with ErrClosed). A member whose client cannot be made is left
// out and its error joined to the one returned. members is not kept.
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
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
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

// Close closes every client and empties the pool. Safe to call more than
// once.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	old := *p.clients.Swap(&map[string]*Client{})
	var errs []error
	for _, c := range old {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
