package daemon

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of one check, the label of sluice_http_check_items_total.
const (
	resultAllowed = "allowed"
	resultLimited = "limited"
	resultInvalid = "invalid" // rejected before deciding: the request's fault
	resultFailed  = "failed"  // the node could not decide
)

// httpMetrics are the HTTP API's metrics, registered on the daemon's
// registry.
type httpMetrics struct {
	inFlight prometheus.Gauge
	requests *prometheus.CounterVec   // endpoint, code
	duration *prometheus.HistogramVec // endpoint
	items    *prometheus.CounterVec   // result
	// allowed and limited are items' series of those results.
	allowed, limited prometheus.Counter
	// served keeps the series of requests and duration of each endpoint
	// and status code served, so that a request looks neither up by its
	// labels. Both come from the server's routes and handlers, and are
	// few; past maxServedSeries they are looked up each time.
	served      sync.Map // servedKey -> *servedSeries
	servedCount atomic.Int64
}

// maxServedSeries bounds httpMetrics.served.
const maxServedSeries = 256

type servedKey struct {
	endpoint string
	code     int
}

type servedSeries struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

// seriesOf returns the series of requests to endpoint answered code.
func (m *httpMetrics) seriesOf(endpoint string, code int) *servedSeries {
	k := servedKey{endpoint, code}
	if s, ok := m.served.Load(k); ok {
		return s.(*servedSeries)
	}
	s := &servedSeries{
		requests: m.requests.WithLabelValues(endpoint, strconv.Itoa(code)),
		duration: m.duration.WithLabelValues(endpoint),
	}
	if m.servedCount.Load() < maxServedSeries {
		if _, loaded := m.served.LoadOrStore(k, s); !loaded {
			m.servedCount.Add(1)
		}
	}
	return s
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_http_requests_in_flight",
			Help: "HTTP requests being served.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_http_requests_total",
			Help: "HTTP requests served, by endpoint and status code.",
		}, []string{"endpoint", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_http_request_duration_seconds",
			Help:    "Time to serve an HTTP request, by endpoint.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"endpoint"}),
		items: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_http_check_items_total",
			Help: "Checks received over HTTP (a batch counts each item), by result: allowed, limited, invalid (the request's fault) or failed (the node's).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.inFlight, m.requests, m.duration, m.items)
	for _, r := range []string{resultAllowed, resultLimited, resultInvalid, resultFailed} {
		m.items.WithLabelValues(r) // export zeros, so that rates work from the start
	}
	m.allowed, m.limited = m.items.WithLabelValues(resultAllowed), m.items.WithLabelValues(resultLimited)
	return m
}

func (m *httpMetrics) countDecision(allowed bool) {
	if allowed {
		m.allowed.Inc()
	} else {
		m.limited.Inc()
	}
}

func resultFor(e *itemError) string {
	switch e.Code {
	case "unavailable", "internal", "deadline_exceeded", "canceled":
		return resultFailed
	}
	return resultInvalid
}

// instrument counts and times every request to mux by its route ("other"
// for requests no route matched, so that the label values are bounded) and
// logs it at debug level.
func (m *httpMetrics) instrument(mux *http.ServeMux, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		m.inFlight.Inc()
		defer m.inFlight.Dec()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		mux.ServeHTTP(sw, r)
		endpoint := "other"
		if _, path, ok := strings.Cut(r.Pattern, " "); ok {
			endpoint = path
		}
		elapsed := time.Since(start)
		s := m.seriesOf(endpoint, sw.status)
		s.requests.Inc()
		s.duration.Observe(elapsed.Seconds())
		// Checked first: the arguments alone take five allocations.
		if logger.Enabled(r.Context(), slog.LevelDebug) {
			logger.Debug("http request", "method", r.Method, "path", r.URL.Path, "status", sw.status, "duration", elapsed, "remote", r.RemoteAddr)
		}
	})
}

// statusWriter records the status code written.
type statusWriter struct {
	http.ResponseWriter
	status  int
	written bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.written {
		w.status, w.written = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.written = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
