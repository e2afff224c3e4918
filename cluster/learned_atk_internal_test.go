package cluster

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/fakeclock"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/transport"
	"github.com/sluicehq/sluice/limiter"
)

// reportCalls is outboxNode's confirm in miniature: the report a
// confirmation carries is read when the call starts (outboxNode.confirm
// reads standins.cutReport()), and the call blocks until released.
type reportCalls struct {
	report  atomic.Pointer[string]
	mu      sync.Mutex
	sent    []string
	started chan struct{}
	release chan struct{}
}

func (r *reportCalls) transfer(context.Context, string, transport.TransferReason, []limiter.Snapshot) error {
	return nil
}

func (r *reportCalls) confirm(ctx context.Context, to string, fp uint64, wantBack bool) error {
	rep := *r.report.Load() // as cutReport() at the start of HandoffDone
	select {
	case r.started <- struct{}{}:
	default:
	}
	select {
	case <-r.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.mu.Lock()
	r.sent = append(r.sent, rep)
	r.mu.Unlock()
	return nil
}

// A node's cut-off report changes (rebuild: a member reaped, a learned
// hold ended, a naming turned learned) while its confirmation of the same
// membership is in flight, carrying the report read before the change.
// rebuild's outbox.reconfirm finds the confirmation of fp queued (in
// flight) and only adds wantBack; when the call returns, the worker
// clears hasConfirm since q.confirm == fp. Is the new report ever sent?
func TestAtkReconfirmLostWhileConfirmInFlight(t *testing.T) {
	if os.Getenv("SLUICE_ATTACK") != "1" {
		t.Skip("a report change made while a confirmation of the same membership is in flight is lost: reconfirm returns true and the worker clears the confirmation when the call returns (SLUICE_ATTACK=1 runs it)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rc := &reportCalls{started: make(chan struct{}, 1), release: make(chan struct{})}
	old := "names node-1 as seen failed"
	rc.report.Store(&old)
	var h, r, f, g atomic.Int64
	counts := outboxCounts{handedOff: &h, replicated: &r, failures: &f, givenUp: &g}
	o := newOutbox(ctx, rc, counts, fakeclock.New(time.Unix(1000, 0)), outboxGiveUp, func([]limiter.Snapshot) {})
	defer o.close()
	const fp = 42
	o.confirmTo("node-2", fp, false)
	select {
	case <-rc.started:
	case <-time.After(5 * time.Second):
		t.Fatal("no confirmation call")
	}
	// rebuild: store() publishes the new report, then reconfirm.
	now := "names nobody (node-1 reaped here)"
	rc.report.Store(&now)
	queued := o.reconfirm("node-2", fp, false)
	close(rc.release)
	err := testwait.Until(3*time.Second, func() error {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if len(rc.sent) > 0 && rc.sent[len(rc.sent)-1] == now {
			return nil
		}
		return errString("sent " + join(rc.sent))
	})
	if err != nil {
		t.Errorf("LOST UPDATE: reconfirm returned %v, but node-2 got only the report read before the change: %v", queued, err)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func join(s []string) string {
	out := "["
	for i, x := range s {
		if i > 0 {
			out += "; "
		}
		out += x
	}
	return out + "]"
}
