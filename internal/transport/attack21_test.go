package transport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/limiter"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// keepingRouter echoes each request, and keeps the slices it is given and
// scribbles over them after answering, as a router breaking the contract
// by holding on to a call's memory would.
type keepingRouter struct {
	mu   sync.Mutex
	kept [][]RoutedRequest
}

func (k *keepingRouter) Route(ctx context.Context, reqs []RoutedRequest) []Result {
	out := make([]Result, len(reqs))
	for i, r := range reqs {
		out[i] = echo(r.Request, "node-k")
	}
	k.mu.Lock()
	k.kept = append(k.kept, reqs)
	for _, old := range k.kept[max(len(k.kept)-4, 0) : len(k.kept)-1] {
		for i := range old {
			old[i].Request.Key, old[i].Request.Limit = "scribbled", 1<<40
		}
	}
	k.mu.Unlock()
	return out
}

// Many callers of the public Check and CheckBatch at once, on requests of
// their own (keys and limits unique to the call), some invalid, some
// refused by the Permit, with a Router that keeps and scribbles over the
// slices of earlier calls: every response answers its own request. Run
// with -race.
func TestAttackPublicCheckSpaceAcrossCallers(t *testing.T) {
	router := &keepingRouter{}
	permit := func(ctx context.Context, r *limiter.Request) error {
		if strings.HasPrefix(r.Key, "deny") {
			return errors.New("denied")
		}
		return nil
	}
	conn := startServer(t, func(s *grpc.Server) { RegisterPublic(s, router, nil, WithPermit(permit)) })
	client := pb.NewSluiceClient(conn)
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for g := range 12 {
		wg.Go(func() {
			for i := range 50 {
				r := limiter.Request{Name: "n", Key: fmt.Sprintf("k%d-%d", g, i), Hits: 1 + int64(i%3), Limit: int64(1000*g + i + 10),
					Period: time.Duration(g+1) * time.Second, Algorithm: limiter.FixedWindow}
				switch i % 6 {
				case 0, 1, 2:
					resp, err := client.Check(ctxT(t), &pb.CheckRequest{Request: RequestToProto(r)})
					if err != nil {
						errs <- err
						continue
					}
					got, want := ResultFromProto(resp.Response), echo(r, "node-k")
					if got.Err != nil || got.Decision.Limit != want.Decision.Limit || got.Decision.Remaining != want.Decision.Remaining || !got.Decision.ResetAt.Equal(want.Decision.ResetAt) {
						errs <- fmt.Errorf("caller %d call %d: %+v, want %+v", g, i, got, want)
					}
				case 3:
					bad := RequestToProto(r)
					bad.Limit = -1
					resp, err := client.Check(ctxT(t), &pb.CheckRequest{Request: bad})
					if err != nil || ResultFromProto(resp.Response).Err == nil {
						errs <- fmt.Errorf("caller %d call %d, invalid: %v %v", g, i, resp, err)
					}
				case 4:
					r.Key = "deny" + r.Key
					_, err := client.Check(ctxT(t), &pb.CheckRequest{Request: RequestToProto(r)})
					if status.Code(err) != codes.PermissionDenied {
						errs <- fmt.Errorf("caller %d call %d, denied: %v", g, i, err)
					}
				case 5:
					r2 := r
					r2.Key, r2.Limit = r.Key+"-b", r.Limit+1
					resp, err := client.CheckBatch(ctxT(t), &pb.BatchCheckRequest{Requests: []*pb.RateLimitRequest{RequestToProto(r), RequestToProto(r2)}})
					if err != nil {
						errs <- err
						continue
					}
					for j, want := range []limiter.Request{r, r2} {
						if got := ResultFromProto(resp.Responses[j]); got.Err != nil || got.Decision.Limit != want.Limit {
							errs <- fmt.Errorf("caller %d call %d, batch item %d: %+v, want limit %d", g, i, j, got, want.Limit)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
