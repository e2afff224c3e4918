package httplimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/rules"
)

// QuotaExceeded is the problem type of a 429 response: the "quota
// exceeded" type of draft-ietf-httpapi-ratelimit-headers.
const QuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// problem is an RFC 9457 problem details object.
type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	RetryAfter       int64    `json:"retry_after,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// writeProblem answers status with a problem+json body: a quota-exceeded
// problem described by f when f is set, else about:blank with detail.
func writeProblem(w http.ResponseWriter, status int, f *rules.Fields, detail string) {
	p := problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail}
	if f != nil {
		p.Type = QuotaExceeded
		p.Title = "Rate limit exceeded"
		p.RetryAfter = f.RetryAfter
		p.ViolatedPolicies = f.Violated
		p.Detail = fmt.Sprintf("Too many requests for %s; retry in %d s.", quoted(f.Violated), f.RetryAfter)
	}
	body, _ := json.Marshal(p) // cannot fail: strings and numbers only
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

func quoted(names []string) string {
	switch len(names) {
	case 0:
		return "this client"
	case 1:
		return "limit " + strconv.Quote(names[0])
	}
	s := "limits "
	for i, n := range names {
		if i > 0 {
			s += ", "
		}
		s += strconv.Quote(n)
	}
	return s
}
