package daemon

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/transport"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// stallGRPC opens a connection to addr with calls CheckBatch calls, each
// sending 60,000 bytes (within its stream window) of a message of
// transport.MaxMessageSize and
// nothing more, and returns it; it discards what the daemon sends.
func stallGRPC(t *testing.T, addr string, calls int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go io.Copy(io.Discard, c)
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/sluice.v1.Sluice/CheckBatch"},
		{":authority", "sluice"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	var out bytes.Buffer
	out.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&out, nil)
	fr.WriteSettings()
	body := append(binary.BigEndian.AppendUint32([]byte{0}, uint32(transport.MaxMessageSize)), make([]byte, 60_000)...)
	for i := range calls {
		id := uint32(2*i + 1)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true})
		for rest := body; len(rest) > 0; rest = rest[min(len(rest), 16384):] {
			fr.WriteData(id, false, rest[:min(len(rest), 16384)])
		}
	}
	if _, err := c.Write(out.Bytes()); err != nil {
		t.Fatal(err)
	}
	return c
}

// The daemon's gRPC port holds unfinished messages within
// grpc_message_bytes: every call holds its stream window, and a whole
// message once its handler begins while the connection is within half the
// budget, or within its share (one call) past half; its further calls
// wait for room. A legitimate client's checks meanwhile succeed; the
// budget in use shows in /metrics; a connection closed gives back what
// its calls held.
func TestGRPCUnfinishedMessagesWithinTheBudget(t *testing.T) {
	const r = transport.MessageReservation
	cfg := testConfig("grpc-budget")
	cfg.GRPCMessageBytes = MinGRPCMessageBytes // 12 calls; a connection's share is one
	cfg.GRPCMessageTimeout = time.Minute
	d := start(t, cfg)
	base := "http://" + d.HTTPAddr()
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rpc := pb.NewSluiceClient(conn)
	check := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req := &pb.RateLimitRequest{Name: "legit", Key: "k", Limit: 1000, PeriodNanos: int64(time.Minute), Algorithm: pb.Algorithm_ALGORITHM_GCRA}
		if _, err := rpc.Check(ctx, &pb.CheckRequest{Request: req}); err != nil {
			t.Fatalf("a legitimate check: %v", err)
		}
	}
	check()

	const calls, w = 40, transport.StreamWindow
	attacker := stallGRPC(t, d.GRPCAddr(), calls)
	// Every call of the attacker holds its window and a whole message,
	// waits for room holding its window, or was refused (past half the
	// budget, beyond its share): which, depends on the order its calls
	// reach their handlers. It holds at most half the budget and its
	// share.
	var held float64
	testwait.For(t, "every call of the attacker to hold a message, wait or be refused", func() bool {
		m := scrape(t, base)
		held = m["sluice_grpc_message_bytes_reserved"]
		waiting, refused := m["sluice_grpc_message_budget_waiting"], m["sluice_grpc_message_budget_refused_total"]
		messages := held - (calls-refused)*w
		full := messages / (r - w)
		return messages >= 0 && full == float64(int64(full)) && full+waiting+refused == calls
	})
	if limit := float64(MinGRPCMessageBytes/2 + r); held > limit {
		t.Fatalf("the attacker holds %v bytes, more than half the budget and its share (%v)", held, limit)
	}
	check()
	check()
	if m := scrape(t, base); m["sluice_grpc_message_bytes_reserved"] != held {
		t.Errorf("%v bytes reserved after the legitimate checks, want the attacker's %v", m["sluice_grpc_message_bytes_reserved"], held)
	}
	attacker.Close()
	testwait.For(t, "the closed connection's calls to give their reservations back", func() bool {
		m := scrape(t, base)
		return m["sluice_grpc_message_bytes_reserved"] == 0
	})
	check()
}
