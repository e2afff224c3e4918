package limiter

import (
	"testing"
	"time"
)

// View reads each algorithm's words by name, after 3 hits at t0 of a
// limit of 10 per 10s.
func TestSnapshotView(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0) // a multiple of 10s
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for _, tt := range []struct {
		algo Algorithm
		want StateView
	}{
		{TokenBucket, StateView{ExpireAt: at(3 * time.Second), Level: 3, LevelAt: t0}},
		{LeakyBucket, StateView{ExpireAt: at(3 * time.Second), Level: 3, LevelAt: t0}},
		{FixedWindow, StateView{ExpireAt: at(10 * time.Second), WindowStart: t0, WindowHits: 3}},
		{SlidingWindowCounter, StateView{ExpireAt: at(20 * time.Second), WindowStart: t0, WindowHits: 3}},
		{GCRA, StateView{ExpireAt: at(3 * time.Second), TAT: at(3 * time.Second), Interval: time.Second}},
		{SlidingWindowLog, StateView{ExpireAt: at(10 * time.Second), LogEntries: 1, LogHits: 3}},
	} {
		t.Run(tt.algo.String(), func(t *testing.T) {
			s := newTestStore(t)
			req := Request{Name: "api", Key: "k", Hits: 3, Limit: 10, Period: 10 * time.Second, Algorithm: tt.algo}
			if _, err := s.CheckAt(req, t0); err != nil {
				t.Fatal(err)
			}
			sn := snapOf(t, s, req, t0)
			got := sn.View()
			tt.want.Algorithm = tt.algo
			if !got.ExpireAt.Equal(tt.want.ExpireAt) || !got.LevelAt.Equal(tt.want.LevelAt) ||
				!got.WindowStart.Equal(tt.want.WindowStart) || !got.TAT.Equal(tt.want.TAT) {
				t.Errorf("times: got %+v, want %+v", got, tt.want)
			}
			got.ExpireAt, got.LevelAt, got.WindowStart, got.TAT = tt.want.ExpireAt, tt.want.LevelAt, tt.want.WindowStart, tt.want.TAT
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// Forget drops a key, live or not, and only that key: the next decision
// on it starts fresh, and what the store counts goes down.
func TestStoreForget(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	s, err := NewStore(StoreConfig{Shards: 4, TrackChanges: true})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Name: "api", Key: "k", Hits: 5, Limit: 5, Period: time.Minute, Algorithm: SlidingWindowLog}
	other := req
	other.Key = "other"
	for _, r := range []Request{req, other} {
		if _, err := s.CheckAt(r, t0); err != nil {
			t.Fatal(err)
		}
	}
	before := s.Bytes()
	if !s.Forget("api", "k") {
		t.Fatal("Forget of a held key reported none")
	}
	if s.Forget("api", "k") || s.Forget("", "k") {
		t.Error("Forget of a key not held reported one")
	}
	if _, ok := s.Snapshot("api", "k", t0); ok {
		t.Error("the forgotten key still has a snapshot")
	}
	if _, ok := s.Snapshot("api", "other", t0); !ok {
		t.Error("Forget dropped another key")
	}
	if st := s.Stats(); st.Entries != 1 || s.Bytes() >= before {
		t.Errorf("after Forget: %d entries and %d bytes (%d before)", st.Entries, s.Bytes(), before)
	}
	// Changed skips the forgotten key, which it had listed.
	n := s.Changed(t0, func(sn Snapshot) {
		if sn.Key == "k" {
			t.Errorf("Changed reported the forgotten key: %+v", sn)
		}
	})
	if n != 1 {
		t.Errorf("Changed reported %d keys, want 1", n)
	}
	d, err := s.CheckAt(req, t0)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Errorf("the first check after Forget: %+v, %v; want the whole limit admitted", d, err)
	}
}

// ResetRequest resets a key of every algorithm: no live state is left,
// and the next request is decided as on a fresh key.
func TestResetRequest(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, a := range Algorithms {
		s := newTestStore(t)
		req := Request{Name: "api", Key: "k", Hits: 10, Limit: 10, Period: time.Minute, Algorithm: a}
		if _, err := s.CheckAt(req, t0); err != nil {
			t.Fatal(err)
		}
		d, err := s.CheckAt(ResetRequest("api", "k"), t0.Add(time.Second))
		if err != nil || !d.Allowed {
			t.Fatalf("%s: reset: %+v, %v", a, d, err)
		}
		if sn, ok := s.Snapshot("api", "k", t0.Add(time.Second)); ok {
			t.Errorf("%s: live state after the reset: %+v", a, sn)
		}
		if d, err := s.CheckAt(req, t0.Add(time.Second)); err != nil || !d.Allowed {
			t.Errorf("%s: the limit after the reset: %+v, %v", a, d, err)
		}
	}
}
