package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// freeBodyBytes is what every request body may take outside the budget:
// a check's body fits, so that checks go on while large bodies fill the
// budget. The connection cap bounds what these take together.
const freeBodyBytes = 4 << 10

// bodyBudget bounds the bytes of HTTP request bodies held at once, across
// all requests (Config.HTTPBodyBudget). Safe for concurrent use.
type bodyBudget struct {
	max  int64
	used atomic.Int64 // bytes taken and not given back
}

func newBodyBudget(max int64, reg prometheus.Registerer) *bodyBudget {
	b := &bodyBudget{max: max}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_http_body_bytes_reserved",
		Help: "Bytes of HTTP request bodies held beyond the first 4 KiB of each (http_body_bytes bounds them).",
	}, func() float64 { return float64(b.used.Load()) }))
	return b
}

// take reserves n bytes, or reports that there is no room.
func (b *bodyBudget) take(n int64) bool {
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *bodyBudget) give(n int64) { b.used.Add(-n) }

// readBody reads the request body, of at most Config.MaxBodyBytes, within
// Config.HTTPBodyTimeout, holding what it reads beyond freeBodyBytes in
// the body budget. On failure it has written the problem response: 413,
// 408, 503 when the budget has no room, 400 for an empty body. The caller
// calls release once done with the body.
func (d *Daemon) readBody(w http.ResponseWriter, r *http.Request) (body []byte, release func(), ok bool) {
	var held int64
	release = func() {
		d.bodies.give(held)
		held = 0
	}
	body, status, problem := d.readHeld(w, r, &held)
	if status == 0 && len(bytes.TrimSpace(body)) == 0 {
		status, problem = http.StatusBadRequest, "the body is empty: want a JSON object"
	}
	if status != 0 {
		release()
		// The rest of the body is not waited for: the connection closes
		// once the answer is out.
		w.Header().Set("Connection", "close")
		if status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		writeProblem(w, status, problem, nil)
		return nil, release, false
	}
	return body, release, true
}

// readHeld reads the body into a buffer whose bytes beyond freeBodyBytes
// it takes from the body budget, adding them to *held; or returns the
// status and the problem of a failure.
func (d *Daemon) readHeld(w http.ResponseWriter, r *http.Request, held *int64) ([]byte, int, string) {
	// A connection that takes no deadline keeps the server's ReadTimeout.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d.cfg.HTTPBodyTimeout))
	if r.ContentLength > d.cfg.MaxBodyBytes {
		return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is more than %d bytes (max_body_bytes)", d.cfg.MaxBodyBytes)
	}
	in := http.MaxBytesReader(w, r.Body, d.cfg.MaxBodyBytes)
	// The buffer grows as the body comes, doubling, so that what it takes
	// from the budget is at most twice what has arrived: a declared length
	// that does not come holds nothing. It never grows past the declared
	// length (and a byte to read the end).
	limit := d.cfg.MaxBodyBytes + 1
	if r.ContentLength > 0 {
		limit = r.ContentLength + 1
	}
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			size := min(int64(freeBodyBytes), limit)
			if cap(buf) > 0 {
				size = min(2*int64(cap(buf)), limit)
			}
			if more := max(size-freeBodyBytes, 0) - *held; more > 0 {
				if !d.bodies.take(more) {
					return nil, http.StatusServiceUnavailable, fmt.Sprintf(
						"the server holds as many request body bytes as it may (http_body_bytes, %d bytes): retry", d.bodies.max)
				}
				*held += more
			}
			grown := make([]byte, len(buf), size)
			copy(grown, buf)
			buf = grown
		}
		n, err := in.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) {
			return buf, 0, ""
		}
		switch tooLarge := maxBytesError(err); {
		case tooLarge != nil:
			return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is more than %d bytes (max_body_bytes)", tooLarge.Limit)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, http.StatusRequestTimeout, fmt.Sprintf("the body did not arrive whole within %v (http_body_timeout)", d.cfg.HTTPBodyTimeout)
		default:
			return nil, http.StatusBadRequest, "reading the body: " + err.Error()
		}
	}
}

// maxBytesError returns the *http.MaxBytesError err wraps, or nil: in a
// function of its own, so that its target goes on the heap only when a
// read fails.
func maxBytesError(err error) *http.MaxBytesError {
	var e *http.MaxBytesError
	if errors.As(err, &e) {
		return e
	}
	return nil
}
