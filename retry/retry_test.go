package retry

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// highest always draws the largest value, lowest the smallest.
type highest struct{}

func (highest) Int64N(n int64) int64 { return n - 1 }

type lowest struct{}

func (lowest) Int64N(int64) int64 { return 0 }

var errBusy = errors.New("busy")

// attempt is what the Func returns on one call.
type attempt struct {
	retryAfter time.Duration
	err        error
}

// runDo runs Do with fn returning steps in order (success past the end), a
// sleep that records its waits and returns at once, and the clock at t0. It
// returns Do's error, the number of calls and the waits.
func runDo(t *testing.T, ctx context.Context, p Policy, r Rand, steps []attempt) (error, int, []time.Duration) {
	t.Helper()
	var calls int
	var waits []time.Duration
	fn := func(context.Context) (time.Duration, error) {
		calls++
		if calls > len(steps) {
			return 0, nil
		}
		s := steps[calls-1]
		return s.retryAfter, s.err
	}
	sleep := func(_ context.Context, d time.Duration) error {
		waits = append(waits, d)
		return nil
	}
	err := Do(ctx, p, fn, WithRand(r), WithSleep(sleep), WithClock(func() time.Time { return t0 }))
	return err, calls, waits
}

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func fails(n int) []attempt {
	out := make([]attempt, n)
	for i := range out {
		out[i].err = errBusy
	}
	return out
}

func TestDelaySequence(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Max: time.Second, MaxAttempts: 7, Multiplier: 2}
	ms := time.Millisecond
	tests := []struct {
		name string
		p    Policy
		r    Rand
		want []time.Duration
	}{
		{"highest draws reach the caps", p, highest{}, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second}},
		{"lowest draws are zero", p, lowest{}, []time.Duration{0, 0, 0, 0, 0, 0}},
		{"multiplier 1 is constant", Policy{Base: 50 * ms, Max: time.Second, MaxAttempts: 4, Multiplier: 1}, highest{}, []time.Duration{50 * ms, 50 * ms, 50 * ms}},
		{"multiplier 3", Policy{Base: 10 * ms, Max: time.Second, MaxAttempts: 6, Multiplier: 3}, highest{}, []time.Duration{10 * ms, 30 * ms, 90 * ms, 270 * ms, 810 * ms}},
		{"max equals base", Policy{Base: 10 * ms, Max: 10 * ms, MaxAttempts: 3, Multiplier: 10}, highest{}, []time.Duration{10 * ms, 10 * ms}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err, calls, waits := runDo(t, context.Background(), tt.p, tt.r, fails(100))
			if !errors.Is(err, ErrExhausted) || !errors.Is(err, errBusy) {
				t.Fatalf("err = %v, want ErrExhausted wrapping errBusy", err)
			}
			if calls != tt.p.MaxAttempts {
				t.Errorf("calls = %d, want %d", calls, tt.p.MaxAttempts)
			}
			if !slices.Equal(waits, tt.want) {
				t.Errorf("waits = %v, want %v", waits, tt.want)
			}
		})
	}
}

func TestJitterStaysInBounds(t *testing.T) {
	p := Policy{Base: time.Millisecond, Max: 300 * time.Millisecond, MaxAttempts: 12, Multiplier: 2}
	r := rand.New(rand.NewPCG(1, 2))
	seen := make(map[time.Duration]bool)
	for range 200 {
		_, _, waits := runDo(t, context.Background(), p, r, fails(100))
		for i, w := range waits {
			if c := p.Cap(i + 1); w < 0 || w > c {
				t.Fatalf("wait %d = %v, outside [0, %v]", i+1, w, c)
			}
			seen[w] = true
		}
	}
	if len(seen) < 100 {
		t.Errorf("only %d distinct waits in 2200: the jitter is not random", len(seen))
	}
}

func TestCapDoesNotOverflow(t *testing.T) {
	p := Policy{Base: time.Hour, Max: time.Duration(math.MaxInt64), Multiplier: 1e6}
	for _, n := range []int{-1, 0, 1, 2, 10, 1000, math.MaxInt32} {
		c := p.Cap(n)
		if c < p.Base || c > p.Max {
			t.Errorf("Cap(%d) = %v, outside [Base, Max]", n, c)
		}
		if b := p.Backoff(n, highest{}); b < 0 || b > c {
			t.Errorf("Backoff(%d) = %v, outside [0, %v]", n, b, c)
		}
	}
}

func TestRetryAfterPrecedence(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Max: time.Second, MaxAttempts: 5, Multiplier: 2}
	tests := []struct {
		name  string
		r     Rand
		steps []attempt
		want  []time.Duration
	}{
		{"longer than the backoff wins", highest{}, []attempt{{3 * time.Second, errBusy}, {150 * time.Millisecond, errBusy}},
			[]time.Duration{3 * time.Second, 200 * time.Millisecond}},
		{"shorter than the jitter: the jitter", highest{}, []attempt{{time.Millisecond, errBusy}},
			[]time.Duration{100 * time.Millisecond}},
		{"a zero draw still waits Retry-After", lowest{}, []attempt{{time.Millisecond, errBusy}, {0, errBusy}, {40 * time.Second, errBusy}},
			[]time.Duration{time.Millisecond, 0, 40 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err, calls, waits := runDo(t, context.Background(), p, tt.r, tt.steps)
			if err != nil {
				t.Fatalf("Do = %v, want success after the steps", err)
			}
			if calls != len(tt.steps)+1 {
				t.Errorf("calls = %d, want %d", calls, len(tt.steps)+1)
			}
			if !slices.Equal(waits, tt.want) {
				t.Errorf("waits = %v, want %v", waits, tt.want)
			}
		})
	}
}

func TestStops(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Max: time.Second, MaxAttempts: 3, Multiplier: 2}
	errFatal := errors.New("fatal")
	tests := []struct {
		name      string
		p         Policy
		steps     []attempt
		wantErrs  []error
		wantCalls int
	}{
		{"success at once", p, nil, nil, 1},
		{"success on the last attempt", p, fails(2), nil, 3},
		{"max attempts", p, fails(3), []error{ErrExhausted, errBusy}, 3},
		{"one attempt", Policy{Base: 1, Max: 1, MaxAttempts: 1, Multiplier: 1}, fails(3), []error{ErrExhausted, errBusy}, 1},
		{"unbounded attempts", Policy{Base: 1, Max: 1, Multiplier: 1}, fails(50), nil, 51},
		{"permanent", p, []attempt{{0, errBusy}, {0, Permanent(errFatal)}}, []error{errFatal}, 2},
		{"retry-after past the deadline", p, []attempt{{time.Minute, errBusy}}, []error{ErrDeadline, errBusy}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithDeadline(context.Background(), t0.Add(10*time.Second))
			defer cancel()
			err, calls, _ := runDo(t, ctx, tt.p, highest{}, tt.steps)
			if len(tt.wantErrs) == 0 && err != nil {
				t.Fatalf("Do = %v, want nil", err)
			}
			for _, want := range tt.wantErrs {
				if !errors.Is(err, want) {
					t.Errorf("Do = %v, want it to wrap %v", err, want)
				}
			}
			if calls != tt.wantCalls {
				t.Errorf("calls = %d, want %d", calls, tt.wantCalls)
			}
		})
	}
}

func TestPermanentIsUnwrapped(t *testing.T) {
	errFatal := errors.New("fatal")
	err, _, _ := runDo(t, context.Background(), DefaultPolicy(), highest{}, []attempt{{0, Permanent(errFatal)}})
	if err != errFatal {
		t.Fatalf("Do = %#v, want errFatal itself", err)
	}
	if Permanent(nil) != nil {
		t.Fatal("Permanent(nil) != nil")
	}
}

func TestCancel(t *testing.T) {
	t.Run("during a wait", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		calls := 0
		fn := func(context.Context) (time.Duration, error) { calls++; return 0, errBusy }
		sleep := func(ctx context.Context, d time.Duration) error {
			cancel() // the caller gives up while Do waits
			<-ctx.Done()
			return ctx.Err()
		}
		err := Do(ctx, DefaultPolicy(), fn, WithSleep(sleep))
		if !errors.Is(err, context.Canceled) || !errors.Is(err, errBusy) {
			t.Fatalf("Do = %v, want context.Canceled wrapping errBusy", err)
		}
		if calls != 1 {
			t.Errorf("calls = %d, want 1", calls)
		}
	})
	t.Run("during a call", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		fn := func(ctx context.Context) (time.Duration, error) { cancel(); return 0, ctx.Err() }
		err := Do(ctx, DefaultPolicy(), fn, WithSleep(func(context.Context, time.Duration) error {
			t.Error("Do waited after the context ended")
			return nil
		}))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v, want context.Canceled", err)
		}
	})
	t.Run("before the first call", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := Do(ctx, DefaultPolicy(), func(context.Context) (time.Duration, error) {
			t.Error("fn called with an ended context")
			return 0, nil
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do = %v, want context.Canceled", err)
		}
	})
	t.Run("the real timer", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		fn := func(context.Context) (time.Duration, error) {
			calls++
			if calls == 1 {
				cancel()
			}
			return time.Hour, errBusy // the ended context stops the hour-long wait
		}
		err := Do(ctx, Policy{Base: time.Hour, Max: time.Hour, Multiplier: 1}, fn)
		if !errors.Is(err, context.Canceled) || calls != 1 {
			t.Fatalf("Do = %v after %d calls, want context.Canceled after 1", err, calls)
		}
	})
}

func TestInvalidPolicy(t *testing.T) {
	for _, p := range []Policy{
		{Base: 0, Max: 1, Multiplier: 1},
		{Base: 2, Max: 1, Multiplier: 1},
		{Base: 1, Max: 1, Multiplier: 0.5},
		{Base: 1, Max: 1, Multiplier: math.NaN()},
		{Base: 1, Max: 1, Multiplier: math.Inf(1)},
		{Base: 1, Max: 1, Multiplier: 1, MaxAttempts: -1},
	} {
		err := Do(context.Background(), p, func(context.Context) (time.Duration, error) {
			t.Errorf("%+v: fn called", p)
			return 0, nil
		})
		if !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("%+v: Do = %v, want ErrInvalidPolicy", p, err)
		}
	}
	if err := DefaultPolicy().Validate(); err != nil {
		t.Errorf("DefaultPolicy: %v", err)
	}
}

func TestParseRetryAfter(t *testing.T) {
	tests := []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"0", 0, true},
		{"120", 2 * time.Minute, true},
		{" 7 ", 7 * time.Second, true},
		{"99999999999999999999999", time.Duration(math.MaxInt64), true},
		{t0.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{t0.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"Wednesday, 02-Jan-30 03:05:05 GMT", time.Minute, true}, // RFC 850
		{"", 0, false},
		{"-5", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
	}
	for _, tt := range tests {
		got, ok := ParseRetryAfter(tt.in, t0)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestHTTPRetryAfter(t *testing.T) {
	resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{}}
	if _, ok := HTTPRetryAfter(resp, t0); ok {
		t.Error("no header: ok")
	}
	resp.Header.Set("Retry-After", "3")
	if d, ok := HTTPRetryAfter(resp, t0); d != 3*time.Second || !ok {
		t.Errorf("got %v, %v; want 3s", d, ok)
	}
	if _, ok := HTTPRetryAfter(nil, t0); ok {
		t.Error("nil response: ok")
	}
}

func TestGRPCRetryAfter(t *testing.T) {
	withInfo := func(d time.Duration) error {
		st, err := status.New(codes.ResourceExhausted, "slow down").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	other, err := status.New(codes.Unavailable, "x").WithDetails(&errdetails.ErrorInfo{Reason: "r"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		err    error
		want   time.Duration
		wantOK bool
	}{
		{"retry info", withInfo(1500 * time.Millisecond), 1500 * time.Millisecond, true},
		{"wrapped", errors.Join(errors.New("call failed"), withInfo(time.Second)), time.Second, true},
		{"negative delay", withInfo(-time.Second), 0, true},
		{"other details", other.Err(), 0, false},
		{"no details", status.Error(codes.ResourceExhausted, "x"), 0, false},
		{"not a status", errBusy, 0, false},
		{"nil", nil, 0, false},
	}
	for _, tt := range tests {
		got, ok := GRPCRetryAfter(tt.err)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("%s: got %v, %v; want %v, %v", tt.name, got, ok, tt.want, tt.wantOK)
		}
	}
}
