package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// The legitimate client checks its own key, one check at a time, with a
// pause between checks, until stopped or legitMaxChecks.
const (
	legitPause     = 50 * time.Millisecond
	legitMaxChecks = 100_000
)

// legitStats is the legitimate client's record.
type legitStats struct {
	total, answered, allowed int
	worst                    time.Duration // of every check, answered or not
	missed                   tally         // why checks went unanswered
}

func (l *legitStats) String() string {
	s := fmt.Sprintf("%d/%d, worst %s", l.answered, l.total, ms(l.worst))
	if l.answered < l.total {
		s += " (unanswered: " + l.missed.String() + ")"
	}
	return s
}

// checkFunc makes one legitimate check. It returns whether the check was
// allowed, or an error whose text classifies why no decision came back.
type checkFunc func(ctx context.Context) (allowed bool, err error)

// legit is a running legitimate client.
type legit struct {
	stopCh chan struct{}
	done   chan struct{}
	stats  legitStats // written by the loop until done is closed
	once   sync.Once
}

// startLegit starts checking with check, each check with deadline.
func startLegit(check checkFunc, deadline time.Duration) *legit {
	l := &legit{stopCh: make(chan struct{}), done: make(chan struct{})}
	go l.loop(check, deadline)
	return l
}

func (l *legit) loop(check checkFunc, deadline time.Duration) {
	defer close(l.done)
	pause := time.NewTimer(0)
	defer pause.Stop()
	for range legitMaxChecks {
		select {
		case <-l.stopCh:
			return
		case <-pause.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		began := time.Now()
		allowed, err := check(ctx)
		took := time.Since(began)
		cancel()
		s := &l.stats
		s.total++
		s.worst = max(s.worst, took)
		switch {
		case err != nil:
			s.missed.add(err.Error(), 1)
		case took > deadline:
			s.missed.add("answered after the deadline", 1)
		default:
			s.answered++
			if allowed {
				s.allowed++
			}
		}
		pause.Reset(legitPause)
	}
}

// stop stops the client and returns its record.
func (l *legit) stop() *legitStats {
	l.once.Do(func() { close(l.stopCh) })
	<-l.done
	return &l.stats
}

// legitRequest is the legitimate client's check of key: GCRA, 1000 per
// second, far more than it sends.
func legitRequest(key string) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Name: "legit", Key: key, Limit: 1000, PeriodNanos: int64(time.Second), Algorithm: pb.Algorithm_ALGORITHM_GCRA}
}

// grpcCheck checks req on the public gRPC API through conn.
func grpcCheck(conn *grpc.ClientConn, req *pb.RateLimitRequest) checkFunc {
	return ownerCheck(conn, req, "")
}

// ownerCheck checks req on the public gRPC API through conn, and counts a
// decision not made by owner, when owner is set, as no answer.
func ownerCheck(conn *grpc.ClientConn, req *pb.RateLimitRequest, owner string) checkFunc {
	client := pb.NewSluiceClient(conn)
	return func(ctx context.Context) (bool, error) {
		res, err := client.Check(ctx, &pb.CheckRequest{Request: req})
		if err != nil {
			return false, errors.New(status.Code(err).String())
		}
		r := res.GetResponse()
		switch {
		case r.GetErrorCode() != pb.ErrorCode_ERROR_CODE_NONE:
			return false, errors.New(r.GetErrorCode().String())
		case owner != "" && r.GetWithoutOwner():
			return false, errors.New("decided without its owner")
		case owner != "" && r.GetOwner() != owner:
			return false, errors.New("decided by another node than its owner")
		}
		return r.GetAllowed(), nil
	}
}

// httpCheck checks req on the HTTP API at addr, on a new connection each
// time: a client that cannot connect is not answered either.
func httpCheck(addr string, req *pb.RateLimitRequest) checkFunc {
	body := checkJSON(req)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	return func(ctx context.Context) (bool, error) {
		hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/check", bytes.NewReader(body))
		if err != nil {
			return false, err
		}
		res, err := client.Do(hr)
		switch {
		case ctx.Err() != nil:
			return false, errors.New("DeadlineExceeded")
		case err != nil:
			return false, errors.New("connection failed")
		}
		defer res.Body.Close()
		var d struct {
			Allowed bool `json:"allowed"`
		}
		err = json.NewDecoder(io.LimitReader(res.Body, 1<<16)).Decode(&d)
		switch {
		case res.StatusCode != http.StatusOK:
			return false, fmt.Errorf("HTTP %d", res.StatusCode)
		case ctx.Err() != nil:
			return false, errors.New("DeadlineExceeded")
		case err != nil:
			return false, errors.New("malformed response")
		}
		return d.Allowed, nil
	}
}

// checkJSON is req as the HTTP API's JSON body.
func checkJSON(req *pb.RateLimitRequest) []byte {
	m := map[string]any{
		"name": req.Name, "key": req.Key, "limit": req.Limit,
		"period":    time.Duration(req.PeriodNanos).String(),
		"algorithm": strings.ToLower(strings.TrimPrefix(req.Algorithm.String(), "ALGORITHM_")),
	}
	if req.Hits != nil {
		m["hits"] = *req.Hits
	}
	if req.Reset_ {
		m["reset"] = true
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // strings and numbers
	}
	return b
}
